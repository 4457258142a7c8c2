// Sources: the limit auditd has learned for each source against the
// ceiling an operator configured, what taught it, and where its breaker
// and pause stand now.
import { getJSON, enc } from './api.js';
import {
  h, fill, fmtNum, fmtDuration, fmtRate, fmtRelative, fmtTime, timeEl, badge, table, dl, problemBox, seconds, query, routeWith, pageUnit, perSecondOf,
} from './dom.js';
import { listOf } from './runs.js';
import { ChartSet, timelineChart, limitChart, bucketWords, pace } from './charts.js';
import { fleetSection } from './fleet.js';

// splitSource takes a SourceState (openapi.yaml): the configured source's
// fields, what was learned, the breaker now (breaker_state; "breaker" is
// the configured policy) and the pause deadline.
export function splitSource(x) {
  return { cfg: x, learned: x.learned || {}, br: x.breaker_state || {}, paused: x.paused_until || '' };
}

function zero(t) { return !t || String(t).startsWith('0001-01-01'); }


function pausedCell(paused) {
  if (zero(paused) || new Date(paused).getTime() <= Date.now()) return h('span', { class: 'muted' }, 'not paused');
  return h('span', { class: 'warn-text' }, 'until ', timeEl(paused), ' ', h('span', { class: 'muted' }, `(${fmtRelative(paused)})`));
}

function breakerCell(br) {
  const st = br.state || 'closed';
  return h('span', null, badge(st), br.failures ? h('span', { class: 'muted' }, ` ${br.failures} failure${br.failures === 1 ? '' : 's'}`) : null,
    !zero(br.until) ? h('div', { class: 'small muted' }, 'cooldown ends ', timeEl(br.until)) : null);
}

// learnedVsCeiling says whether the learned limit is under the configured
// ceiling. That is how learning works (an unknown source starts low and
// grows until it is refused), so it is shown as a plain note, not a warning.
function learnedVsCeiling(learned, cfg) {
  // The learned limit is what is in force; the configured limit is the most
  // auditd will ever send whatever it learns.
  // Compared as rates, since the two windows need not be the same.
  if (!cfg.limit || !learned.limit) return { below: false };
  const lw = seconds(learned.window), cw = seconds(cfg.window);
  if (!(lw > 0) || !(cw > 0)) return { below: learned.limit < cfg.limit && learned.window === cfg.window };
  return { below: learned.limit / lw < cfg.limit / cw };
}

// How often the sources page refreshes itself: breakers and pauses change
// by the second while runs are going.
const refreshMs = 5000;

export async function sourcesPage(main, { signal }) {
  document.title = 'Sources \u00b7 auditd';
  const body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading sources\u2026'));
  const stamp = h('span', { class: 'muted small', id: 'sources-updated' });
  // The fleet's view, filled only when the node is in a fleet.
  const fleet = h('div', { 'aria-live': 'polite' });
  fill(main, h('div', { class: 'pagehead' }, h('h1', null, 'Sources'), stamp),
    h('p', { class: 'muted lede' }, 'The limit in force is what auditd has learned from each source\u2019s responses; it never exceeds the configured ceiling.'),
    body, fleet);
  let timer = 0;
  let stopped = false;
  const load = async () => {
    if (document.hidden) { timer = setTimeout(load, refreshMs); return; }
    try {
      const res = await getJSON('/v1/sources', signal);
      if (stopped) return;
      const list = listOf(res, 'sources');
      // One unit for every rate on the page, chosen for the page's pace.
      const unit = pageUnit(list.flatMap((x) => {
        const { cfg, learned } = splitSource(x);
        return [perSecondOf(cfg.limit, cfg.window), perSecondOf(learned.limit, learned.window)];
      }));
      const rows = list.map((x) => sourceRow(x, unit));
      fill(body, table(null, ['Source', `Limit in force (learned), per ${unit.name}`, `Configured ceiling, per ${unit.name}`, 'What taught it', 'Breaker', 'Pause', 'Concurrency'],
        rows, { id: 'sources-table', empty: 'No sources configured.' }));
      // Only a node in a fleet points to the fleet's view: no request, and
      // nothing shown, on any other.
      if (res.fleet) await loadFleetInto(fleet, res.fleet.view, signal);
      else fill(fleet);
      if (stopped) return;
      fill(stamp, `updated ${new Date().toISOString().slice(11, 19)} UTC \u00b7 refreshing every ${refreshMs / 1000}s`);
      timer = setTimeout(load, refreshMs);
    } catch (err) {
      if (stopped || err.name === 'AbortError') return;
      fill(body, problemBox(err, 'Could not load sources'));
      fill(stamp, '');
    }
  };
  await load();
  return () => { stopped = true; clearTimeout(timer); };
}

