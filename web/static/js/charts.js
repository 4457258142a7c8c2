// Charts of the timelines the API adds up from the ledger (GET
// /v1/runs/{id}/timeline and /v1/sources/{id}/timeline), drawn with uPlot
// (web/static/vendor/uplot, MIT licence), which index.html loads as the
// global uPlot. Every chart on the page is kept in window.auditdCharts under
// its name ("timeline:<source>", "limits:<source>"), so that a test can read
// the very data uPlot was given; the figure gets data-rendered once drawn.
import { h, fmtNum, fmtSeconds, perWindow, seconds } from './dom.js';

const charts = (window.auditdCharts = window.auditdCharts || {});

const colors = {
  sent: '#1f4e79',
  sentFill: 'rgba(31, 78, 121, 0.30)',
  limit: '#1e6b3a',
  ceiling: '#5b6570',
  refused: '#d0021b',
  failed: '#6a1b9a',
  cached: '#00838f',
  waits: '#b06d00',
  open: 'rgba(163, 22, 27, 0.13)',
  halfOpen: 'rgba(176, 109, 0, 0.13)',
};

const secs = (t) => Date.parse(t) / 1000;

// pace is the width, in seconds, of the buckets a chart of these sources
// is drawn in: the API's bucket, widened to as many of them as cover the
// longest window in force. A bucket at least a window wide was allowed a
// whole number of windows' limits, so a source that kept its limit never
// has a bar above its allowance: a slow source, 20 a minute, is drawn per
// minute, not per second.
export function pace(tl, sources) {
  const b = tl.bucket_seconds;
  if (!(b > 0)) return b;
  let w = 0;
  for (const st of sources) {
    for (const x of st.buckets) {
      const ws = seconds(x.window);
      if (ws > w) w = ws;
    }
  }
  return b * Math.max(1, Math.ceil(w / b - 1e-9));
}

// allowance is the most a limit of limit per window allows in span seconds:
// its limit for each window the span touches (a sliding window admits at
// most limit in any window-long stretch). Burst on top is not counted.
function allowance(limit, window, span) {
  const w = seconds(window);
  if (!limit || !(w > 0)) return null;
  return limit * Math.max(1, Math.ceil(span / w - 1e-9));
}

// timelineData is the data of a source's timeline chart in buckets of width
// seconds (pace): x (bucket starts, in seconds, and the end of the last
// bucket, a whole bucket after its start); the requests sent in each bucket and what the limit in force
// allowed in it (the most generous limit in force during it); and the
// bucket's waits, items served from cache, 5xx answers and 429 refusals,
// null where there are none, so no marker is drawn. The series are in the
// order uPlot draws them: refusals last, on top.
export function timelineData(tl, st, width) {
  const k = Math.max(1, Math.round(width / tl.bucket_seconds));
  const end = secs(tl.to);
  const x = [], sent = [], allowed = [], waits = [], cached = [], failed = [], refused = [];
  for (let i = 0; i < st.buckets.length; i += k) {
    const group = st.buckets.slice(i, i + k);
    const from = secs(group[0].start);
    const span = Math.min(width, end - from);
    let n = 0, w = 0, c = 0, f = 0, r = 0, a = null;
    for (const b of group) {
      n += b.dispatches;
      w += Object.values(b.waits || {}).reduce((t, v) => t + v.count, 0);
      c += b.cache_served || 0;
      f += b.status_5xx || 0;
      r += b.throttles || 0;
      const ab = allowance(b.limit, b.window, span);
      if (ab !== null && (a === null || ab > a)) a = ab;
    }
    x.push(from);
    sent.push(n);
    allowed.push(a);
    waits.push(w || null);
    cached.push(c || null);
    failed.push(f || null);
    refused.push(r || null);
  }
  // One more point at the end of the last bucket, so the allowance's step
  // covers it and its bar is as wide as the others (uPlot sizes bars by
  // the narrowest gap between points).
  x.push(x.length ? Math.max(end, x[x.length - 1] + width) : end);
  sent.push(null);
  allowed.push(allowed.length ? allowed[allowed.length - 1] : null);
  waits.push(null);
  cached.push(null);
  failed.push(null);
  refused.push(null);
  return [x, sent, allowed, waits, cached, failed, refused];
}

