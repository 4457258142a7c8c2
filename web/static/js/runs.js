// Runs: the list (and award evidence), one run's detail (counts, progress,
// reconciliation, downloads), its items and its events.
import { getJSON, download, enc } from './api.js';
import {
  h, fill, fmtNum, fmtSigned, fmtDuration, fmtRate, fmtCount, fmtRelative, fmtTime, timeEl, short, badge, table, dl, pageUnit, perSecondOf,
  problemBox, query, routeWith,
} from './dom.js';
import { ChartSet, timelineChart, bucketWords, pace } from './charts.js';

// How often a running run's detail page refreshes itself.
const refreshMs = 3000;
const pageSize = 50;

export const runStatuses = ['queued', 'running', 'succeeded', 'partial', 'cancelled'];

// Event types from docs/EVENTS.md, for the events filter.
export const eventTypes = [
  'run.started', 'run.resumed', 'run.finished', 'item.queued', 'dispatch', 'wait', 'response',
  'throttle', 'transport.error', 'dispatch.interrupted', 'breaker', 'registry.changed',
  'registry.snapshot', 'shed', 'cache.served', 'payload.staged', 'item.finished',
  'item.acknowledged', 'export.downloaded', 'report.viewed',
];

// listOf and nextOf read a page of a list (openapi.yaml: {<key>: [...],
// next_cursor}; next_cursor is absent on the last page).
export function listOf(body, key) { return (body && body[key]) || []; }
export function nextOf(body) { return (body && body.next_cursor) || ''; }

// splitRun takes a RunState: the run's fields, its live counts and the
// estimated finish (absent once finished or when unknown).
export function splitRun(x) {
  return { run: x, counts: x.counts || {}, eta: x.estimated_finish || '' };
}

function terminal(status) { return status === 'succeeded' || status === 'partial' || status === 'cancelled'; }

function done(c) {
  return (c.succeeded || 0) + (c.cached || 0) + (c.failed || 0) + (c.shed || 0);
}

function itemsTotal(run, c) { return c.items ?? run.item_count ?? 0; }

function progress(value, max, label) {
  return h('progress', { value: Math.min(value, max || 0), max: max || 1, 'aria-label': label });
}

// ---- #/runs -------------------------------------------------------------

export async function runsPage(main, { hash, signal }) {
  document.title = 'Runs \u00b7 auditd';
  const q = query(hash);
  const status = q.get('status') || '';
  const fain = q.get('fain') || '';
  const cursor = q.get('cursor') || '';

  const select = h('select', { id: 'status-filter', name: 'status' },
    h('option', { value: '' }, 'All statuses'),
    runStatuses.map((s) => h('option', { value: s, selected: s === status }, s)));
  const fainInput = h('input', { id: 'fain-filter', name: 'fain', type: 'search', value: fain, size: 16, placeholder: 'any' });
  const filters = h('form', { class: 'filters', id: 'runs-filters', role: 'search' },
    h('label', { for: 'status-filter' }, 'Status'), select,
    h('label', { for: 'fain-filter' }, 'Award FAIN'), fainInput,
    h('button', { type: 'submit', class: 'btn' }, 'Apply'));
  const apply = (ev) => {
    if (ev) ev.preventDefault();
    location.hash = routeWith('#/runs', { status: select.value, fain: fainInput.value.trim() });
  };
  filters.addEventListener('submit', apply);
  select.addEventListener('change', apply);

  const body = h('div', { 'aria-live': 'polite', 'aria-busy': 'true' }, h('p', { class: 'muted' }, 'Loading runs\u2026'));
  fill(main, h('div', { class: 'pagehead' }, h('h1', null, 'Runs')), filters, body, awardEvidenceForm(fain));

  try {
    const res = await getJSON(routeWith('/v1/runs', { status, award: fain, cursor, limit: String(pageSize) }), signal);
    const runs = listOf(res, 'runs');
    const next = nextOf(res);
    const rows = runs.map((x) => {
      const { run, counts } = splitRun(x);
      const total = itemsTotal(run, counts);
      const d = done(counts);
      return h('tr', { dataset: { run: run.id } },
        h('td', null, h('a', { href: `#/runs/${enc(run.id)}` }, run.name || run.id), ' ', fleetBadge(x.fleet),
          run.name ? h('div', { class: 'mono muted small' }, run.id) : null),
        h('td', null, badge(run.status)),
        h('td', null, timeEl(run.created_at)),
        h('td', { class: 'num' }, `${fmtNum(d)} / ${fmtNum(total)}`, ' ', progress(d, total, `${d} of ${total} items done`)),
        h('td', null, (run.award && run.award.fain) || '\u2014'),
        h('td', null, run.initiated_by || '\u2014'));
    });
    const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' },
      cursor ? h('a', { href: routeWith('#/runs', { status, fain }), class: 'btn' }, '\u2190 First page') : null,
      next ? h('a', { href: routeWith('#/runs', { status, fain, cursor: next }), class: 'btn', id: 'runs-next' }, 'Next page \u2192') : null,
      h('span', { class: 'muted' }, `${runs.length} run${runs.length === 1 ? '' : 's'} on this page`));
    fill(body, table(null, ['Run', 'Status', 'Created (UTC)', { label: 'Items done / total', num: true }, 'Award FAIN', 'Initiated by'],
      rows, { id: 'runs-table', empty: status || fain ? 'No runs match these filters.' : 'No runs yet.' }), pager);
  } catch (err) {
    fill(body, problemBox(err, 'Could not load runs'));
  }
  body.setAttribute('aria-busy', 'false');
}

