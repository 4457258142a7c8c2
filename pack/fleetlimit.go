package pack

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// placed is one block or dispatch with the node it came from.
type placed struct {
	node  string
	block FleetBlock
	at    int64  // a dispatch's time, Unix nanoseconds
	seq   uint64 // a dispatch's event
	cost  int    // a dispatch's cost: the slots it took
}

// verifyLimits checks the over-limit proof: per source, the nodes' blocks
// are disjoint, granted in order and spaced no closer than the limit in
// force; no window of the source's dispatches, over every node, holds more
// than the limit in force (the one in force at the window's last
// dispatch); and, when the manifest gives the slots' slack, each dispatch
// holds slots of its node's own within that slack. Dispatches closed as
// not sent are left out: the upstream never saw them.
func verifyLimits(fp *FleetPack, r *FleetReport) error {
	m := &fp.Manifest
	limits := map[string][]FleetLimit{}
	for _, l := range m.Limits {
		if l.Limit <= 0 || l.Window <= 0 {
			r.fail("%s: limit of source %s is %d per %dns", FileFleetManifest, l.Source, l.Limit, l.Window)
			continue
		}
		limits[l.Source] = append(limits[l.Source], l)
	}
	for _, ls := range limits {
		slices.SortFunc(ls, func(a, b FleetLimit) int { return cmp.Compare(a.From, b.From) })
	}
	blocks := map[string][]placed{}
	for _, n := range m.Nodes {
		for _, b := range n.Blocks {
			if b.Count < 1 || b.Interval <= 0 {
				r.fail("node %s: block of source %s at revision %d: %d slots %dns apart", n.Name, b.Source, b.Revision, b.Count, b.Interval)
				continue
			}
			blocks[b.Source] = append(blocks[b.Source], placed{node: n.Name, block: b})
		}
	}
	for src, bs := range blocks {
		checkBlocks(src, bs, limits[src], r)
	}
	if len(limits) == 0 {
		return nil
	}
	dispatches := map[string][]placed{}
	for _, n := range m.Nodes {
		p := fp.Nodes[n.Name]
		if p == nil {
			continue
		}
		ds, err := p.sentDispatches(n.Name, m.Runs, limits)
		if err != nil {
			r.fail("node %s: %v", n.Name, err)
		}
		for _, d := range ds {
			dispatches[d.src] = append(dispatches[d.src], d.placed)
		}
	}
	for src, ds := range dispatches {
		r.Dispatches[src] = int64(len(ds))
		checkWindows(src, ds, limits[src], r)
		if m.SlotSlack > 0 {
			checkInSlots(src, ds, blocks[src], m.SlotSlack, r)
		}
	}
	return nil
}

// checkInSlots reports, per node, the first dispatch of src that the
// node's slots cannot account for: each dispatch needs cost slots of its
// own, none used twice, each at most slack before the dispatch's time and
// none after it (a slot is handed out within its grace, and its request
// is sent only if its record is durable within the node's lag: slack is
// the two). ds are sorted by time.
//
// A greedy match is exact here: every slot's span is the same length, so
// giving each dispatch, in time order, the earliest slots still in reach
// never leaves a later dispatch without slots another match would find.
func checkInSlots(src string, ds, bs []placed, slack int64, r *FleetReport) {
	slots := map[string]*slotCursor{}
	for _, p := range bs { // sorted by First (checkBlocks)
		c := slots[p.node]
		if c == nil {
			c = &slotCursor{}
			slots[p.node] = c
		}
		c.blocks = append(c.blocks, p.block)
	}
	reported := map[string]bool{}
	for _, d := range ds {
		if reported[d.node] {
			continue
		}
		c := slots[d.node]
		if c == nil {
			c = &slotCursor{}
			slots[d.node] = c
		}
		if c.take(d.at-slack, d.at, d.cost) {
			continue
		}
		reported[d.node] = true
		r.fail("source %s: node %s's dispatch event %d (leaf %d) at %s is in none of its reserved blocks: no slot of its own from %v before it",
			src, d.node, d.seq, d.seq-1, stamp(d.at), time.Duration(slack))
	}
}

// slotCursor walks one node's slots of a source in time order.
type slotCursor struct {
	blocks []FleetBlock // sorted by First
	b      int          // the block of the next slot
	i      int64        // the next slot in it
}