// limitData is the data of a source's learned-limit chart: the limit in
// force from the start of the timeline, a step at every registry.changed,
// to its end; the changes are marked.
export function limitData(tl, st, unit, ceiling) {
  ceiling = ceiling === null || ceiling === undefined ? null : ceiling * unit.seconds;
  const rate = (limit, window) => (limit && window ? (limit / seconds(window)) * unit.seconds : null);
  const first = st.buckets.find((b) => b.limit_per_second);
  const changes = st.limit_changes || [];
  let cur = changes.length ? rate(changes[0].old_limit, changes[0].old_window) : first ? first.limit_per_second * unit.seconds : null;
  const x = [secs(tl.from)], limit = [cur], marks = [null];
  for (const c of changes) {
    cur = rate(c.new_limit, c.new_window);
    x.push(secs(c.time));
    limit.push(cur);
    marks.push(cur);
  }
  x.push(secs(tl.to));
  limit.push(cur);
  marks.push(null);
  return [x, limit, x.map(() => ceiling), marks];
}

function fmtValue(v, digits = 2) {
  if (v === null || v === undefined) return '\u2013';
  return v >= 100 || Number.isInteger(v) ? fmtNum(Math.round(v)) : String(+v.toFixed(digits));
}

const utc = (ts) => uPlot.tzDate(new Date(ts * 1000), 'Etc/UTC');

const two = (n) => String(n).padStart(2, '0');

// timeIncrs are the tick spacings of the time axis, in seconds: none finer
// than a bucket, so no two ticks read the same.
function timeIncrs(bucket) {
  const all = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800];
  return all.filter((x) => x >= Math.min(1, bucket) - 1e-9);
}

// timeSpace is the least room, in CSS pixels, between two ticks of the time
// axis: wider than its widest label ("18:52:20" over "2026-11-29"), so that
// labels never run into each other.
const timeSpace = 96;

// timeTicks labels the time axis in UTC on the 24-hour clock, as every
// time in the UI is: 18:40, or 18:40:30 when ticks are under a minute
// apart; the date under the first tick of each day.
function timeTicks(u, splits, axisIdx, space, incr) {
  return splits.map((ts, i) => {
    const d = new Date(Math.round(ts * 1000));
    const day = `${d.getUTCFullYear()}-${two(d.getUTCMonth() + 1)}-${two(d.getUTCDate())}`;
    if (incr >= 86400) return day;
    let hm = `${two(d.getUTCHours())}:${two(d.getUTCMinutes())}`;
    if (incr < 60) hm += `:${two(d.getUTCSeconds())}`;
    if (incr < 1) hm += `.${String(d.getUTCMilliseconds()).padStart(3, '0').slice(0, 1)}`;
    const prev = i > 0 ? new Date(splits[i - 1] * 1000) : null;
    return !prev || prev.getUTCDate() !== d.getUTCDate() ? `${hm}\n${day}` : hm;
  });
}

// shadeSpans draws the breaker's open and half-open spans under the series.
function shadeSpans(spans, end) {
  return (u) => {
    const { ctx, bbox } = u;
    ctx.save();
    for (const sp of spans) {
      const x0 = Math.max(bbox.left, u.valToPos(secs(sp.from), 'x', true));
      const x1 = Math.min(bbox.left + bbox.width, u.valToPos(sp.to ? secs(sp.to) : end, 'x', true));
      if (x1 <= x0) continue;
      ctx.fillStyle = sp.state === 'open' ? colors.open : colors.halfOpen;
      ctx.fillRect(x0, bbox.top, Math.max(1, x1 - x0), bbox.height);
    }
    ctx.restore();
  };
}

// Chart is one uPlot chart in a figure; mount draws it once the figure is
// in the document (uPlot measures its width from there).
class Chart {
  constructor(name, fig, plot, opts, data) {
    Object.assign(this, { name, fig, plot, opts, data, u: null });
  }

  mount() {
    const width = Math.max(320, this.plot.clientWidth || 900);
    this.u = new uPlot({ ...this.opts, width }, this.data, this.plot);
    charts[this.name] = this.u;
    this.fig.dataset.rendered = 'true';
  }

  resize() {
    if (this.u && this.plot.isConnected) this.u.setSize({ width: Math.max(320, this.plot.clientWidth), height: this.opts.height });
  }

  destroy() {
    if (!this.u) return;
    if (charts[this.name] === this.u) delete charts[this.name];
    this.u.destroy();
    this.u = null;
  }
}