// fleetBadge marks a run that is this node's part of a fleet run (its
// FleetPartOf), or that may be one when the node could not ask the fleet.
function fleetBadge(part) {
  if (!part) return null;
  if (part.unknown) {
    return h('span', { class: 'badge badge-unknown', title: 'This node could not ask the fleet whether this run is its part of a fleet run.' }, 'fleet part?');
  }
  return h('span', { class: 'badge badge-fleet', title: `Node ${part.node}'s part of a fleet run: this node's part only.` }, 'fleet part');
}

// awardEvidenceForm downloads the evidence workbook, or the evidence pack,
// of every run of an award created in [from, to).
function awardEvidenceForm(fain) {
  const fainIn = h('input', { id: 'award-fain', name: 'award', required: true, value: fain, size: 18, maxlength: 64 });
  const from = h('input', { id: 'award-from', name: 'from', type: 'date' });
  const to = h('input', { id: 'award-to', name: 'to', type: 'date' });
  const status = h('div', { 'aria-live': 'polite', id: 'award-status' });
  const submit = h('button', { type: 'submit', class: 'btn', id: 'award-xlsx' }, 'Download award evidence (XLSX)');
  const packBtn = h('button', { type: 'submit', class: 'btn', id: 'award-pack' }, 'Download award evidence pack (ZIP)');
  const form = h('form', { class: 'filters', id: 'award-evidence' },
    h('label', { for: 'award-fain' }, 'FAIN'), fainIn,
    h('label', { for: 'award-from' }, 'Runs created from'), from,
    h('label', { for: 'award-to' }, 'before'), to, submit, packBtn);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const award = fainIn.value.trim();
    if (!award) { fill(status, h('p', { class: 'problem' }, 'Enter the award\u2019s FAIN.')); fainIn.focus(); return; }
    const pack = ev.submitter === packBtn;
    submit.disabled = packBtn.disabled = true;
    fill(status, h('p', { class: 'muted' }, pack ? 'Preparing the evidence pack\u2026' : 'Preparing the workbook\u2026'));
    try {
      const got = pack
        ? await download(routeWith('/v1/evidence-pack.zip', { award, from: from.value, to: to.value }), `evidence-pack-${award}.zip`)
        : await download(routeWith('/v1/evidence.xlsx', { award, from: from.value, to: to.value }), `evidence-${award}.xlsx`);
      fill(status, h('p', { class: 'muted' }, `Saved ${got.name} (${fmtNum(got.size)} bytes).`));
    } catch (err) {
      fill(status, problemBox(err, 'Could not download the award evidence'));
    }
    submit.disabled = packBtn.disabled = false;
  });
  return h('section', { 'aria-labelledby': 'award-h', class: 'award-box' },
    h('h2', { id: 'award-h' }, 'Evidence for an award and period'),
    h('p', { class: 'muted' }, 'One workbook for every run of the award created in the period (dates are UTC; the end date is excluded), '
      + 'or one evidence pack: that workbook with the ledger events behind it and their proofs, for an auditor to check offline '
      + 'with auditd verify --pack. A pack needs every run of the period to have ended.'),
    form, status);
}

// ---- #/runs/{id} --------------------------------------------------------

