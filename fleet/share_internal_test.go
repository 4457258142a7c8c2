package fleet

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/internal/etcdtest"
)

// simNode is one node of a simulated fleet: its Slots, run turn by turn
// (reserveNext) rather than by its goroutines, and its takers' demand.
type simNode struct {
	name   string
	s      *Slots
	busy   [][2]time.Duration // spells of demand, from the run's start
	every  time.Duration      // while busy, a request each every; 0: a request for every slot
	queue  int                // requests waiting for a slot (every > 0)
	due    time.Time          // when its reservation loop looks again; zero: only when poked
	wake   bool               // a poke ends the loop's wait
	takes  []time.Duration    // when it took its slots, from the run's start
	grants []time.Duration    // when it was granted a block
}

// simFleet runs nodes of one key on a fake clock against a real etcd in
// steps of a millisecond: at each step every node with demand takes every
// slot due, and every reservation loop that would wake takes its turns.
// An etcd round trip takes no fake time. Pauses maps a step to the pause a
// node's breaker writes then (every node learns it at once).
type simFleet struct {
	fc    *clock.Fake
	nodes []*simNode
	pause map[time.Duration]time.Duration // at -> how long
}

func newSimFleet(t *testing.T, key string, rate Rate, nodes ...*simNode) *simFleet {
	t.Helper()
	c := etcdtest.Start(t, 1)
	f := &simFleet{fc: clock.NewFake(simStart), nodes: nodes, pause: map[time.Duration]time.Duration{}}
	for _, n := range nodes {
		st := NewStore(etcdtest.NewClient(t, c.Endpoints()...), f.fc, "")
		s, err := NewSlots(st, f.fc, Config{Key: key, Rate: rate, Node: n.name, Notify: func(e Event) {
			if e.Kind == EventReserved {
				n.grants = append(n.grants, e.At.Sub(simStart))
			}
		}})
		if err != nil {
			t.Fatal(err)
		}
		n.s, n.wake = s, true
	}
	return f
}

var simStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func (n *simNode) busyAt(d time.Duration) bool {
	for _, b := range n.busy {
		if d >= b[0] && d < b[1] {
			return true
		}
	}
	return false
}

// run steps the fleet from its start to end.
func (f *simFleet) run(t *testing.T, end time.Duration) {
	t.Helper()
	ctx := context.Background()
	for d := time.Duration(0); d < end; d += time.Millisecond {
		f.fc.Set(simStart.Add(d))
		if p, ok := f.pause[d]; ok {
			pz, err := f.nodes[0].s.PauseFor(ctx, f.fc.Now().Add(p), f.nodes[0].name)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range f.nodes[1:] {
				n.s.learn(pz)
			}
		}
		for _, n := range f.nodes {
			if n.every > 0 && n.busyAt(d) && d%n.every == 0 {
				n.queue++
			}
			f.take(n, d)
			if !f.turnDue(n) {
				continue
			}
			for {
				wait, wake, again := n.s.reserveNext(ctx)
				if !again {
					n.due, n.wake = time.Time{}, wake
					if wait > 0 {
						n.due = f.fc.Now().Add(wait)
					}
					break
				}
			}
			f.take(n, d)
		}
	}
}

// turnDue reports whether n's reservation loop would wake now: its wait
// is over, or a taker poked it.
func (f *simFleet) turnDue(n *simNode) bool {
	if !n.due.IsZero() && !f.fc.Now().Before(n.due) {
		return true
	}
	if !n.wake {
		return false
	}
	select {
	case <-n.s.kick:
		return true
	default:
		return false
	}
}

// take has n's takers, when busy at d, take every slot due.
func (f *simFleet) take(n *simNode, d time.Duration) {
	if !n.busyAt(d) {
		return
	}
	now := f.fc.Now()
	for n.every == 0 || n.queue > 0 {
		at, ok := n.s.Earliest(now, 1)
		if !ok || at.After(now) || !n.s.Take(now, 1) {
			return
		}
		n.takes = append(n.takes, d)
		n.queue = max(n.queue-1, 0)
	}
}

// used counts n's takes in [from, to).
func (n *simNode) used(from, to time.Duration) int { return countIn(n.takes, from, to) }

// countIn counts the times of ds in [from, to).
func countIn(ds []time.Duration, from, to time.Duration) int {
	c := 0
	for _, d := range ds {
		if d >= from && d < to {
			c++
		}
	}
	return c
}

// shares returns each node's takes in [from, to) and their total.
func (f *simFleet) shares(from, to time.Duration) (string, []int, int) {
	var counts []int
	total := 0
	for _, n := range f.nodes {
		counts = append(counts, n.used(from, to))
		total += counts[len(counts)-1]
	}
	s := ""
	for i, n := range f.nodes {
		s += fmt.Sprintf(" %s %d (%.0f%%)", n.name, counts[i], 100*float64(counts[i])/float64(max(total, 1)))
	}
	return s, counts, total
}

// grantsIn counts n's grants in [from, to): its etcd writes.
func (n *simNode) grantsIn(from, to time.Duration) int { return countIn(n.grants, from, to) }

