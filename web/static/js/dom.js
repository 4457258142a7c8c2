// Small DOM and formatting helpers. Everything the UI shows goes through
// h() as text nodes, never innerHTML, so API data cannot inject markup.

// h builds an element: h('td', {class: 'num'}, 'text', child, [more]).
// Attributes whose value is null, undefined or false are skipped; on* keys
// attach listeners.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else if (k === 'dataset') Object.assign(el.dataset, v);
    else if (v === true) el.setAttribute(k, '');
    else el.setAttribute(k, String(v));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// clear empties el and fills it with children.
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

const dash = '\u2014';

// fmtTime shows a timestamp as UTC with milliseconds: 2026-11-29 18:55:47.123Z.
// Zero and missing times (Go's zero time too) show a dash.
export function fmtTime(v) {
  if (!v || String(v).startsWith('0001-01-01')) return dash;
  const d = new Date(v);
  if (Number.isNaN(d.getTime())) return String(v);
  return d.toISOString().replace('T', ' ');
}

// timeEl wraps fmtTime in a <time> with the machine-readable value.
export function timeEl(v) {
  const s = fmtTime(v);
  return s === dash ? dash : h('time', { datetime: new Date(v).toISOString() }, s);
}

// fmtRelative says how far from now a time is: "in 4m 10s", "12s ago".
export function fmtRelative(v, now = Date.now()) {
  if (!v || String(v).startsWith('0001-01-01')) return '';
  const ms = new Date(v).getTime() - now;
  if (Number.isNaN(ms)) return '';
  const s = fmtSeconds(Math.abs(ms) / 1000);
  return ms >= 0 ? `in ${s}` : `${s} ago`;
}

// fmtSeconds shows a number of seconds in the UI's one style: 250ms, 1.5s,
// 12s, 1m 30s, 2m, 1h, 3h 20m, 2d 4h.
export function fmtSeconds(sec) {
  if (sec === 0) return '0s';
  if (sec < 1) return `${+(sec * 1000).toFixed(sec < 0.01 ? 2 : 0)}ms`;
  if (sec < 60) return `${+sec.toFixed(sec < 10 ? 1 : 0)}s`;
  const d = Math.floor(sec / 86400), hr = Math.floor(sec % 86400 / 3600);
  const m = Math.floor(sec % 3600 / 60), s = Math.floor(sec % 60);
  if (d) return hr ? `${d}d ${hr}h` : `${d}d`;
  if (hr) return m ? `${hr}h ${m}m` : `${hr}h`;
  return s ? `${m}m ${s}s` : `${m}m`;
}

// fmtDuration shows a duration given as Go's JSON (integer nanoseconds) or
// as a Go duration string ("1m30s"), in fmtSeconds' style; a string that is
// neither is shown as it is.
export function fmtDuration(v) {
  if (v === null || v === undefined || v === '') return dash;
  const sec = typeof v === 'string' ? seconds(v) : v / 1e9;
  return Number.isNaN(sec) ? String(v) : fmtSeconds(sec);
}

// perWindow names a window for a rate: "second", "minute", "5 minutes",
// "hour", "90 seconds".
export function perWindow(sec) {
  if (!(sec > 0)) return '';
  for (const [unit, name] of [[86400, 'day'], [3600, 'hour'], [60, 'minute'], [1, 'second']]) {
    const n = sec / unit;
    if (n >= 1 && Math.abs(n - Math.round(n)) < 1e-9) return n === 1 ? name : `${Math.round(n)} ${name}s`;
  }
  return sec < 1 ? `${+(sec * 1000).toFixed(0)} milliseconds` : `${+sec.toFixed(3)} seconds`;
}

// rateUnits are the units a page may show rates in.
export const perSecond = { seconds: 1, name: 'second' };
export const perMinute = { seconds: 60, name: 'minute' };

// perSecondOf is a limit per window (a Go duration) as a rate per second;
// NaN when either is missing.
export function perSecondOf(limit, window) {
  const w = typeof window === 'number' ? window / 1e9 : seconds(window);
  return limit > 0 && w > 0 ? limit / w : NaN;
}

// pageUnit chooses the one unit a page shows its rates in, for the page's
// pace: per minute when every rate on it is under one a second, otherwise
// per second.
export function pageUnit(rates) {
  const known = rates.filter((r) => r > 0);
  return known.length && known.every((r) => r < 1) ? perMinute : perSecond;
}

// fmtRate shows a limit per window in the page's unit: "20 per minute",
// "0.33 per second", "8 per second". Missing limits show a dash.
export function fmtRate(limit, window, unit = perSecond) {
  const r = perSecondOf(limit, window);
  if (Number.isNaN(r)) return limit ? fmtNum(limit) : dash;
  const v = r * unit.seconds;
  const n = Number.isInteger(v) || v >= 100 ? nf.format(Math.round(v)) : String(+v.toFixed(v < 1 ? 2 : 1));
  return `${n} per ${unit.name}`;
}