export async function runPage(main, { params: [id], signal }) {
  document.title = `Run ${id} \u00b7 auditd`;
  const head = h('div', { class: 'pagehead' }, h('h1', null, 'Run ', h('span', { class: 'mono' }, id)));
  const summary = h('section', { id: 'run-summary', 'aria-busy': 'true' }, h('p', { class: 'muted' }, 'Loading run\u2026'));
  const downloads = downloadBar(id);
  const fleet = h('section', { id: 'fleet-part', hidden: true, 'aria-label': 'Fleet run' });
  const timeline = h('section', { id: 'timeline', 'aria-labelledby': 'timeline-h' });
  const recon = h('section', { id: 'reconciliation', 'aria-labelledby': 'recon-h' });
  fill(main, h('p', { class: 'crumbs' }, h('a', { href: '#/runs' }, 'Runs'), ' / ', id), head, fleet, downloads, summary, timeline, recon);

  let timer = 0;
  let lastStatus = '';
  let stopped = false;
  const charts = new ChartSet();

  // The charts follow a running run at every refresh, and are drawn once
  // more when it ends.
  const loadTimeline = async (x) => {
    try {
      // A run of many sources charts those with the most items.
      const by = (x.counts && x.counts.by_source) || {};
      const all = Object.keys(by);
      const top = all.length > maxRunCharts ? all.sort((a, b) => (by[b].items || 0) - (by[a].items || 0)).slice(0, maxRunCharts) : [];
      const src = routeWith(`/v1/runs/${enc(id)}/timeline`, { source: top.join(',') });
      const tl = await getJSON(src, signal);
      if (stopped) return;
      timeline.dataset.src = src;
      charts.clear();
      fill(timeline, runTimelineView(tl, charts, all.length));
      charts.mount();
    } catch (err) {
      if (stopped || err.name === 'AbortError') return;
      fill(timeline, h('h2', { id: 'timeline-h' }, 'Requests over time'), problemBox(err, 'Could not load the timeline'));
    }
  };

  const loadRecon = async () => {
    fill(recon, h('h2', { id: 'recon-h' }, 'Reconciliation'), h('p', { class: 'muted' }, 'Recounting the ledger\u2026'));
    try {
      const r = await getJSON(`/v1/runs/${enc(id)}/reconciliation`, signal);
      fill(recon, reconciliationView(r, loadRecon));
    } catch (err) {
      fill(recon, h('h2', { id: 'recon-h' }, 'Reconciliation'), problemBox(err, 'Could not load the reconciliation'));
    }
  };

  // A node's part of a fleet run says so, with the fleet run's verdict
  // over every node's part (recounted on demand) and its downloads. Until
  // the node could ask the fleet, the page says it does not know, and
  // asks again at each refresh or on demand.
  let fleetKnown = false;
  const loadFleet = async (part) => {
    fleet.hidden = false;
    if (part.unknown) {
      fill(fleet, h('div', { class: 'notice', id: 'fleet-unknown' },
        h('p', null, h('strong', null, 'Part of a fleet run? '),
          `This node (${part.node}) could not ask the fleet whether this run is its part of a fleet run. If it is, what this page shows covers this node\u2019s part only. `,
          h('button', { type: 'button', class: 'btn btn-quiet', onclick: () => load(true) }, 'Ask again'))));
      return;
    }
    fleetKnown = true;
    const recount = () => loadFleet(part);
    fill(fleet, fleetPartView(part, null, recount));
    try {
      const r = await getJSON(`${part.href}/reconciliation`, signal);
      if (!stopped) fill(fleet, fleetPartView(part, r, recount));
    } catch (err) {
      if (stopped || err.name === 'AbortError') return;
      fill(fleet, fleetPartView(part, err, recount));
    }
  };

  const load = async (once) => {
    // A hidden tab keeps its place but spends none of the token's budget.
    if (!once && lastStatus && document.hidden) { timer = setTimeout(load, refreshMs); return; }
    if (once) clearTimeout(timer);
    try {
      const x = await getJSON(`/v1/runs/${enc(id)}`, signal);
      if (stopped) return;
      const { run } = splitRun(x);
      document.title = `Run ${run.name || run.id} \u00b7 auditd`;
      fill(head, h('h1', null, run.name || 'Run', ' ', badge(run.status)),
        h('p', { class: 'mono muted' }, run.id));
      fill(summary, runSummary(x));
      summary.setAttribute('aria-busy', 'false');
      if (x.fleet && (!fleetKnown || (terminal(run.status) && lastStatus && !terminal(lastStatus)))) loadFleet(x.fleet);
      // Recount once on load and again when the run reaches its end.
      if (!lastStatus || (terminal(run.status) && !terminal(lastStatus))) loadRecon();
      if (!lastStatus || !terminal(lastStatus)) loadTimeline(x);
      lastStatus = run.status;
      if (!terminal(run.status)) timer = setTimeout(load, refreshMs);
    } catch (err) {
      if (stopped || err.name === 'AbortError') return;
      fill(summary, problemBox(err, 'Could not load the run'));
      summary.setAttribute('aria-busy', 'false');
      // A passing network failure should not end the live view.
      if (lastStatus && !terminal(lastStatus) && err.status !== 404 && err.status !== 401) timer = setTimeout(load, refreshMs * 2);
    }
  };
  await load();
  return () => { stopped = true; clearTimeout(timer); charts.destroy(); };
}

// maxRunCharts is how many sources of a run get a chart: those with the
// most items.
const maxRunCharts = 12;

function runTimelineView(tl, charts, sourceCount) {
  const head = h('h2', { id: 'timeline-h' }, 'Requests over time');
  const sources = tl.sources || [];
  if (!sources.length) return [head, h('p', { class: 'muted' }, 'No requests recorded yet.')];
  // Each chart's buckets are sized to its source's pace: at least its
  // longest window in force.
  return [head,
    h('p', { class: 'muted small', id: 'timeline-range' }, `${fmtTime(tl.from)} to ${fmtTime(tl.to)}; one chart per source, each in buckets at least as wide as its source's window (${bucketWords(tl.bucket_seconds)} at the least).`),
    sources.map((st) => charts.add(timelineChart(tl, st, { width: pace(tl, [st]), title: h('a', { href: `#/sources/${enc(st.source)}` }, st.source) }))),
    sourceCount > maxRunCharts ? h('p', { class: 'muted' }, `The ${maxRunCharts} sources with the most items of ${fmtNum(sourceCount)} are charted; every source's page has its own chart.`) : null];
}