// ChartSet holds the charts of a page: mount after the figures are placed,
// resize with the window, destroy when the page goes.
export class ChartSet {
  constructor() {
    this.list = [];
    this.onResize = () => this.list.forEach((c) => c.resize());
    window.addEventListener('resize', this.onResize);
  }

  add(chart) { this.list.push(chart); return chart.fig; }

  mount() { this.list.forEach((c) => { if (!c.u) c.mount(); }); }

  clear() { this.list.forEach((c) => c.destroy()); this.list = []; }

  destroy() { this.clear(); window.removeEventListener('resize', this.onResize); }
}

// bucketWords names a bucket width: "1 second", "15 seconds", "5 minutes".
export function bucketWords(sec) {
  const w = perWindow(sec);
  return /^[0-9]/.test(w) ? w : `1 ${w}`;
}

// sourceSummary says in words what a source's timeline shows.
function sourceSummary(st) {
  let sent = 0, refused = 0, failed = 0, waits = 0, waited = 0, shed = 0, cached = 0;
  for (const b of st.buckets) {
    sent += b.dispatches;
    failed += b.status_5xx || 0;
    refused += b.throttles;
    shed += b.shed;
    cached += b.cache_served;
    for (const w of Object.values(b.waits || {})) { waits += w.count; waited += w.seconds; }
  }
  const opens = st.breaker_spans.filter((s) => s.state === 'open').length;
  const parts = [`${fmtNum(sent)} request${sent === 1 ? '' : 's'} sent`,
    `${fmtNum(refused)} refused (429)`,
    `${fmtNum(waits)} wait${waits === 1 ? '' : 's'}${waits ? ` (${fmtSeconds(waited)} in all)` : ''}`];
  if (failed) parts.push(`${fmtNum(failed)} 5xx answer${failed === 1 ? '' : 's'}`);
  if (shed) parts.push(`${fmtNum(shed)} shed`);
  if (cached) parts.push(`${fmtNum(cached)} served from cache`);
  if (opens) parts.push(`breaker open ${opens === 1 ? 'once' : `${opens} times`}`);
  return parts.join(' \u00b7 ');
}

function keyItem(cls, label) {
  return h('span', { class: 'chart-key-item' }, h('span', { class: `swatch ${cls}` }), label);
}