// fmtCount shows a limit as a count in its own window, for comparing with
// a count of requests in a window: "20 in any minute", "8 in any second".
export function fmtCount(limit, window) {
  if (!limit) return dash;
  const w = perWindow(typeof window === 'number' ? window / 1e9 : seconds(window));
  return w ? `${fmtNum(limit)} in any ${w}` : fmtNum(limit);
}

const nf = new Intl.NumberFormat('en-US');

// fmtNum groups digits; missing numbers show a dash.
export function fmtNum(v) {
  if (v === null || v === undefined || v === '') return dash;
  return typeof v === 'number' ? nf.format(v) : String(v);
}

// fmtSigned shows a difference with its sign: +3, \u22121 (a minus sign,
// not a hyphen), 0.
export function fmtSigned(v) {
  if (typeof v !== 'number') return fmtNum(v);
  if (v < 0) return `\u2212${nf.format(-v)}`;
  return v > 0 ? `+${nf.format(v)}` : nf.format(v);
}

// short abbreviates a long hash for a table cell; the full value goes in
// the title so it can still be read and copied.
export function short(hash, n = 12) {
  if (!hash) return dash;
  const s = String(hash);
  return s.length <= n ? s : h('span', { class: 'mono', title: s }, s.slice(0, n) + '\u2026');
}

// badge shows a status word with a class per value, for the colour; the word
// itself carries the meaning so colour is never the only signal.
export function badge(value, label) {
  const v = value ? String(value) : 'unknown';
  return h('span', { class: `badge badge-${v.replace(/[^a-z0-9]+/gi, '-').toLowerCase()}` }, label || v.replace('_', ' '));
}

// table builds a table from column heads and rows of cells; a column may be
// {label, num: true} for right-aligned numbers.
export function table(caption, cols, rows, opts = {}) {
  const head = h('tr', null, cols.map((c) => {
    const col = typeof c === 'string' ? { label: c } : c;
    return h('th', { scope: 'col', class: col.num ? 'num' : null }, col.label);
  }));
  const body = rows.length
    ? rows
    : [h('tr', null, h('td', { colspan: cols.length, class: 'empty' }, opts.empty || 'Nothing to show.'))];
  return h('table', { class: `grid ${opts.class || ''}`.trim(), id: opts.id },
    caption ? h('caption', null, caption) : null,
    h('thead', null, head),
    h('tbody', null, body));
}

// dl builds a definition list from [term, value] pairs, skipping null values.
export function dl(pairs, cls = 'facts') {
  return h('dl', { class: cls }, pairs.filter((p) => p && p[1] !== null && p[1] !== undefined)
    .map(([k, v]) => h('div', null, h('dt', null, k), h('dd', null, v === '' ? dash : v))));
}

// query parses the part of a hash route after "?".
export function query(hash) {
  const i = hash.indexOf('?');
  return new URLSearchParams(i < 0 ? '' : hash.slice(i + 1));
}

// routeWith returns base with the non-empty params as its query.
export function routeWith(base, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  const s = q.toString();
  return s ? `${base}?${s}` : base;
}

// problemBox shows a failed call plainly: what failed, the API's words, the
// field at fault and the request id to quote to an operator.
export function problemBox(err, what) {
  if (err && err.name === 'AbortError') return null;
  const status = err && err.status !== undefined ? err.status : 0;
  const title = (err && err.title) || 'Something went wrong';
  return h('div', { class: 'problem', role: 'alert' },
    h('p', { class: 'problem-title' }, what ? `${what}: ` : '', title, status ? ` (HTTP ${status})` : ''),
    err && err.detail && err.detail !== title ? h('p', null, err.detail) : null,
    err && !err.detail && !err.title && err.message ? h('p', null, err.message) : null,
    err && err.field ? h('p', null, 'Field: ', h('code', null, err.field)) : null,
    err && err.requestId ? h('p', { class: 'muted' }, 'Request id: ', h('code', { class: 'reqid' }, err.requestId)) : null);
}

// seconds reads a duration as Go's JSON number of nanoseconds or as a Go
// duration string ("1m30s", "250ms"); NaN when it is neither.
export function seconds(v) {
  if (typeof v === 'number') return v / 1e9;
  if (typeof v !== 'string' || !v) return NaN;
  const units = { ns: 1e-9, us: 1e-6, '\u00b5s': 1e-6, ms: 1e-3, s: 1, m: 60, h: 3600 };
  let total = 0;
  let rest = v;
  const re = /^([0-9]+(?:\.[0-9]+)?)(ns|us|\u00b5s|ms|s|m|h)/;
  while (rest) {
    const m = re.exec(rest);
    if (!m) return NaN;
    total += parseFloat(m[1]) * units[m[2]];
    rest = rest.slice(m[0].length);
  }
  return total;
}