// fleetPartView tells that the run is this node's part of a fleet run (a
// FleetPartOf): this page covers the part only; the fleet run's verdict
// (r, its reconciliation once loaded, or the error that came instead;
// recount asks again) and downloads cover every part.
function fleetPartView(part, r, recount) {
  const others = (part.parts || []).filter((n) => n !== part.node);
  const status = h('span', { class: 'muted', 'aria-live': 'polite', id: 'fleet-download-status' });
  const btn = downloadButton(status);
  let verdict = h('p', { class: 'muted', id: 'fleet-verdict', 'aria-live': 'polite' }, 'Reconciling the fleet run\u2026');
  if (r instanceof Error) {
    verdict = h('div', { id: 'fleet-verdict', 'aria-live': 'polite' },
      problemBox(r, 'Could not reconcile the fleet run'),
      h('button', { type: 'button', class: 'btn btn-quiet', id: 'fleet-recount', onclick: recount }, 'Recount'));
  } else if (r) {
    const had = (r.parts || []).filter((p) => p.report).length;
    verdict = h('p', { class: `verdict ${r.balanced ? 'verdict-ok' : 'verdict-bad'}`, id: 'fleet-verdict', 'aria-live': 'polite' },
      r.balanced ? 'The fleet run balances' : `The fleet run does not balance: failed ${(r.checks || []).filter((c) => c.status === 'fail').map((c) => c.id).join(', ')}`,
      ` over ${had} of ${(r.parts || []).length} nodes\u2019 parts; status `, badge(r.status), '. ',
      h('button', { type: 'button', class: 'btn btn-quiet', id: 'fleet-recount', onclick: recount }, 'Recount'));
  }
  return h('div', { class: 'notice' },
    h('p', null, h('strong', null, 'Part of a fleet run. '),
      `This page shows node ${part.node}\u2019s part only`,
      others.length ? `; ${others.join(', ')} hold${others.length === 1 ? 's' : ''} the others.` : '.',
      ' Its reconciliation and downloads below cover this part; the fleet run\u2019s cover every part.'),
    verdict,
    h('div', { class: 'toolbar', role: 'group', 'aria-label': 'Fleet run downloads' },
      btn('Fleet evidence workbook (XLSX)', `${part.href}/evidence.xlsx`, `fleet-evidence-${part.href.split('/').pop()}.xlsx`, 'dl-fleet-evidence'),
      btn('Fleet evidence pack (ZIP)', `${part.href}/evidence-pack.zip`, `fleet-evidence-pack-${part.href.split('/').pop()}.zip`, 'dl-fleet-pack'),
      status));
}

// downloadButton returns a maker of download buttons that report in status.
function downloadButton(status) {
  return (label, path, name, bid) => {
    const b = h('button', { type: 'button', class: 'btn', id: bid }, label);
    b.addEventListener('click', async () => {
      b.disabled = true;
      fill(status, `Preparing ${name}\u2026`);
      try {
        const got = await download(path, name);
        fill(status, `Saved ${got.name} (${fmtNum(got.size)} bytes).`);
      } catch (err) {
        fill(status, problemBox(err, `Could not download ${name}`));
      }
      b.disabled = false;
    });
    return b;
  };
}

function downloadBar(id) {
  const status = h('span', { class: 'muted', 'aria-live': 'polite', id: 'download-status' });
  const btn = downloadButton(status);
  const base = `/v1/runs/${enc(id)}`;
  return h('div', { class: 'toolbar', role: 'group', 'aria-label': 'Downloads' },
    btn('Evidence workbook (XLSX)', `${base}/evidence.xlsx`, `evidence-${id}.xlsx`, 'dl-evidence'),
    btn('Evidence pack (ZIP)', `${base}/evidence-pack.zip`, `evidence-pack-${id}.zip`, 'dl-pack'),
    btn('Reconciliation (CSV)', `${base}/reconciliation?format=csv`, `reconciliation-${id}.csv`, 'dl-recon-csv'),
    btn('Reconciliation (XLSX)', `${base}/reconciliation?format=xlsx`, `reconciliation-${id}.xlsx`, 'dl-recon-xlsx'),
    h('a', { href: `#/runs/${enc(id)}/items`, class: 'btn btn-quiet', id: 'items-link' }, 'Items \u2192'),
    h('a', { href: `#/runs/${enc(id)}/events`, class: 'btn btn-quiet', id: 'events-link' }, 'Events \u2192'),
    status);
}

