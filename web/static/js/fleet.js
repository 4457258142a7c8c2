// The fleet's view on the Sources page (GET /v1/fleet/sources): per shared
// budget, a row per node with its share of the slots granted in the last
// minute, and this node's own cut-off state. Only a node in a fleet points
// to it (GET /v1/sources' fleet); the page shows nothing of it elsewhere.
import { h, fmtNum, fmtRate, fmtRelative, fmtDuration, timeEl, badge, table, seconds, pageUnit, perSecondOf } from './dom.js';

// A node publishes its use every 5 s; a report older than this is stale (the
// node died, or is cut off from etcd).
const staleMs = 15000;

function zero(t) { return !t || String(t).startsWith('0001-01-01'); }

// fleetSection renders the view: a note on this node's state, then a table
// per shared key.
export function fleetSection(view) {
  const me = view.node;
  const cut = (view.sources || []).filter((s) => (s.nodes || []).some((n) => n.node === me && n.cut_off)).map((s) => s.key);
  const notes = [];
  if (cut.length) {
    notes.push(h('p', { class: 'warn-text', id: 'fleet-cutoff' },
      `This node (${me}) is cut off from etcd for ${cut.join(', ')}: it hands out the slots it holds, then nothing until etcd answers again.`));
  }
  if (view.peers_error) {
    notes.push(h('p', { class: 'warn-text', id: 'fleet-peers-error' }, `The other nodes\u2019 use is not known here: ${view.peers_error}.`));
  }
  if (!notes.length) notes.push(h('p', { class: 'muted', id: 'fleet-ok' }, `This node (${me}) reaches etcd; every node\u2019s use below is its own report.`));
  const unit = pageUnit((view.sources || []).flatMap((s) => [perSecondOf(s.limit, s.window), perSecondOf(s.learned_limit, s.learned_window)]));
  return h('section', { id: 'fleet-view', 'aria-labelledby': 'fleet-h' },
    h('h2', { id: 'fleet-h' }, 'Fleet'),
    h('p', { class: 'muted lede' }, 'The nodes of this fleet share each source\u2019s budget as slots granted through etcd, never handed out twice. Each row is one node\u2019s part of the slots granted in the last minute.'),
    notes,
    (view.sources || []).map((s) => keyTable(s, me, unit, !view.peers_error)),
    (view.sources || []).length ? null : h('p', { class: 'muted' }, 'No budget is shared yet.'));
}

function keyTable(s, me, unit, peersKnown) {
  const told = s.limit ? `${fmtRate(s.limit, s.window, unit)} shared` : 'not shared by this node';
  const learned = s.learned_limit ? `, ${fmtRate(s.learned_limit, s.learned_window, unit)} learned by the fleet` : '';
  const learner = s.learner ? h('span', { class: 'fleet-learner' }, ` \u00b7 learner ${s.learner}`) : h('span', { class: 'muted fleet-learner' }, ' \u00b7 no learner elected');
  const caption = h('span', null, h('span', { class: 'mono' }, s.key), s.group ? ' (gateway group)' : '', ` \u00b7 ${told}${learned}`, learner);
  const rows = (s.nodes || []).map((n) => nodeRow(n, me, !peersKnown));
  return table(caption, ['Node', { label: 'Share', num: true }, { label: 'Reserved', num: true }, { label: 'Used', num: true },
    { label: 'Wasted', num: true }, { label: 'Held now', num: true }, 'etcd', 'Pause', 'Reported'],
  rows, { class: 'fleet-key', id: `fleet-${s.key}`, empty: 'No node reports this budget.' });
}

function nodeRow(n, me, shareUnknown) {
  const age = Date.now() - new Date(n.reported_at).getTime();
  const stale = n.node !== me && age > staleMs;
  const span = seconds(n.span);
  const paused = !zero(n.paused_until) && new Date(n.paused_until).getTime() > Date.now();
  return h('tr', { class: n.cut_off ? 'row-fail' : null, dataset: { node: n.node } },
    h('td', null, h('span', { class: 'mono' }, n.node), n.node === me ? h('span', { class: 'muted small' }, ' (this node)') : null,
      n.learner ? h('div', null, badge('running', 'learner')) : null,
      n.cut_off ? h('div', null, badge('open', 'cut off')) : null),
    h('td', { class: 'num' }, shareUnknown ? h('span', { class: 'muted' }, 'unknown') : `${(100 * n.share).toFixed(0)}%`),
    h('td', { class: 'num' }, fmtNum(n.reserved)),
    h('td', { class: 'num' }, fmtNum(n.used)),
    h('td', { class: 'num' }, fmtNum(n.wasted)),
    h('td', { class: 'num' }, fmtNum(n.held)),
    h('td', { class: 'small' }, fmtDuration(n.etcd_latency)),
    h('td', { class: 'small' }, paused ? h('span', { class: 'warn-text' }, 'until ', timeEl(n.paused_until)) : h('span', { class: 'muted' }, 'not paused')),
    h('td', { class: 'small' }, stale ? h('span', { class: 'warn-text' }, `no report for ${fmtRelative(n.reported_at).replace(' ago', '')}`)
      : (n.node === me ? 'now' : fmtRelative(n.reported_at)),
      span > 0 ? h('div', { class: 'muted' }, `over the last ${fmtDuration(n.span)}`) : null));
}