// loadFleetInto shows the fleet's view read from path in el, or a problem
// when it cannot be read.
async function loadFleetInto(el, path, signal) {
  try {
    fill(el, fleetSection(await getJSON(path, signal)));
  } catch (err) {
    if (err.name === 'AbortError') return;
    fill(el, problemBox(err, 'Could not load the fleet\u2019s view'));
  }
}

function sourceRow(x, unit) {
  const { cfg, learned, br, paused } = splitSource(x);
  const { below } = learnedVsCeiling(learned, cfg);
  return h('tr', { class: br.state === 'open' ? 'row-fail' : null },
    h('td', null, h('a', { href: `#/sources/${enc(cfg.id)}` }, cfg.id), cfg.group ? h('div', { class: 'small muted' }, `group ${cfg.group}`) : null),
    h('td', null, fmtRate(learned.limit, learned.window, unit),
      below ? h('div', { class: 'small muted learned-below' }, 'below the ceiling') : null),
    h('td', null, cfg.limit ? fmtRate(cfg.limit, cfg.window, unit) : h('span', { class: 'muted' }, 'registry default')),
    h('td', null, learned.cause ? h('span', { class: 'etype' }, learned.cause) : '\u2014',
      !zero(learned.changed_at) ? h('div', { class: 'small muted' }, timeEl(learned.changed_at)) : null),
    h('td', null, breakerCell(br)),
    h('td', null, pausedCell(paused)),
    h('td', { class: 'small' }, concurrencyText(learned, cfg)));
}

// concurrencyText is the requests in flight in force: learned within the
// configured concurrency when the server said, else the configured.
function concurrencyText(learned, cfg) {
  if (learned.concurrency) {
    return `${fmtNum(learned.concurrency)} at once` + (cfg.concurrency ? ` (of ${fmtNum(cfg.concurrency)} configured)` : ' (learned)');
  }
  return cfg.concurrency ? `${fmtNum(cfg.concurrency)} at once` : 'default';
}

// The ranges a source's timeline can show: the latest run that used it (the
// default), or a span back from now.
const ranges = [['run', 'Latest run'], ['1h', 'Last hour'], ['24h', 'Last 24 hours'], ['7d', 'Last 7 days']];
const spans = { '1h': 3600e3, '24h': 86400e3, '7d': 7 * 86400e3 };

