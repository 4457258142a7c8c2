package pack_test

import (
	"context"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
)

// slotSlack is the fleet's grace and lag in the packs of slotPack.
const slotSlack = 30 * time.Millisecond

// lateKey is the item whose first dispatch (page 0, attempt 1) on node b
// slotPack may place past its slot: node b's first on src-a.
const lateKey = "item-0000004"

// slotPack writes the fleet pack of a three-node run whose src-a
// dispatches each hold a slot of their node's own, reserved 5ms before
// the dispatch's record, except lateKey's on node b, whose slot is late
// before it (more than slotSlack when late is). With notSent, that
// dispatch is closed by a "not sent" dispatch.interrupted instead of its
// response. edit may change the blocks before the pack is written.
func slotPack(tb testing.TB, late time.Duration, notSent bool, edit func(blocks map[string][]pack.FleetBlock)) *pack.FleetPack {
	tb.Helper()
	ctx := context.Background()
	c := etcdtest.Start(tb, 1)
	flog := fleetlog.New(etcdtest.NewClient(tb, c.Endpoints()...), fleetlog.Config{})
	f := &fleetFixture{keys: map[string]string{}}
	var nodes []*fleetNode
	type slot struct {
		node string
		at   int64
	}
	var slots []slot
	for i, name := range []string{"a", "b", "c"} {
		n := nodeLedger(tb, name, tb.TempDir(), i, 18, func(e *auditd.Event) {
			closes := (e.Type == auditd.EventResponse || e.Type == auditd.EventThrottle) && e.Page == 0 && e.Attempt == 1
			if notSent && name == "b" && closes && e.ItemKey == lateKey {
				*e = auditd.Event{Type: auditd.EventInterrupted, RunID: e.RunID, SourceID: e.SourceID, ItemKey: e.ItemKey, Attempt: 1,
					Method: "GET", Reason: auditd.NotSentPrefix + ": its fleet slot passed while its record committed"}
			}
		})
		err := ledger.NewReader(n.db).ScanRun(benchRun, 0, func(e *auditd.Event) error {
			if e.Type == auditd.EventDispatch && e.SourceID == "src-a" {
				at := e.Time.Add(-5 * time.Millisecond)
				if name == "b" && e.ItemKey == lateKey && e.Page == 0 && e.Attempt == 1 {
					at = e.Time.Add(-late)
				}
				slots = append(slots, slot{name, at.UnixNano()})
			}
			return nil
		})
		if err != nil {
			tb.Fatal(err)
		}
		nodes = append(nodes, n)
	}
	head, entries, leaves := f.logNodes(tb, ctx, flog, nodes)

	// One slot a block, granted in time order: revisions follow the slots.
	slices.SortFunc(slots, func(a, b slot) int { return int(a.at - b.at) })
	blocks := map[string][]pack.FleetBlock{}
	for k, s := range slots {
		blocks[s.node] = append(blocks[s.node], pack.FleetBlock{Source: "src-a", First: s.at, Interval: int64(time.Millisecond), Count: 1, Revision: int64(1 + k)})
	}
	if edit != nil {
		edit(blocks)
	}
	m := &f.parts.Manifest
	*m = pack.FleetManifest{Origin: head.Origin, TreeSize: head.Size, Runs: []string{benchRun}, SlotSlack: int64(slotSlack),
		Limits: []pack.FleetLimit{{Source: "src-a", Limit: 1000, Window: int64(time.Second)}}}
	for i, n := range f.nodes {
		p, err := flog.ProveLeaf(ctx, entries[i].Index, head.Size)
		if err != nil {
			tb.Fatal(err)
		}
		m.Nodes = append(m.Nodes, pack.FleetNode{Name: n.name, Key: n.key, LeafIndex: entries[i].Index, Leaf: b64s(leaves[i]),
			Inclusion: b64h(p), Blocks: blocks[n.name]})
	}
	f.parts.Packs = map[string]io.Reader{}
	return f.write(tb)
}

// The over-limit proof holds every dispatch sent to a slot of its node's
// own, at most the slots' slack (grace and lag) before it: a dispatch
// recorded later than that was sent outside the time its slot was spaced
// for, and fails the pack, unless its node closed it as not sent.
func TestFleetPackHoldsDispatchesToTheirSlots(t *testing.T) {
	for _, tc := range []struct {
		name    string
		late    time.Duration
		notSent bool
		edit    func(map[string][]pack.FleetBlock)
		named   []string // a problem naming each; none: the pack verifies
	}{
		{name: "WithinTheSlack", late: slotSlack},
		{name: "LateAndSent", late: slotSlack + time.Millisecond,
			named: []string{"node b's dispatch event", "none of its reserved blocks"}},
		{name: "LateAndNotSent", late: slotSlack + time.Millisecond, notSent: true},
		{name: "OneSlotForTwoDispatches", late: slotSlack, edit: func(bs map[string][]pack.FleetBlock) {
			bs["c"] = slices.Delete(bs["c"], 1, 2) // c's second dispatch must find its own
		}, named: []string{"node c's dispatch event", "no slot of its own"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := slotPack(t, tc.late, tc.notSent, tc.edit)
			r := verifyFleet(t, fp, fleetKeys(fp))
			if len(tc.named) == 0 {
				if !r.OK {
					t.Fatalf("the fleet pack fails:\n%s", strings.Join(r.Problems, "\n"))
				}
				if r.Dispatches["src-a"] == 0 {
					t.Fatal("no dispatch on src-a was checked")
				}
				return
			}
			mustName(t, r, tc.named...)
		})
	}
}

// fleetKeys are the keys fp's manifest names, trusted as given.
func fleetKeys(fp *pack.FleetPack) map[string]string {
	keys := map[string]string{}
	for _, n := range fp.Manifest.Nodes {
		keys[n.Name] = n.Key
	}
	return keys
}
