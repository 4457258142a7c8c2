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
  refused: '#a3161b',
  waits: '#b06d00',
  open: 'rgba(163, 22, 27, 0.13)',
  halfOpen: 'rgba(176, 109, 0, 0.13)',
};

const secs = (t) => Date.parse(t) / 1000;

// rateUnit picks the window a source's rates are shown per: a second,
// unless every rate of its timeline is under one a second, then a minute.
export function rateUnit(tl, st) {
  let top = 0;
  for (const b of st.buckets) top = Math.max(top, b.limit_per_second || 0, b.dispatches / tl.bucket_seconds);
  return top > 0 && top < 1 ? { seconds: 60, name: 'minute' } : { seconds: 1, name: 'second' };
}

// timelineData is the data of a source's timeline chart: x (bucket starts,
// in seconds, and the end of the last bucket), requests sent and the limit
// in force per unit, and the refusals and waits of each bucket (null where
// there are none, so no marker is drawn).
export function timelineData(tl, st, unit) {
  const per = unit.seconds / tl.bucket_seconds;
  const x = [], sent = [], limit = [], refused = [], waits = [];
  for (const b of st.buckets) {
    x.push(secs(b.start));
    sent.push(b.dispatches * per);
    limit.push(b.limit_per_second ? b.limit_per_second * unit.seconds : null);
    refused.push(b.throttles || null);
    const w = Object.values(b.waits || {}).reduce((n, v) => n + v.count, 0);
    waits.push(w || null);
  }
  // One more point at the end, so the limit's step covers the last bucket.
  x.push(secs(tl.to));
  sent.push(null);
  limit.push(limit.length ? limit[limit.length - 1] : null);
  refused.push(null);
  waits.push(null);
  return [x, sent, limit, refused, waits];
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
  let sent = 0, refused = 0, waits = 0, waited = 0, shed = 0, cached = 0;
  for (const b of st.buckets) {
    sent += b.dispatches;
    refused += b.throttles;
    shed += b.shed;
    cached += b.cache_served;
    for (const w of Object.values(b.waits || {})) { waits += w.count; waited += w.seconds; }
  }
  const opens = st.breaker_spans.filter((s) => s.state === 'open').length;
  const parts = [`${fmtNum(sent)} request${sent === 1 ? '' : 's'} sent`,
    `${fmtNum(refused)} refused (429)`,
    `${fmtNum(waits)} wait${waits === 1 ? '' : 's'}${waits ? ` (${fmtSeconds(waited)} in all)` : ''}`];
  if (shed) parts.push(`${fmtNum(shed)} shed`);
  if (cached) parts.push(`${fmtNum(cached)} served from cache`);
  if (opens) parts.push(`breaker open ${opens === 1 ? 'once' : `${opens} times`}`);
  return parts.join(' \u00b7 ');
}

function keyItem(cls, label) {
  return h('span', { class: 'chart-key-item' }, h('span', { class: `swatch ${cls}` }), label);
}

// timelineChart is a source's requests over time against the limit in
// force, with its refusals and waits marked and its breaker spans shaded.
export function timelineChart(tl, st, opts = {}) {
  const unit = rateUnit(tl, st);
  const name = `timeline:${st.source}`;
  const data = timelineData(tl, st, unit);
  const bucket = bucketWords(tl.bucket_seconds);
  const spans = st.breaker_spans || [];
  const plot = h('div', { class: 'chart-plot' });
  const fig = h('figure', { class: 'chart', dataset: { chart: name, unitSeconds: unit.seconds } },
    h('figcaption', null,
      h('span', { class: 'chart-title' }, opts.title || st.source),
      h('span', { class: 'chart-sub muted' }, sourceSummary(st))),
    plot,
    h('p', { class: 'chart-key small muted' },
      `Bars: requests sent, per ${unit.name}, in buckets of ${bucket}. Line: the limit in force, per ${unit.name}. `,
      `Markers (right axis, count per bucket): 429 refusals and waits.`,
      spans.length ? [' Shaded: ', keyItem('swatch-open', 'breaker open'), ' ', keyItem('swatch-half', 'half-open'), '.'] : null));
  const chartOpts = {
    height: opts.height || 230,
    tzDate: utc,
    cursor: { drag: { x: false, y: false } },
    legend: { live: true },
    scales: {
      x: { time: true },
      rate: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.12)] },
      n: { range: (u, lo, hi) => [0, Math.max(4, Math.ceil(hi * 1.15))] },
    },
    series: [
      { label: 'Time (UTC)', value: '{YYYY}-{MM}-{DD} {HH}:{mm}:{ss}' },
      { label: `Requests sent per ${unit.name}`, scale: 'rate', stroke: colors.sent, fill: colors.sentFill, width: 1,
        paths: uPlot.paths.bars({ size: [0.9, Infinity], align: 1 }), points: { show: false }, value: (u, v) => fmtValue(v) },
      { label: `Limit in force per ${unit.name}`, scale: 'rate', stroke: colors.limit, width: 2,
        paths: uPlot.paths.stepped({ align: 1 }), points: { show: false }, value: (u, v) => fmtValue(v) },
      { label: '429 refusals', scale: 'n', stroke: colors.refused, fill: colors.refused, width: 1,
        paths: () => null, points: { show: true, size: 9 }, value: (u, v) => fmtValue(v ?? 0) },
      { label: 'Waits', scale: 'n', stroke: colors.waits, fill: '#ffffff', width: 2,
        paths: () => null, points: { show: true, size: 9 }, value: (u, v) => fmtValue(v ?? 0) },
    ],
    axes: [
      { stroke: '#5b6570', grid: { stroke: '#eef1f4' }, values: timeTicks, incrs: timeIncrs(tl.bucket_seconds) },
      { scale: 'rate', label: `requests per ${unit.name}`, stroke: '#5b6570', size: 56, grid: { stroke: '#eef1f4' },
        values: (u, ticks) => ticks.map((v) => fmtValue(v, 1)) },
      { scale: 'n', side: 1, label: '429s, waits per bucket', stroke: '#5b6570', size: 56, grid: { show: false },
        values: (u, ticks) => ticks.map((v) => (Number.isInteger(v) ? fmtNum(v) : '')) },
    ],
    hooks: { drawClear: [shadeSpans(spans, secs(tl.to))] },
  };
  return new Chart(name, fig, plot, chartOpts, data);
}

// limitChart is a source's learned-limit history: the limit in force as a
// step at each change, the configured ceiling dashed.
export function limitChart(tl, st, ceiling) {
  const unit = rateUnit(tl, st);
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
      { stroke: '#5b6570', grid: { stroke: '#eef1f4' }, values: timeTicks, incrs: timeIncrs(tl.bucket_seconds) },
      { scale: 'rate', label: `per ${unit.name}`, stroke: '#5b6570', size: 56, grid: { stroke: '#eef1f4' },
        values: (u, ticks) => ticks.map((v) => fmtValue(v, 1)) },
    ],
  };
  return new Chart(name, fig, plot, chartOpts, data);
}