function runSummary(x) {
  const { run, counts: c, eta } = splitRun(x);
  const a = run.award || {};
  const total = itemsTotal(run, c);
  const d = done(c);
  const live = !terminal(run.status);

  const overall = h('div', { class: 'overall' },
    h('div', { class: 'overall-label' }, `${fmtNum(d)} of ${fmtNum(total)} items done`,
      live ? h('span', { class: 'muted' }, ` \u00b7 refreshing every ${refreshMs / 1000}s`) : null),
    progress(d, total, 'Items done'),
    live ? h('p', { id: 'eta' }, 'Estimated finish: ', eta ? [timeEl(eta), ' ', h('span', { class: 'muted' }, `(${fmtRelative(eta)})`)] : 'not known yet') : null);

  const num = (k) => fmtNum(c[k] ?? 0);
  const countGroups = h('div', { class: 'counts', id: 'counts' },
    countCard('Items', [['Queued', fmtNum(total)], ['Succeeded', num('succeeded')], ['Served from cache', num('cached')],
      ['Failed', num('failed'), c.failed > 0], ['Shed', num('shed'), c.shed > 0], ['Pending', num('pending')]]),
    countCard('Requests', [['Dispatches', num('dispatches')], ['Retries', num('retries')], ['2xx', num('status_2xx')],
      ['429', num('status_429')], ['5xx', num('status_5xx'), c.status_5xx > 0], ['Other status', num('status_other')],
      ['Transport errors', num('transport_errors'), c.transport_errors > 0], ['Interrupted', num('interrupted')]]),
    countCard('Controls and delivery', [['Waits', num('waits')], ['Breaker opens', num('breaker_opens'), c.breaker_opens > 0],
      ['Payloads staged', num('staged')], ['Acknowledged', num('acknowledged')]]));

  const by = c.by_source || {};
  const srcRows = Object.keys(by).sort().map((s) => {
    const p = by[s] || {};
    const pct = p.items ? Math.floor((100 * (p.done || 0)) / p.items) : 0;
    return h('tr', null,
      h('td', null, h('a', { href: `#/sources/${enc(s)}` }, s)),
      h('td', { class: 'num' }, `${fmtNum(p.done || 0)} / ${fmtNum(p.items || 0)}`),
      h('td', { class: 'bar' }, progress(p.done || 0, p.items || 0, `${s}: ${p.done || 0} of ${p.items || 0}`)),
      h('td', { class: 'num' }, `${pct}%`));
  });

  const facts = dl([
    ['Status', badge(run.status)],
    ['Created', timeEl(run.created_at)],
    ['Finished', run.finished_at ? timeEl(run.finished_at) : null],
    ['Deadline', run.deadline ? timeEl(run.deadline) : null],
    ['Initiated by', run.initiated_by || ''],
    ['Award FAIN', a.fain || ''],
    ['Assistance Listing', [a.listing_number, a.listing_title].filter(Boolean).join(' \u2014 ')],
    ['Award year', a.award_year ? String(a.award_year) : ''],
    ['Agency', a.agency || ''],
    ['Pass-through entity', [a.pass_through_entity, a.pass_through_award_id].filter(Boolean).join(', award ')],
    ['Recipient UEI', a.recipient_uei || ''],
    ['Ledger sequence', `${fmtNum(run.first_seq)} \u2013 ${run.last_seq ? fmtNum(run.last_seq) : 'open'}`],
    ['Chain head at start', short(run.head_at_start, 16)],
    ['Chain head at end', run.head_at_end ? short(run.head_at_end, 16) : ''],
    ['Config hash', short(run.config_hash, 16)],
    ['Code version', run.code_version || ''],
    ['Replay', run.replay ? 'yes: staged payloads, no fetches' : null],
  ]);

  return h('div', { class: 'run-grid' },
    h('div', null,
      h('h2', null, 'Progress'), overall, countGroups,
      table('Progress per source', ['Source', { label: 'Done / items', num: true }, 'Progress', { label: '%', num: true }],
        srcRows, { id: 'source-progress', empty: 'No per-source counts reported.' })),
    h('aside', { 'aria-label': 'Run identifiers' }, h('h2', null, 'Identifiers'), facts));
}

function countCard(title, rows) {
  return h('div', { class: 'count-card' }, h('h3', null, title),
    h('dl', null, rows.map(([k, v, warn]) => h('div', { class: warn ? 'warn' : null }, h('dt', null, k), h('dd', null, v)))));
}

// ---- reconciliation -----------------------------------------------------

// checkStatus reads a check's verdict: "pass", "fail" or "n/a". The
// reports package writes status; the contract (openapi.yaml) names a
// boolean pass; either is read.
export function checkStatus(c) {
  if (typeof c.status === 'string' && c.status) {
    const st = c.status.toLowerCase();
    return st === 'na' ? 'n/a' : st;
  }
  if (c.pass === true) return 'pass';
  if (c.pass === false) return 'fail';
  return 'unknown';
}

// splitChecks reads the run-total checks and the per-source reports of a
// reconciliation, whether sources come as a list of reports or as checks
// with a scope (a source id, or "total").
export function splitChecks(r) {
  const all = r.checks || [];
  const total = all.filter((c) => !c.scope || c.scope === 'total');
  const sources = (r.sources || []).map((s) => ({ id: s.source || s.id, balanced: s.balanced, checks: s.checks || [] }));
  const scoped = {};
  for (const c of all) {
    if (c.scope && c.scope !== 'total') (scoped[c.scope] = scoped[c.scope] || []).push(c);
  }
  for (const id of Object.keys(scoped).sort()) {
    if (sources.some((s) => s.id === id)) continue;
    sources.push({ id, balanced: scoped[id].every((c) => checkStatus(c) !== 'fail'), checks: scoped[id] });
  }
  return { total, sources };
}

function checkRows(checks) {
  return (checks || []).map((c) => {
    const st = checkStatus(c);
    const fail = st === 'fail';
    const na = st === 'n/a';
    const diff = c.difference ?? ((c.actual ?? 0) - (c.expected ?? 0));
    return h('tr', { class: fail ? 'row-fail' : na ? 'row-na' : null, dataset: { check: c.id, status: st } },
      h('th', { scope: 'row', class: 'mono' }, c.id),
      h('td', null, c.description || ''),
      h('td', { class: 'num' }, na ? '\u2014' : fmtNum(c.expected)),
      h('td', { class: 'num' }, na ? '\u2014' : fmtNum(c.actual)),
      h('td', { class: `num ${diff && !na ? 'diff' : ''}` }, na ? '\u2014' : fmtSigned(diff)),
      h('td', null, badge(na ? 'na' : st, fail ? 'FAIL' : st)),
      h('td', { class: 'small' }, c.note || '',
        c.offending && c.offending.length ? h('div', null, 'First offending events: ',
          h('span', { class: 'mono' }, c.offending.slice(0, 10).join(', ')), c.offending.length > 10 ? '\u2026' : '') : null));
  });
}