const sec = time.Second

// TestSlotsShareABusyKey runs three nodes of one key, each taking every
// slot it can while busy: one alone first, the others joining later, or
// all three back from a breaker's pause, its opener two seconds before the
// others (BreakerGrace). A node that joins waits for the blocks the first
// holds (up to one and a half Blocks), then grows to its share within a
// few grants while the first node's blocks shrink to theirs; in the third
// and fourth seconds after they join each busy node takes at least two
// thirds of an even share of the key's slots, and together they take them
// all. A node alone takes full blocks, about one etcd write per
// Block, before the others join and again once they have left.
func TestSlotsShareABusyKey(t *testing.T) {
	if testing.Short() {
		t.Skip("an embedded etcd")
	}
	for _, rate := range []Rate{{20, sec}, {100, sec}} {
		t.Run(fmt.Sprintf("LateJoiners/%d", rate.Limit), func(t *testing.T) {
			a := &simNode{name: "a", busy: [][2]time.Duration{{0, 12 * sec}}}
			b := &simNode{name: "b", busy: [][2]time.Duration{{3 * sec, 7 * sec}}}
			c := &simNode{name: "c", busy: [][2]time.Duration{{3 * sec, 7 * sec}}}
			f := newSimFleet(t, "late", rate, a, b, c)
			f.run(t, 12*sec)
			first, _, _ := f.shares(3*sec, 5*sec)
			line, counts, total := f.shares(5*sec, 7*sec)
			t.Logf("the first two seconds after b and c join:%s; the next two:%s", first, line)
			checkShares(t, counts, total, rate)
			t.Logf("a alone: %d grants from 1s to 3s, %d from 10s to 12s", a.grantsIn(sec, 3*sec), a.grantsIn(10*sec, 12*sec))
			checkAlone(t, a, sec, 3*sec)
			checkAlone(t, a, 10*sec, 12*sec) // ShareSpan after b's and c's last blocks
		})
		t.Run(fmt.Sprintf("LightJoiner/%d", rate.Limit), func(t *testing.T) {
			// b asks for a third of the rate: it gets a good part of it,
			// and the fleet still uses every slot.
			a := &simNode{name: "a", busy: [][2]time.Duration{{0, 8 * sec}}}
			b := &simNode{name: "b", busy: [][2]time.Duration{{3 * sec, 8 * sec}}, every: 3 * sec / time.Duration(rate.Limit)}
			f := newSimFleet(t, "light", rate, a, b)
			f.run(t, 8*sec)
			first, _, _ := f.shares(3*sec, 4*sec)
			line, counts, total := f.shares(4*sec, 8*sec)
			st := b.s.Stats()
			t.Logf("the first second after b (a third of the rate) joins:%s; the next four:%s; b took %d of %d requests, wasted %d of %d slots",
				first, line, len(b.takes), len(b.takes)+b.queue, st.Wasted, st.Reserved)
			if 5*counts[1] < total {
				t.Errorf("b took %d of %d slots in 4 s, want at least a fifth", counts[1], total)
			}
			if slots := int(4 * sec / Interval(rate, DefaultGrace, DefaultMaxSkew)); 100*total < 95*slots {
				t.Errorf("the nodes took %d slots in 4 s, want at least 95%% of %d", total, slots)
			}
		})
		t.Run(fmt.Sprintf("AfterAPause/%d", rate.Limit), func(t *testing.T) {
			a := &simNode{name: "a", busy: [][2]time.Duration{{0, 3 * sec}, {4 * sec, 10 * sec}}}
			b := &simNode{name: "b", busy: [][2]time.Duration{{0, 3 * sec}, {6 * sec, 10 * sec}}}
			c := &simNode{name: "c", busy: [][2]time.Duration{{0, 3 * sec}, {6 * sec, 10 * sec}}}
			f := newSimFleet(t, "pause", rate, a, b, c)
			f.pause[3*sec] = sec
			f.run(t, 10*sec)
			first, _, _ := f.shares(6*sec, 8*sec)
			line, counts, total := f.shares(8*sec, 10*sec)
			t.Logf("the first two seconds after b and c are back:%s; the next two:%s", first, line)
			checkShares(t, counts, total, rate)
		})
	}
}

// checkShares fails unless, over two seconds, every node took at least
// two thirds of an even share of total, and total is at least 95% of the
// slots of two seconds.
func checkShares(t *testing.T, counts []int, total int, rate Rate) {
	t.Helper()
	for i, n := range counts {
		if 3*n*len(counts) < 2*total {
			t.Errorf("node %d took %d of %d slots, want at least two thirds of an even share", i, n, total)
		}
	}
	slots := int(2 * sec / Interval(rate, DefaultGrace, DefaultMaxSkew))
	if 100*total < 95*slots {
		t.Errorf("the nodes took %d slots in 2 s, want at least 95%% of %d", total, slots)
	}
}

