// Ledger: whether the hash chain verifies, the latest signed checkpoint and
// the public key that checks it, for an auditor to verify offline.
import { getJSON, getText } from './api.js';
import { h, fill, fmtNum, problemBox, dl } from './dom.js';

function copyBlock(id, label, text) {
  const area = h('textarea', { id, readonly: true, rows: Math.min(12, text.split('\n').length + 1), class: 'mono copyable', spellcheck: 'false' });
  area.value = text;
  const status = h('span', { class: 'muted', 'aria-live': 'polite' });
  const btn = h('button', { type: 'button', class: 'btn', id: `${id}-copy` }, `Copy ${label}`);
  btn.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(text);
      fill(status, 'Copied.');
    } catch {
      // No clipboard outside a secure context: select it for Ctrl+C instead.
      area.focus();
      area.select();
      fill(status, 'Selected: press Ctrl+C to copy.');
    }
  });
  return h('div', { class: 'copyblock' }, h('label', { for: id, class: 'visually-hidden' }, label), area, h('div', { class: 'toolbar' }, btn, status));
}

export async function ledgerPage(main, { signal }) {
  document.title = 'Ledger \u00b7 auditd';
  const verify = h('section', { id: 'verify', 'aria-live': 'polite', 'aria-labelledby': 'verify-h' });
  const checkpoint = h('section', { id: 'checkpoint', 'aria-labelledby': 'cp-h' });
  const key = h('section', { id: 'public-key', 'aria-labelledby': 'key-h' });
  fill(main, h('div', { class: 'pagehead' }, h('h1', null, 'Ledger')),
    h('p', { class: 'muted lede' }, 'Every pacing decision is an append-only, hash-chained event. Checkpoints are signed; anyone with the public key can check an evidence pack offline with ',
      h('code', null, 'auditd verify'), '.'),
    verify, checkpoint, key);

  const runVerify = async () => {
    fill(verify, h('h2', { id: 'verify-h' }, 'Verification'), h('p', { class: 'muted' }, 'Verifying the whole ledger\u2026'));
    try {
      const v = await getJSON('/v1/ledger/verify', signal);
      const again = h('button', { type: 'button', class: 'btn btn-quiet' }, 'Verify again');
      again.addEventListener('click', runVerify);
      fill(verify, h('div', { class: 'pagehead' }, h('h2', { id: 'verify-h' }, 'Verification'), again),
        v.ok
          ? h('p', { class: 'verdict verdict-ok', id: 'verify-verdict' }, h('strong', null, 'Intact.'),
            ` The hash chain, Merkle tree and checkpoints verify over ${fmtNum(v.events)} events; the file's pages and the run and idempotency indexes agree with them.`)
          : h('p', { class: 'verdict verdict-bad', id: 'verify-verdict' }, h('strong', null, 'Verification failed'),
            v.first_bad ? ` at sequence ${fmtNum(v.first_bad)}` : '', v.problem ? `: ${v.problem}` : '.'),
        dl([
          ['Events checked', fmtNum(v.events)],
          ['Head sequence', fmtNum(v.head_seq)],
          ['Head hash', h('span', { class: 'mono break' }, v.head_hash || '')],
          v.first_bad ? ['First bad sequence', fmtNum(v.first_bad)] : null,
          v.problem ? ['Problem', v.problem] : null,
        ]),
        (v.findings || []).length
          ? h('ul', { class: 'findings', id: 'verify-findings' }, v.findings.map((f) => h('li', null, f)))
          : null);
    } catch (err) {
      fill(verify, h('h2', { id: 'verify-h' }, 'Verification'), problemBox(err, 'Could not verify the ledger'));
    }
  };

  const loadText = async (section, hid, title, path, label, id) => {
    fill(section, h('h2', { id: hid }, title), h('p', { class: 'muted' }, 'Loading\u2026'));
    try {
      const text = await getText(path, signal);
      fill(section, h('h2', { id: hid }, title), copyBlock(id, label, text.trim()));
    } catch (err) {
      fill(section, h('h2', { id: hid }, title), problemBox(err, `Could not load the ${label}`));
    }
  };

  await Promise.all([
    runVerify(),
    loadText(checkpoint, 'cp-h', 'Latest checkpoint', '/v1/ledger/checkpoint', 'checkpoint', 'checkpoint-text'),
    loadText(key, 'key-h', 'Public key', '/v1/ledger/public-key', 'public key', 'public-key-text'),
  ]);
}
