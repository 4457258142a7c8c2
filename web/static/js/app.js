// Entry module: hash routing, sign-in and sign-out. Each page is a function
// render(main, route) that may return a cleanup (timers, pending fetches),
// called when the user leaves the page.
import { token, checkToken, setUnauthorizedHandler } from './api.js';
import { h, fill, problemBox } from './dom.js';
import { runsPage, runPage, eventsPage, itemsPage } from './runs.js';
import { sourcesPage, sourcePage } from './sources.js';
import { ledgerPage } from './ledger.js';

const main = document.getElementById('main');
const nav = document.getElementById('nav');
const signout = document.getElementById('signout');

const routes = [
  [/^#\/runs\/([^/?]+)\/events$/, 'runs', eventsPage],
  [/^#\/runs\/([^/?]+)\/items$/, 'runs', itemsPage],
  [/^#\/runs\/([^/?]+)$/, 'runs', runPage],
  [/^#\/runs$/, 'runs', runsPage],
  [/^#\/sources\/([^/?]+)$/, 'sources', sourcePage],
  [/^#\/sources$/, 'sources', sourcesPage],
  [/^#\/ledger$/, 'ledger', ledgerPage],
];

let cleanup = null;
let flash = '';

function route() {
  if (cleanup) { cleanup(); cleanup = null; }
  const hash = location.hash || '#/runs';
  const path = hash.split('?')[0];
  if (!token.get() || path === '#/signin') {
    showSignIn();
    return;
  }
  nav.hidden = false;
  signout.hidden = false;
  // A run id (a ULID) reads the same in either case; its pages show it in
  // capitals, as runs are stored and the API answers them.
  const canon = path.replace(/^(#\/runs\/)([0-9A-HJKMNP-TV-Za-hjkmnp-tv-z]{26})(?=\/|$)/, (_, pre, id) => pre + id.toUpperCase());
  if (canon !== path) {
    location.replace(canon + hash.slice(path.length));
    return;
  }
  for (const [re, section, page] of routes) {
    const m = re.exec(path);
    if (!m) continue;
    for (const a of nav.querySelectorAll('a')) {
      if (a.dataset.nav === section) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    const ctrl = new AbortController();
    const params = m.slice(1).map(decodeURIComponent);
    const done = page(main, { hash, params, signal: ctrl.signal });
    cleanup = () => {
      ctrl.abort();
      Promise.resolve(done).then((fn) => typeof fn === 'function' && fn());
    };
    main.focus({ preventScroll: true });
    return;
  }
  fill(main, h('h1', null, 'Not found'), h('p', null, 'No page here. ', h('a', { href: '#/runs' }, 'Go to runs.')));
}

function showSignIn() {
  nav.hidden = true;
  signout.hidden = true;
  document.title = 'Sign in \u00b7 auditd';
  const input = h('input', {
    id: 'token', name: 'token', type: 'password', required: true, spellcheck: 'false',
    autocomplete: 'off', autocapitalize: 'off', 'aria-describedby': 'token-help',
  });
  const status = h('div', { id: 'signin-status', 'aria-live': 'polite' },
    flash ? h('p', { class: 'notice' }, flash) : null);
  flash = '';
  const submit = h('button', { type: 'submit', class: 'btn btn-primary', id: 'signin-submit' }, 'Sign in');
  const form = h('form', { class: 'signin', id: 'signin', novalidate: true },
    h('h1', null, 'Sign in'),
    h('label', { for: 'token' }, 'API token'),
    input,
    h('p', { id: 'token-help', class: 'muted' },
      'Paste the bearer token an administrator issued you. It is kept only in this tab and forgotten when the tab closes.'),
    submit, status);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const t = input.value.trim().replace(/^Bearer\s+/i, '');
    if (!t) { fill(status, h('p', { class: 'problem' }, 'Paste a token first.')); input.focus(); return; }
    submit.disabled = true;
    fill(status, h('p', { class: 'muted' }, 'Checking the token\u2026'));
    token.set(t);
    try {
      await checkToken();
      location.hash = '#/runs';
      if (location.hash === '#/runs') route();
    } catch (err) {
      token.clear();
      fill(status, problemBox(err, err.status === 401 ? 'Token refused' : 'Could not check the token'));
      submit.disabled = false;
      input.focus();
      input.select();
    }
  });
  fill(main, form);
  input.focus();
}

setUnauthorizedHandler((err) => {
  flash = `Your session ended (${err.detail || err.title || 'unauthorized'}). Sign in again.`;
  if (location.hash !== '#/signin') location.hash = '#/signin';
  else route();
});

signout.addEventListener('click', () => {
  token.clear();
  flash = 'Signed out.';
  if (location.hash !== '#/signin') location.hash = '#/signin';
  else route();
});

window.addEventListener('hashchange', route);
route();