export async function sourcePage(main, { hash, params: [id], signal }) {
  document.title = `Source ${id} \u00b7 auditd`;
  const range = ranges.some(([k]) => k === query(hash).get('range')) ? query(hash).get('range') : 'run';
  const body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading source\u2026'));
  const timeline = h('section', { id: 'timeline', 'aria-labelledby': 'timeline-h' });
  fill(main, h('p', { class: 'crumbs' }, h('a', { href: '#/sources' }, 'Sources'), ' / ', id),
    h('div', { class: 'pagehead' }, h('h1', null, 'Source ', h('span', { class: 'mono' }, id))), body, timeline);
  const charts = new ChartSet();
  let cfg, unit;
  try {
    const x = await getJSON(`/v1/sources/${enc(id)}`, signal);
    const { cfg: c, learned, br, paused } = splitSource(x);
    cfg = c;
    unit = pageUnit([perSecondOf(cfg.limit, cfg.window), perSecondOf(learned.limit, learned.window)]);
    const rate = (l, w) => fmtRate(l, w, unit);
    const pol = cfg.breaker || {};
    fill(body, h('div', { class: 'two-col' },
      h('section', null, h('h2', null, 'In force now'), dl([
        ['Limit in force', [rate(learned.limit, learned.window),
          learnedVsCeiling(learned, cfg).below ? h('span', { class: 'muted learned-below' }, ' (below the ceiling)') : null]],
        ['What taught it', learned.cause || ''],
        ['Learned at', zero(learned.changed_at) ? '' : timeEl(learned.changed_at)],
        ['Requests in flight', concurrencyText(learned, cfg)],
        ['Breaker', breakerCell(br)],
        ['Pause', pausedCell(paused)],
      ])),
      h('section', null, h('h2', null, 'Configured'), dl([
        ['Base URL', h('span', { class: 'mono' }, cfg.base_url || '')],
        ['Gateway group', cfg.group || ''],
        ['Ceiling', cfg.limit ? rate(cfg.limit, cfg.window) : 'registry default'],
        ['Burst', cfg.burst ? fmtNum(cfg.burst) : ''],
        ['Concurrency', cfg.concurrency ? fmtNum(cfg.concurrency) : ''],
        ['Retry-After cap', cfg.retry_after_cap ? fmtDuration(cfg.retry_after_cap) : ''],
        ['Max attempts', cfg.max_attempts ? fmtNum(cfg.max_attempts) : ''],
        ['Breaker policy', pol.threshold ? `opens after ${pol.threshold} failures in a row, cooldown ${fmtDuration(pol.cooldown)}, ${pol.probes || 1} probe${(pol.probes || 1) === 1 ? '' : 's'}` : ''],
        ['Body error rule', cfg.body_error || ''],
        ['Credential headers', cfg.headers ? Object.keys(cfg.headers).join(', ') + ' (values redacted)' : ''],
        ['Secret query parameters', (cfg.secret_query || []).join(', ')],
      ]))));
  } catch (err) {
    fill(body, problemBox(err, 'Could not load the source'));
    return () => charts.destroy();
  }

  const picker = h('nav', { class: 'toolbar', 'aria-label': 'Range', id: 'range-picker' },
    ranges.map(([k, label]) => h('a', { href: routeWith(`#/sources/${enc(id)}`, { range: k === 'run' ? '' : k }), class: 'btn btn-quiet', 'aria-current': k === range ? 'true' : null, dataset: { range: k } }, label)));
  fill(timeline, h('h2', { id: 'timeline-h' }, 'Requests over time'), picker, h('p', { class: 'muted' }, 'Adding up the ledger\u2026'));
  try {
    const { from, to, what } = await timelineRange(id, range, signal);
    const src = routeWith(`/v1/sources/${enc(id)}/timeline`, { from: from.toISOString(), to: to.toISOString() });
    const tl = await getJSON(src, signal);
    fill(timeline, h('h2', { id: 'timeline-h' }, 'Requests over time'), picker,
      h('p', { class: 'muted small', id: 'timeline-range' }, `${what}: ${fmtTime(tl.from)} to ${fmtTime(tl.to)}, in buckets of ${bucketWords(pace(tl, tl.sources || []))}.`),
      sourceTimelineView(tl, cfg, charts, unit));
    timeline.dataset.src = src;
    charts.mount();
  } catch (err) {
    if (err.name === 'AbortError') return () => charts.destroy();
    fill(timeline, h('h2', { id: 'timeline-h' }, 'Requests over time'), picker, problemBox(err, 'Could not load the timeline'));
  }
  return () => charts.destroy();
}

// timelineRange is the range to show: the latest run that used the source
// (created to finished, or now), or a span back from now.
async function timelineRange(id, range, signal) {
  const now = new Date();
  if (range === 'run') {
    const runs = listOf(await getJSON(routeWith('/v1/runs', { source: id, limit: '1' }), signal), 'runs');
    if (runs.length) {
      const r = runs[0];
      const from = new Date(r.created_at);
      let to = r.finished_at ? new Date(r.finished_at) : now;
      if (!(to > from)) to = new Date(from.getTime() + 60e3);
      return { from, to, what: `Latest run, ${r.name || r.id}` };
    }
    range = '1h';
  }
  return { from: new Date(now.getTime() - spans[range]), to: now, what: ranges.find(([k]) => k === range)[1] };
}

function sourceTimelineView(tl, cfg, charts, unit) {
  const st = (tl.sources || [])[0];
  if (!st) return h('p', { class: 'muted' }, 'Nothing was recorded for this source in this range.');
  // The ceiling as a rate per second; the chart shows it in its own unit.
  const ceiling = cfg.limit && seconds(cfg.window) > 0 ? cfg.limit / seconds(cfg.window) : null;
  const changes = (st.limit_changes || []).map((c) => h('tr', null,
    h('td', { class: 'nowrap' }, timeEl(c.time)),
    h('td', null, fmtRate(c.old_limit, c.old_window, unit)),
    h('td', null, fmtRate(c.new_limit, c.new_window, unit)),
    h('td', null, h('span', { class: 'etype' }, c.cause)),
    h('td', null, c.run_id ? h('a', { href: `#/runs/${enc(c.run_id)}`, class: 'mono small' }, c.run_id) : '\u2014'),
    h('td', { class: 'num' }, fmtNum(c.seq))));
  return [
    charts.add(timelineChart(tl, st, { width: pace(tl, [st]), title: 'Requests against what the limit in force allowed' })),
    h('h2', { id: 'limits-h' }, 'Learned-limit history'),
    charts.add(limitChart(tl, st, ceiling, unit)),
    table(null, ['Changed at (UTC)', 'From', 'To', 'What taught it', 'Run', { label: 'Seq', num: true }], changes,
      { id: 'limit-changes', empty: 'The learned limit did not change in this range.' }),
  ];
}