const checkCols = ['Check', 'Identity', { label: 'Expected', num: true }, { label: 'Actual', num: true },
  { label: 'Difference', num: true }, 'Result', 'Note'];

export function reconciliationView(r, reload) {
  const { total: checks, sources } = splitChecks(r);
  const failed = checks.filter((c) => checkStatus(c) === 'fail').map((c) => c.id);
  const verdict = r.balanced
    ? h('p', { class: 'verdict verdict-ok', id: 'verdict' }, h('strong', null, 'Balanced.'), ' Every identity holds.')
    : h('p', { class: 'verdict verdict-bad', id: 'verdict' }, h('strong', null, 'Not balanced.'),
      failed.length ? ` Failing: ${failed.join(', ')}.` : ' See the checks below.');
  const again = h('button', { type: 'button', class: 'btn btn-quiet' }, 'Recount');
  again.addEventListener('click', reload);

  const perSource = sources.map((s) => h('details', { class: 'source-recon', open: !s.balanced },
    h('summary', null, h('span', { class: 'mono' }, s.id), ' ', badge(s.balanced ? 'pass' : 'fail', s.balanced ? 'balanced' : 'not balanced')),
    table(null, checkCols, checkRows(s.checks), { class: 'checks' })));

  const control = (r.control || []).map((c) => h('tr', { class: c.within === false ? 'row-fail' : null },
    h('td', null, c.source),
    h('td', { class: 'num' }, fmtNum(c.peak)),
    h('td', null, c.unit || 'requests', c.unit === 'records' ? h('span', { class: 'muted' }, ` (${fmtNum(c.requests)} requests)`) : null),
    h('td', null, fmtCount(c.limit, c.window_ns ?? c.window)),
    h('td', { class: 'num' }, fmtNum(c.burst)),
    h('td', null, c.peak_at ? timeEl(c.peak_at) : '\u2014', c.peak_seq ? h('span', { class: 'muted' }, ` (seq ${c.peak_seq})`) : null),
    h('td', null, badge(c.within === false ? 'fail' : 'pass', c.within === false ? 'over limit' : 'within'))));

  const cached = (r.cached || []).map((c) => h('tr', null,
    h('td', { class: 'num' }, fmtNum(c.seq)),
    h('td', null, c.source),
    h('td', { class: 'mono small' }, c.item),
    h('td', null, c.fetched_at ? fmtDuration(c.age) : 'unknown'),
    h('td', null, c.fetched_at ? timeEl(c.fetched_at) : '\u2014'),
    h('td', null, c.origin_run ? h('a', { href: `#/runs/${enc(c.origin_run)}`, class: 'mono small' }, c.origin_run) : '\u2014'),
    h('td', { class: 'small' }, c.reason || '')));

  return h('div', null,
    h('div', { class: 'pagehead' }, h('h2', { id: 'recon-h' }, 'Reconciliation'), again),
    verdict,
    table('Run total', checkCols, checkRows(checks), { id: 'checks', class: 'checks' }),
    perSource.length ? h('h3', null, 'Per source') : null, perSource,
    control.length ? table('Control evidence (R9): busiest window against the limit in force',
      ['Source', { label: 'Peak in a window', num: true }, 'Counted in', 'Limit in force', { label: 'Burst', num: true }, 'At', 'Result'],
      control, { id: 'control' }) : null,
    cached.length ? table(`Served from cache (${cached.length}): the last good copies items fell back on`,
      [{ label: 'Seq', num: true }, 'Source', 'Item', 'Age when served', 'Copy fetched at', 'By run', 'Reason'],
      cached, { id: 'cached' }) : null);
}

// ---- #/runs/{id}/events -------------------------------------------------

export async function eventsPage(main, { hash, params: [id], signal }) {
  document.title = `Events of ${id} \u00b7 auditd`;
  const q = query(hash);
  const type = q.get('type') || '';
  const source = q.get('source') || '';
  const cursor = q.get('cursor') || '';
  const base = `#/runs/${enc(id)}/events`;

  const select = h('select', { id: 'type-filter', name: 'type' },
    h('option', { value: '' }, 'All types'),
    eventTypes.map((t) => h('option', { value: t, selected: t === type }, t)));
  const srcInput = h('input', { id: 'source-filter', name: 'source', type: 'search', value: source, size: 16, placeholder: 'any' });
  const filters = h('form', { class: 'filters', role: 'search' },
    h('label', { for: 'type-filter' }, 'Type'), select,
    h('label', { for: 'source-filter' }, 'Source'), srcInput,
    h('button', { type: 'submit', class: 'btn' }, 'Apply'));
  const apply = (ev) => {
    if (ev) ev.preventDefault();
    location.hash = routeWith(base, { type: select.value, source: srcInput.value.trim() });
  };
  filters.addEventListener('submit', apply);
  select.addEventListener('change', apply);

  const body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading events\u2026'));
  fill(main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/runs' }, 'Runs'), ' / ', h('a', { href: `#/runs/${enc(id)}` }, id), ' / events'),
    h('div', { class: 'pagehead' }, h('h1', null, 'Events')), filters, body);
  try {
    const res = await getJSON(routeWith(`/v1/runs/${enc(id)}/events`, { type, source, cursor, limit: '100' }), signal);
    const events = listOf(res, 'events');
    const next = nextOf(res);
    // One unit for every rate on the page, chosen for the page's pace.
    const unit = pageUnit(events.flatMap((e) => [perSecondOf(e.old_limit, e.old_window), perSecondOf(e.new_limit, e.new_window)]));
    const rows = events.map((e) => h('tr', { class: eventClass(e) },
      h('td', { class: 'num mono' }, fmtNum(e.seq)),
      h('td', { class: 'nowrap' }, timeEl(e.time)),
      // A narrow column breaks a type after its dot, not inside a word.
      h('td', null, h('span', { class: 'etype' }, e.type.split('.').flatMap((w, i) => (i ? ['.', h('wbr'), w] : [w])))),
      h('td', null, e.source_id || ''),
      h('td', { class: 'mono small break' }, e.item_key || ''),
      h('td', { class: 'num' }, e.attempt || ''),
      h('td', { class: 'small details' }, eventDetail(e, unit)),
      h('td', null, short(e.hash, 10))));
    const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' },
      cursor ? h('a', { href: routeWith(base, { type, source }), class: 'btn' }, '\u2190 First page') : null,
      next ? h('a', { href: routeWith(base, { type, source, cursor: next }), class: 'btn', id: 'events-next' }, 'Next page \u2192') : null,
      h('span', { class: 'muted' }, `${events.length} event${events.length === 1 ? '' : 's'} on this page`));
    fill(body, table(null, [{ label: 'Seq', num: true }, 'Time (UTC)', 'Type', 'Source', 'Item', { label: 'Att.', num: true }, 'Details', 'Hash'],
      rows, { id: 'events-table', class: 'events', empty: 'No events match.' }), pager);
  } catch (err) {
    fill(body, problemBox(err, 'Could not load events'));
  }
}

