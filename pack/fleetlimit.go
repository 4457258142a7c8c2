package pack

import (
	"cmp"
	"errors"
	"io"
	"slices"
	"sort"
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
}

// verifyLimits checks the over-limit proof: per source, the nodes' blocks
// are disjoint, granted in order and spaced no closer than the limit in
// force; and no window of the source's dispatches, over every node, holds
// more than the limit in force (the one in force at the window's last
// dispatch).
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
		if err := p.dispatches(m.Runs, limits, func(e *auditd.Event) {
			dispatches[e.SourceID] = append(dispatches[e.SourceID], placed{node: n.Name, at: e.Time.UnixNano(), seq: e.Seq})
		}); err != nil {
			r.fail("node %s: %v", n.Name, err)
		}
	}
	for src, ds := range dispatches {
		r.Dispatches[src] = int64(len(ds))
		checkWindows(src, ds, limits[src], r)
		if m.SlotSlack > 0 {
			checkInBlocks(src, ds, blocks[src], m.SlotSlack, r)
		}
	}
	return nil
}

// checkInBlocks reports, per node, the first dispatch of src that none of
// the node's blocks holds (before the block's first slot, or more than
// slack after its last), and a block that more dispatches used than it has
// slots. ds are sorted by time.
func checkInBlocks(src string, ds, bs []placed, slack int64, r *FleetReport) {
	byNode := map[string][]FleetBlock{}
	for _, p := range bs { // sorted by First (checkBlocks)
		byNode[p.node] = append(byNode[p.node], p.block)
	}
	used := map[string][]int64{}
	reported := map[string]bool{}
	for _, d := range ds {
		bl := byNode[d.node]
		if used[d.node] == nil {
			used[d.node] = make([]int64, len(bl))
		}
		i := sort.Search(len(bl), func(i int) bool { return bl[i].First > d.at }) - 1
		if i >= 0 && d.at <= bl[i].First+(bl[i].Count-1)*bl[i].Interval+slack {
			if used[d.node][i]++; used[d.node][i] == bl[i].Count+1 {
				r.fail("source %s: node %s's block at revision %d (%d slots) holds more dispatches; the one past it is event %d (leaf %d)",
					src, d.node, bl[i].Revision, bl[i].Count, d.seq, d.seq-1)
			}
			continue
		}
		if !reported[d.node] {
			reported[d.node] = true
			r.fail("source %s: node %s's dispatch event %d (leaf %d) at %s is in none of its reserved blocks",
				src, d.node, d.seq, d.seq-1, stamp(d.at))
		}
	}
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

// dispatches hands fn the dispatch events of runs on the sources of
// limits, from the leaves.
func (p *Pack) dispatches(runs []string, limits map[string][]FleetLimit, fn func(*auditd.Event)) error {
	s, err := p.scanLeaves()
	if err != nil {
		return err
	}
	defer s.Close()
	s.noLeaf = true
	for {
		err := s.next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if s.e.Type == auditd.EventDispatch && limits[s.e.SourceID] != nil && slices.Contains(runs, s.e.RunID) {
			fn(&s.e)
		}
	}
}