// checkAlone fails unless a, busy alone in [from, from+2s), took full
// blocks: at most two etcd writes a second (one per Block, and one for a
// block that comes early).
func checkAlone(t *testing.T, a *simNode, from, to time.Duration) {
	t.Helper()
	if n := a.grantsIn(from, to); n > 4 {
		t.Errorf("a, alone, was granted %d blocks from %v to %v, want at most 4", n, from, to)
	}
}

// TestRaiseFencedByLeadership: a learner's raise is written only while its
// election is the key's leader. One whose leadership ended during a step
// (its lease lapsed, another node elected) writes nothing, though the
// outcomes it read say raise.
func TestRaiseFencedByLeadership(t *testing.T) {
	c := etcdtest.Start(t, 1)
	store := NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	start := Rate{Limit: 100, Window: 10 * time.Second}
	if _, err := store.Start(ctx, "geo", start, "n1"); err != nil {
		t.Fatal(err)
	}
	fc := clock.NewFake(time.Unix(1e9, 0))
	l := NewLearner(store, fc, LearnerConfig{Key: "geo", Node: "n1", Start: start})
	sess, err := store.session(ctx, DefaultLeaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	el := concurrency.NewElection(sess, store.leaderKey("geo"))
	if err := el.Campaign(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	busy := func(ok int64) {
		t.Helper()
		if err := store.Report(ctx, "geo", "n1", Outcomes{OK: ok}); err != nil {
			t.Fatal(err)
		}
	}
	busy(0)
	if err := l.step(ctx, el); err != nil { // the first read: a baseline
		t.Fatal(err)
	}
	busy(20) // 10/s over a period, the limit in force: slow start raises
	fc.Advance(l.cfg.Period)
	// The leader's key gone, as when its lease lapses while the step is
	// stalled and another node is elected.
	if _, err := store.client.Delete(ctx, el.Key()); err != nil {
		t.Fatal(err)
	}
	if err := l.step(ctx, el); err == nil {
		t.Fatal("a raise refused for leadership ended nothing: the term would lead on and never raise")
	}
	if got, err := store.Limit(ctx, "geo"); err != nil || got.Rate != start {
		t.Fatalf("a learner no longer leading raised the limit to %+v (%v), want %v kept", got.Rate, err, start)
	}
	// Elected again, the same outcomes raise.
	if err := el.Campaign(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	busy(40)
	fc.Advance(l.cfg.Period)
	if err := l.step(ctx, el); err != nil {
		t.Fatal(err)
	}
	if got, err := store.Limit(ctx, "geo"); err != nil || got.Rate.PerSecond() <= start.PerSecond() {
		t.Fatalf("the leader's raise left %+v (%v), want above %v", got.Rate, err, start)
	}
	// Outcomes read over three periods (a step that stalled) are no
	// period's: no raise from them, the count starts again.
	cur, _ := store.Limit(ctx, "geo")
	busy(40 + int64(6*cur.Rate.PerSecond()))
	fc.Advance(3 * l.cfg.Period)
	if err := l.step(ctx, el); err != nil {
		t.Fatal(err)
	}
	if got, _ := store.Limit(ctx, "geo"); got.Rate != cur.Rate {
		t.Fatalf("three periods' outcomes raised %v to %v", cur.Rate, got.Rate)
	}
}

// TestFailedResignLeavesNoLeader: a term whose Resign fails (etcd slow,
// its context over) still deletes its leader key, so that another node
// wins the key's election while this node's lease, shared by its other
// keys, lives on; and a later term's key, on the same lease, is never
// deleted for an earlier term's.
func TestFailedResignLeavesNoLeader(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	a := NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b := NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	campaign := func(st *Store, node string) *concurrency.Election {
		t.Helper()
		sess, err := st.session(ctx, DefaultLeaseTTL)
		if err != nil {
			t.Fatal(err)
		}
		el := concurrency.NewElection(sess, st.leaderKey("geo"))
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a guard against a hang
		defer cancel()
		if err := el.Campaign(cctx, node); err != nil {
			t.Fatalf("%s could not win the key's election: %v", node, err)
		}
		return el
	}
	l := NewLearner(a, clock.Real{}, LearnerConfig{Key: "geo", Node: "n1"})
	sess, err := a.session(ctx, DefaultLeaseTTL) // the node's, which campaign uses too
	if err != nil {
		t.Fatal(err)
	}
	el := campaign(a, "n1")
	key, rev := el.Key(), el.Rev()
	over, cancel := context.WithCancel(ctx)
	cancel()
	_ = l.resign(over, sess, el) // judged by what it leaves behind
	other := campaign(b, "n2")   // held up for as long as n1's key lives
	if err := other.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	// n1 elected again on the same lease: the same key, a new revision.
	again := campaign(a, "n1")
	if again.Key() != key || again.Rev() == rev {
		t.Fatalf("n1's second term holds %s at %d, want %s at a revision after %d", again.Key(), again.Rev(), key, rev)
	}
	if err := resignAgain(sess, key, rev); err != nil {
		t.Fatal(err)
	}
	if resp, err := a.client.Get(ctx, key); err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("an earlier term's delete removed the later term's key (%v)", err)
	}
}