function eventClass(e) {
  if (e.type === 'throttle' || e.type === 'shed' || e.type === 'transport.error') return 'row-warn';
  if (e.type === 'breaker' && e.to === 'open') return 'row-fail';
  if (e.type === 'item.finished' && e.outcome === 'failed') return 'row-fail';
  return null;
}

// eventDetail lists the type-specific fields an event carries (EVENTS.md)
// as labelled values, skipping those that are empty; a JSON detail is read
// into labelled values too.
function eventDetail(e, unit) {
  const parts = [];
  const add = (k, v, cls) => { if (v !== undefined && v !== null && v !== '' && v !== 0 && v !== false) parts.push([k, v, cls]); };
  const dur = (v) => (v === undefined || v === null || v === 0 || v === '' ? undefined : fmtDuration(v));
  add('request', [e.method, e.path].filter(Boolean).join(' '), 'mono break');
  add('page', e.page);
  add('status', e.status);
  add('outcome', e.outcome);
  add('body error', e.body_error);
  add('bytes', e.bytes !== undefined && e.bytes !== 0 ? fmtNum(e.bytes) : undefined);
  add('latency', dur(e.latency));
  add('wait', dur(e.wait));
  add('actual', dur(e.actual));
  add('Retry-After', e.retry_after_raw);
  add('parsed', dur(e.retry_after));
  add('clamped', e.clamped ? 'yes' : undefined);
  add('backoff', dur(e.backoff));
  if (e.from || e.to) add('breaker', `${e.from || '?'} \u2192 ${e.to || '?'}`);
  add('failures', e.failures);
  add('threshold', e.threshold);
  add('cooldown', dur(e.cooldown));
  if (e.old_limit || e.new_limit) {
    add('limit', e.old_limit ? `${fmtRate(e.old_limit, e.old_window, unit)} \u2192 ${fmtRate(e.new_limit, e.new_window, unit)}` : fmtRate(e.new_limit, e.new_window, unit));
  }
  add('group', e.group);
  add('payload', e.payload_hash ? short(e.payload_hash, 12) : undefined);
  add(e.type === 'export.downloaded' || e.type === 'report.viewed' ? 'ledger head' : 'cause', e.cause);
  add('by', e.principal);
  for (const [k, v] of detailFields(e.detail, unit)) add(k, v);
  if (!parts.length) return '';
  return h('dl', { class: 'kv' }, parts.map(([k, v, cls]) => h('div', null, h('dt', null, k), ' ', h('dd', { class: cls || null }, v), ' ')));
}

// detailFields reads an event's Detail (JSON for run.started, snapshots,
// source and token changes, exports) as [label, value] pairs, nested
// objects flattened ("award fain"), each value as a person reads it: a
// limit and its window as one rate in the page's unit, durations and times
// in the UI's style, years without a separator, -1 (not known) as
// "unknown". A detail that is not a JSON object is one value.
export function detailFields(detail, unit) {
  if (!detail) return [];
  let v;
  try { v = JSON.parse(detail); } catch { return [['detail', detail]]; }
  if (v === null || typeof v !== 'object' || Array.isArray(v)) return [['detail', String(detail)]];
  const out = [];
  const walk = (obj, prefix) => {
    for (const [k, x] of Object.entries(obj)) {
      // "award": {"award_year": ...} reads "award year", not "award award year".
      const last = prefix.split(' ').pop();
      const own = prefix && k.startsWith(`${last}_`) ? k.slice(last.length + 1) : k;
      const label = (prefix ? `${prefix} ` : '') + own.replace(/_/g, ' ');
      if (x === null || x === '' || x === undefined) continue;
      // A limit and its window ("ceiling_limit", "ceiling_window") are one rate.
      const pair = /^(.*?)_?limit$/.exec(k);
      if (pair && typeof x === 'number') {
        const wkey = pair[1] ? `${pair[1]}_window` : 'window';
        if (x < 0) { out.push([label, 'unknown']); continue; }
        if (wkey in obj) { out.push([label.replace(/ ?limit$/, '') || 'limit', fmtRate(x, obj[wkey], unit)]); continue; }
      }
      if (/(^|_)window$/.test(k) && (`${k.replace(/_?window$/, '')}${k === 'window' ? 'limit' : '_limit'}` in obj)) continue;
      if (typeof x === 'object' && !Array.isArray(x)) walk(x, label);
      else if (Array.isArray(x)) out.push([label, x.map((y) => (typeof y === 'object' ? JSON.stringify(y) : String(y))).join(', ')]);
      else out.push([label, detailValue(k, x)]);
    }
  };
  walk(v, '');
  return out;
}