// timelineChart is a source's requests over time against what the limit in
// force allowed, in buckets of opts.width seconds (pace; the API's bucket
// when not given), with its waits, cache answers, 5xx answers and 429
// refusals marked (refusals on top) and its breaker spans shaded; rates in
// the caption are per opts.unit.
export function timelineChart(tl, st, opts = {}) {
  const width = opts.width || tl.bucket_seconds;
  const name = `timeline:${st.source}`;
  const data = timelineData(tl, st, width);
  const bucket = bucketWords(width);
  const spans = st.breaker_spans || [];
  const plot = h('div', { class: 'chart-plot' });
  const fig = h('figure', { class: 'chart', dataset: { chart: name, bucketSeconds: width } },
    h('figcaption', null,
      h('span', { class: 'chart-title' }, opts.title || st.source),
      h('span', { class: 'chart-sub muted' }, sourceSummary(st))),
    plot,
    h('p', { class: 'chart-key small muted' },
      `Bars: requests sent in each ${bucket}. Step line: the most the limit in force allowed in that ${bucket}, its limit for each window the bucket spans (burst not included). `,
      'Markers (right axis, count per bucket): ',
      keyItem('swatch-refused', '429 refusals'), ' ', keyItem('swatch-failed', '5xx answers'), ' ',
      keyItem('swatch-cached', 'served from cache'), ' ', keyItem('swatch-waits', 'waits'), '.',
      spans.length ? [' Shaded: ', keyItem('swatch-open', 'breaker open'), ' ', keyItem('swatch-half', 'half-open'), '.'] : null));
  // Markers of the same count in the same bucket are drawn as rings inside
  // rings, the widest first: each stays visible, and the refusal, drawn
  // last and filled, is always on top.
  const marker = (label, color, size, filled) => ({
    label, scale: 'n', stroke: color, fill: filled ? color : 'rgba(255,255,255,0)', width: 2,
    paths: () => null, points: { show: true, size, width: 2, stroke: color, fill: filled ? color : 'rgba(255,255,255,0)' },
    value: (u, v) => fmtValue(v ?? 0),
  });
  const chartOpts = {
    height: opts.height || 230,
    tzDate: utc,
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    scales: {
      x: { time: true },
      count: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.12)] },
      n: { range: (u, lo, hi) => [0, Math.max(4, Math.ceil(hi * 1.15))] },
    },
    series: [
      { label: 'Time (UTC)', value: '{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}' },
      { label: 'Requests sent', scale: 'count', stroke: colors.sent, fill: colors.sentFill, width: 1,
        paths: uPlot.paths.bars({ size: [0.9, Infinity], align: 1 }), points: { show: false }, value: (u, v) => fmtValue(v) },
      { label: 'Allowed by the limit in force', scale: 'count', stroke: colors.limit, width: 2,
        paths: uPlot.paths.stepped({ align: 1 }), points: { show: false }, value: (u, v) => fmtValue(v) },
      marker('Waits', colors.waits, 19, false),
      marker('Served from cache', colors.cached, 14, false),
      marker('5xx answers', colors.failed, 10, true),
      marker('429 refusals', colors.refused, 7, true),
    ],
    axes: [
      { stroke: '#5b6570', grid: { stroke: '#eef1f4' }, values: timeTicks, incrs: timeIncrs(width), space: timeSpace },
      { scale: 'count', label: `requests per ${bucketWords(width)}`, stroke: '#5b6570', size: 56, grid: { stroke: '#eef1f4' },
        values: (u, ticks) => ticks.map((v) => fmtValue(v, 1)) },
      { scale: 'n', side: 1, label: 'markers: count per bucket', stroke: '#5b6570', size: 56, grid: { show: false },
        values: (u, ticks) => ticks.map((v) => (Number.isInteger(v) ? fmtNum(v) : '')) },
    ],
    hooks: { drawClear: [shadeSpans(spans, secs(tl.to))] },
  };
  return new Chart(name, fig, plot, chartOpts, data);
}

// limitChart is a source's learned-limit history: the limit in force as a
// step at each change, the configured ceiling dashed.
export function limitChart(tl, st, ceiling, unit) {
  const name = `limits:${st.source}`;
  const data = limitData(tl, st, unit, ceiling);
  const plot = h('div', { class: 'chart-plot' });
  const n = (st.limit_changes || []).length;
  const fig = h('figure', { class: 'chart', dataset: { chart: name, unitSeconds: unit.seconds } },
    h('figcaption', null,
      h('span', { class: 'chart-title' }, 'Learned limit'),
      h('span', { class: 'chart-sub muted' }, n ? `${fmtNum(n)} change${n === 1 ? '' : 's'} in this range` : 'no change in this range')),
    plot,
    h('p', { class: 'chart-key small muted' },
      `Line: the limit in force, per ${unit.name}; markers: a change. Dashed: the configured ceiling.`));
  const chartOpts = {
    height: 180,
    tzDate: utc,
    cursor: { drag: { x: false, y: false } },
    scales: { x: { time: true }, rate: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.15)] } },
    series: [
      { label: 'Time (UTC)', value: '{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}' },
      { label: `Limit in force per ${unit.name}`, scale: 'rate', stroke: colors.limit, width: 2,
        paths: uPlot.paths.stepped({ align: 1 }), points: { show: false }, value: (u, v) => fmtValue(v) },
      { label: `Ceiling per ${unit.name}`, scale: 'rate', stroke: colors.ceiling, width: 1, dash: [6, 4],
        points: { show: false }, value: (u, v) => fmtValue(v) },
      { label: 'Change', scale: 'rate', stroke: colors.limit, fill: '#ffffff', width: 2,
        paths: () => null, points: { show: true, size: 9 }, value: (u, v) => fmtValue(v) },
    ],
    axes: [
      { stroke: '#5b6570', grid: { stroke: '#eef1f4' }, values: timeTicks, incrs: timeIncrs(tl.bucket_seconds), space: timeSpace },
      { scale: 'rate', label: `per ${unit.name}`, stroke: '#5b6570', size: 56, grid: { stroke: '#eef1f4' },
        values: (u, ticks) => ticks.map((v) => fmtValue(v, 1)) },
    ],
  };
  return new Chart(name, fig, plot, chartOpts, data);
}