// take spends the next n slots at or after from, when each is at or
// before to; slots before from are passed over, unused.
func (c *slotCursor) take(from, to int64, n int) bool {
	for range n {
		for c.b < len(c.blocks) {
			bl := c.blocks[c.b]
			if c.i < bl.Count && bl.First+c.i*bl.Interval < from {
				// Skip to the first slot at or after from.
				c.i = max(c.i, (from-bl.First+bl.Interval-1)/bl.Interval)
			}
			if c.i < bl.Count {
				break
			}
			c.b, c.i = c.b+1, 0
		}
		if c.b == len(c.blocks) {
			return false
		}
		bl := c.blocks[c.b]
		if bl.First+c.i*bl.Interval > to {
			return false
		}
		c.i++
	}
	return true
}

// inForce returns the limit of ls in force at t, if any.
func inForce(ls []FleetLimit, t int64) (FleetLimit, bool) { return reports.LimitInForce(ls, t) }

func checkBlocks(src string, bs []placed, ls []FleetLimit, r *FleetReport) {
	slices.SortFunc(bs, func(a, b placed) int { return cmp.Compare(a.block.First, b.block.First) })
	revs := map[int64]string{}
	for i, p := range bs {
		b := p.block
		if other, dup := revs[b.Revision]; dup {
			r.fail("source %s: node %s's and node %s's blocks both claim revision %d", src, other, p.node, b.Revision)
		}
		revs[b.Revision] = p.node
		if l, ok := inForce(ls, b.First); ok && b.Interval*l.Limit < l.Window {
			r.fail("source %s: node %s's block at revision %d spaces slots %v apart, closer than %d per %v allows",
				src, p.node, b.Revision, time.Duration(b.Interval), l.Limit, time.Duration(l.Window))
		}
		if i == 0 {
			continue
		}
		prev := bs[i-1]
		end := prev.block.First + prev.block.Count*prev.block.Interval
		switch {
		case end > b.First:
			r.fail("source %s: node %s's block at revision %d (%s to %s) overlaps node %s's block at revision %d (from %s)",
				src, prev.node, prev.block.Revision, stamp(prev.block.First), stamp(end), p.node, b.Revision, stamp(b.First))
		case prev.block.Revision > b.Revision:
			r.fail("source %s: node %s's block at revision %d starts after node %s's at later revision %d: not granted in order",
				src, prev.node, prev.block.Revision, p.node, b.Revision)
		}
	}
}

// checkWindows reports the first window of src's dispatches that holds
// more than the limit in force, naming the dispatch that passed it: the
// window check of the fleet reconciliation's R9 (reports.FleetWindows).
func checkWindows(src string, ds []placed, ls []FleetLimit, r *FleetReport) {
	fd := make([]reports.FleetDispatch, len(ds))
	for i, d := range ds {
		fd[i] = reports.FleetDispatch{Node: d.node, At: d.at, Seq: d.seq}
	}
	over := reports.FleetWindows(src, fd, ls)
	if over == nil {
		return
	}
	r.fail("%s", over)
	if over.Offending > 1 {
		r.fail("source %s: %d more dispatches each ended a window over the limit", src, over.Offending-1)
	}
}

func stamp(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// sentDispatch is a dispatch of node's, with its source and cost.
type sentDispatch struct {
	placed
	src string
}

// sentDispatches returns node's dispatch events of runs on the sources of
// limits, from the leaves, but those closed as not sent
// (reports.SentScan): on record, never on the wire.
func (p *Pack) sentDispatches(node string, runs []string, limits map[string][]FleetLimit) ([]sentDispatch, error) {
	s, err := p.scanLeaves()
	if err != nil {
		return nil, err
	}
	defer s.Close()
	s.noLeaf = true
	var ds []sentDispatch
	var sent reports.SentScan
	for {
		err := s.next()
		if errors.Is(err, io.EOF) {
			return reports.Sent(ds, &sent), nil
		}
		if err != nil {
			return nil, err
		}
		e := &s.e
		if limits[e.SourceID] == nil || !slices.Contains(runs, e.RunID) {
			continue
		}
		sent.See(e)
		if e.Type == auditd.EventDispatch {
			ds = append(ds, sentDispatch{placed{node: node, at: e.Time.UnixNano(), seq: e.Seq, cost: auditd.DispatchCost(e)}, e.SourceID})
		}
	}
}