const goDuration = /^-?([0-9]+(\.[0-9]+)?(ns|us|\u00b5s|ms|s|m|h))+$/;
const rfc3339 = /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$/;

// detailValue shows one value of a detail as a person reads it.
function detailValue(key, x) {
  if (typeof x === 'string') {
    if (/^[0-9a-f]{40,}$/.test(x)) return short(x, 16);
    if (rfc3339.test(x)) return fmtTime(x);
    if (goDuration.test(x)) return fmtDuration(x);
    return x;
  }
  if (typeof x !== 'number') return String(x);
  if (x === -1) return 'unknown';
  if (/year/.test(key)) return String(x);
  if (/(window|cooldown|timeout|_ns)$/.test(key)) return fmtDuration(x);
  // A Unix time in nanoseconds (later than 1973) is a time.
  if (x > 1e17) return fmtTime(new Date(x / 1e6).toISOString());
  return fmtNum(x);
}

// cachedWords says where a cached item's copy came from: "copy 2h 5m old,
// fetched by run X at T".
function cachedWords(c) {
  const by = c.origin_run ? ['fetched by run ', h('a', { href: `#/runs/${enc(c.origin_run)}`, class: 'mono' }, c.origin_run)] : ['fetched'];
  return [`copy ${fmtDuration(c.age)} old, `, ...by, ` at ${fmtTime(c.fetched_at)}`];
}

// ---- #/runs/{id}/items --------------------------------------------------

export async function itemsPage(main, { hash, params: [id], signal }) {
  document.title = `Items of ${id} \u00b7 auditd`;
  const cursor = query(hash).get('cursor') || '';
  const base = `#/runs/${enc(id)}/items`;
  const body = h('div', { 'aria-live': 'polite' }, h('p', { class: 'muted' }, 'Loading items\u2026'));
  fill(main,
    h('p', { class: 'crumbs' }, h('a', { href: '#/runs' }, 'Runs'), ' / ', h('a', { href: `#/runs/${enc(id)}` }, id), ' / items'),
    h('div', { class: 'pagehead' }, h('h1', null, 'Items')), body);
  try {
    const res = await getJSON(routeWith(`/v1/runs/${enc(id)}/items`, { cursor, limit: '100' }), signal);
    const items = listOf(res, 'items');
    const next = nextOf(res);
    const rows = items.map((it) => {
      const r = it.result;
      const outcome = r ? r.outcome : 'pending';
      return h('tr', { class: outcome === 'failed' ? 'row-fail' : outcome === 'shed' ? 'row-warn' : null },
        h('td', { class: 'mono small' }, it.key),
        h('td', null, it.source),
        h('td', { class: 'mono small break' }, [it.method || 'GET', it.path].join(' ')),
        h('td', null, badge(outcome),
          r && r.reason ? h('div', { class: 'small' }, r.reason) : null,
          r && r.cached ? h('div', { class: 'small cached-copy' }, cachedWords(r.cached)) : null),
        h('td', { class: 'num' }, r ? fmtNum(r.attempts) : '\u2014'),
        h('td', { class: 'num' }, r && r.pages ? fmtNum(r.pages) : '\u2014'),
        h('td', { class: 'num' }, r && r.records ? fmtNum(r.records) : '\u2014',
          r && r.advertised > 0 && !r.count_matched ? h('div', { class: 'small warn-text' }, `the source said ${fmtNum(r.advertised)}`) : null),
        h('td', { class: 'num' }, r && r.bytes ? fmtNum(r.bytes) : '\u2014'),
        h('td', null, r && r.payload_hash ? short(r.payload_hash, 12) : '\u2014'));
    });
    const pager = h('nav', { class: 'pager', 'aria-label': 'Pages' },
      cursor ? h('a', { href: base, class: 'btn' }, '\u2190 First page') : null,
      next ? h('a', { href: routeWith(base, { cursor: next }), class: 'btn', id: 'items-next' }, 'Next page \u2192') : null,
      h('span', { class: 'muted' }, `${items.length} item${items.length === 1 ? '' : 's'} on this page`));
    fill(body, table(null, ['Key', 'Source', 'Request', 'Outcome', { label: 'Attempts', num: true }, { label: 'Pages', num: true },
      { label: 'Records', num: true }, { label: 'Bytes', num: true }, 'Payload SHA-256'], rows, { id: 'items-table', empty: 'No items.' }), pager);
  } catch (err) {
    fill(body, problemBox(err, 'Could not load items'));
  }
}
