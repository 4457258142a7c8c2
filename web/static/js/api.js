// The one place the UI talks to the API: the bearer token, problem+json
// errors and authenticated downloads.

const tokenKey = 'auditd.token';

// Tokens live in sessionStorage: they end with the tab and never reach
// localStorage or a cookie.
export const token = {
  get: () => sessionStorage.getItem(tokenKey) || '',
  set: (t) => sessionStorage.setItem(tokenKey, t),
  clear: () => sessionStorage.removeItem(tokenKey),
};

// ApiError is a failed call, carrying the RFC 9457 problem fields the API
// sent (or what could be made of a response that was not a problem).
export class ApiError extends Error {
  constructor(p) {
    super(p.detail || p.title || `HTTP ${p.status}`);
    this.status = p.status;
    this.title = p.title || '';
    this.detail = p.detail || '';
    this.field = p.field || '';
    this.type = p.type || '';
    this.requestId = p.request_id || '';
  }
}

// onUnauthorized is called when a call gets a 401; app.js points it at the
// sign-in page.
let onUnauthorized = () => {};
export function setUnauthorizedHandler(fn) { onUnauthorized = fn; }

async function send(path, accept, signal, signingIn = false) {
  const headers = { Accept: accept };
  const t = token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  let res;
  try {
    res = await fetch(path, { headers, signal, cache: 'no-store', credentials: 'omit' });
  } catch (e) {
    if (e.name === 'AbortError') throw e;
    throw new ApiError({ status: 0, title: 'The API could not be reached', detail: String(e.message || e) });
  }
  if (res.ok) return res;
  const err = await problem(res);
  if (res.status === 401) {
    token.clear();
    if (!signingIn) onUnauthorized(err);
  }
  throw err;
}

async function problem(res) {
  const p = { status: res.status, title: res.statusText, request_id: res.headers.get('X-Request-Id') || '' };
  const ct = res.headers.get('Content-Type') || '';
  try {
    if (ct.includes('json')) {
      const body = await res.json();
      for (const k of ['type', 'title', 'detail', 'field', 'request_id']) if (body[k]) p[k] = body[k];
      if (body.status) p.status = body.status;
    } else {
      const text = (await res.text()).trim();
      if (text) p.detail = text.slice(0, 500);
    }
  } catch { /* an unreadable body leaves the status line */ }
  return new ApiError(p);
}

// getJSON fetches path and parses its JSON body.
export async function getJSON(path, signal) {
  const res = await send(path, 'application/json', signal);
  return res.json();
}

// checkToken makes one cheap call with the token just stored; a 401 here is
// the sign-in form's to show, not a reason to leave it.
export async function checkToken() {
  await send('/v1/runs?limit=1', 'application/json', undefined, true);
}

// getText fetches path as text (checkpoint notes, keys).
export async function getText(path, signal) {
  const res = await send(path, 'text/plain', signal);
  return res.text();
}

// download fetches path with the token and saves the body under the name
// the server gives in Content-Disposition, else fallback.
export async function download(path, fallback) {
  const res = await send(path, '*/*');
  const blob = await res.blob();
  const name = filename(res.headers.get('Content-Disposition')) || fallback;
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  a.hidden = true;
  document.body.appendChild(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 30000);
  return { name, size: blob.size };
}

function filename(cd) {
  if (!cd) return '';
  const star = /filename\*\s*=\s*UTF-8''([^;]+)/i.exec(cd);
  if (star) { try { return safeName(decodeURIComponent(star[1])); } catch { /* fall through */ } }
  const plain = /filename\s*=\s*"?([^";]+)"?/i.exec(cd);
  return plain ? safeName(plain[1]) : '';
}

function safeName(s) { return s.replace(/[\\/\0-\x1f]/g, '_').trim(); }

// enc escapes one path segment.
export const enc = encodeURIComponent;
