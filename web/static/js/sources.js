// Sources: the limit auditd has learned for each source against the
// ceiling an operator configured, what taught it, and where its breaker
// and pause stand now.
import { getJSON, enc } from './api.js';
import { h, fill, fmtNum, fmtDuration, fmtRelative, timeEl, badge, table, dl, problemBox, seconds } from './dom.js';
import { listOf } from './runs.js';

// splitSource takes a SourceState (openapi.yaml): the configured source's
// fields, what was learned, the breaker now (breaker_state; "breaker" is
// the configured policy) and the pause deadline.
export function splitSource(x) {
  return { cfg: x, learned: x.learned || {}, br: x.breaker_state || {}, paused: x.paused_until || '' };
}

function zero(t) { return !t || String(t).startsWith('0001-01-01'); }

function rate(limit, window) {
  if (!limit) return '\u2014';
  return `${fmtNum(limit)} per ${fmtDuration(window)}`;
}

function pausedCell(paused) {
  if (zero(paused) || new Date(paused).getTime() <= Date.now()) return h('span', { class: 'muted' }, 'not paused');
  return h('span', { class: 'warn-text' }, 'until ', timeEl(paused), ' ', h('span', { class: 'muted' }, `(${fmtRelative(paused)})`));
}

function breakerCell(br) {
  const st = br.state || 'closed';
  return h('span', null, badge(st), br.failures ? h('span', { class: 'muted' }, ` ${br.failures} failure${br.failures === 1 ? '' : 's'}`) : null,
    !zero(br.until) ? h('div', { class: 'small muted' }, 'cooldown ends ', timeEl(br.until)) : null);
}

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
  fill(main, h('div', { class: 'pagehead' }, h('h1', null, 'Sources'), stamp),
    h('p', { class: 'muted lede' }, 'The limit in force is what auditd has learned from each source\u2019s responses; it never exceeds the configured ceiling.'),
    body);
  let timer = 0;
  let stopped = false;
  const load = async () => {
    if (document.hidden) { timer = setTimeout(load, refreshMs); return; }
    try {
      const res = await getJSON('/v1/sources', signal);
      if (stopped) return;
      const rows = listOf(res, 'sources').map(sourceRow);
      fill(body, table(null, ['Source', 'Limit in force (learned)', 'Configured ceiling', 'What taught it', 'Breaker', 'Pause', 'Tier'],
        rows, { id: 'sources-table', empty: 'No sources configured.' }));
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

function sourceRow(x) {
  const { cfg, learned, br, paused } = splitSource(x);
  const { below } = learnedVsCeiling(learned, cfg);
  return h('tr', { class: br.state === 'open' ? 'row-fail' : null },
    h('td', null, h('a', { href: `#/sources/${enc(cfg.id)}` }, cfg.id), cfg.group ? h('div', { class: 'small muted' }, `group ${cfg.group}`) : null),
    h('td', null, rate(learned.limit, learned.window),
      below ? h('div', { class: 'small learned-below' }, 'below the ceiling') : null),
    h('td', null, cfg.limit ? rate(cfg.limit, cfg.window) : h('span', { class: 'muted' }, 'registry default')),
    h('td', null, learned.cause ? h('span', { class: 'etype' }, learned.cause) : '\u2014',
      !zero(learned.changed_at) ? h('div', { class: 'small muted' }, timeEl(learned.changed_at)) : null),
    h('td', null, breakerCell(br)),
    h('td', null, pausedCell(paused)),
    h('td', { class: 'small' }, [cfg.tier, cfg.concurrency ? `${cfg.concurrency} at once` : ''].filter(Boolean).join(' \u00b7 ')));
}

export async function sourcePage(main, { params: [id], signal }) {
  document.title = `Source ${id} \u00b7 auditd`;
  const body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading source\u2026'));
  fill(main, h('p', { class: 'crumbs' }, h('a', { href: '#/sources' }, 'Sources'), ' / ', id),
    h('div', { class: 'pagehead' }, h('h1', null, 'Source ', h('span', { class: 'mono' }, id))), body);
  try {
    const x = await getJSON(`/v1/sources/${enc(id)}`, signal);
    const { cfg, learned, br, paused } = splitSource(x);
    const pol = cfg.breaker || {};
    fill(body, h('div', { class: 'two-col' },
      h('section', null, h('h2', null, 'In force now'), dl([
        ['Limit in force', [rate(learned.limit, learned.window),
          learnedVsCeiling(learned, cfg).below ? h('span', { class: 'learned-below' }, ' (below the ceiling)') : null]],
        ['What taught it', learned.cause || ''],
        ['Learned at', zero(learned.changed_at) ? '' : timeEl(learned.changed_at)],
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
        ['Breaker policy', pol.threshold ? `opens after ${pol.threshold} failures, cooldown ${fmtDuration(pol.cooldown)}, ${pol.probes || 1} probe(s)` : ''],
        ['Tier', cfg.tier || ''],
        ['Body error rule', cfg.body_error || ''],
        ['Credential headers', cfg.headers ? Object.keys(cfg.headers).join(', ') + ' (values redacted)' : ''],
        ['Secret query parameters', (cfg.secret_query || []).join(', ')],
      ]))));
  } catch (err) {
    fill(body, problemBox(err, 'Could not load the source'));
  }
}
