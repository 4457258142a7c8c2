package fleet_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// TestReserveNeverGrantsASlotTwice has several nodes, each its own etcd
// client on its own member, reserve blocks of one key at once: every grant
// has its own revision and no two grants overlap.
func TestReserveNeverGrantsASlotTwice(t *testing.T) {
	c := etcdtest.Start(t, 3)
	const nodes, each = 6, 25
	interval := time.Millisecond
	var (
		mu     sync.Mutex
		blocks []fleet.Block
		wg     sync.WaitGroup
	)
	for n := range nodes {
		st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()[n%3]), clock.Real{}, "")
		wg.Go(func() {
			for i := range each {
				b, err := st.Reserve(context.Background(), "geo", fleet.Ask{From: time.Now(), Count: 1 + (n+i)%7, Interval: interval})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				blocks = append(blocks, b)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(blocks) != nodes*each {
		t.Fatalf("%d blocks, want %d", len(blocks), nodes*each)
	}
	assertDisjoint(t, blocks)
}

// assertDisjoint checks that no two blocks share a revision or overlap, and
// that every slot is at least an interval after the one before it.
func assertDisjoint(t *testing.T, blocks []fleet.Block) {
	t.Helper()
	slices.SortFunc(blocks, func(a, b fleet.Block) int { return a.First.Compare(b.First) })
	revs := make(map[int64]bool)
	for i, b := range blocks {
		if revs[b.Revision] {
			t.Fatalf("revision %d granted twice", b.Revision)
		}
		revs[b.Revision] = true
		if i > 0 && b.First.Before(blocks[i-1].End()) {
			t.Fatalf("block %+v overlaps %+v", b, blocks[i-1])
		}
	}
}

func TestReserveStartsAtFromAfterIdle(t *testing.T) {
	c := etcdtest.Start(t, 1)
	fc := clock.NewFake(t0)
	st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	b1, err := st.Reserve(ctx, "k", fleet.Ask{From: fc.Now(), Count: 3, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := st.Reserve(ctx, "k", fleet.Ask{From: fc.Now(), Count: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !b1.First.Equal(t0) || !b2.First.Equal(t0.Add(3*time.Second)) || b2.Revision <= b1.Revision {
		t.Fatalf("blocks %+v %+v", b1, b2)
	}
	// Idle past the arrival time: the next block starts now, the unused
	// time is not saved up.
	fc.Advance(time.Hour)
	b3, err := st.Reserve(ctx, "k", fleet.Ask{From: fc.Now(), Count: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !b3.First.Equal(fc.Now()) {
		t.Fatalf("after idle block at %v, want now %v", b3.First, fc.Now())
	}
	// Another node's Store, with no cached state, still continues after.
	other := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b4, err := other.Reserve(ctx, "k", fleet.Ask{From: fc.Now(), Count: 1, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !b4.First.Equal(b3.End()) {
		t.Fatalf("other node's block at %v, want %v", b4.First, b3.End())
	}
}

// TestNoGrantAfterAPauseFallsInsideIt has nodes reserve while others pause
// the same key: every block granted at a later revision than a pause starts
// at or after the pause's end.
func TestNoGrantAfterAPauseFallsInsideIt(t *testing.T) {
	c := etcdtest.Start(t, 1)
	var (
		mu     sync.Mutex
		blocks []fleet.Block
		pauses []fleet.Pause
		wg     sync.WaitGroup
	)
	for n := range 4 {
		st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
		wg.Go(func() {
			for i := range 30 {
				ctx := context.Background()
				if n == 0 && i%3 == 0 {
					p, err := st.Pause(ctx, "geo", time.Now().Add(time.Second+time.Duration(i)*20*time.Millisecond))
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					pauses = append(pauses, p)
					mu.Unlock()
					continue
				}
				b, err := st.Reserve(ctx, "geo", fleet.Ask{From: time.Now(), Count: 3, Interval: time.Millisecond})
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				blocks = append(blocks, b)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	for _, p := range pauses {
		for _, b := range blocks {
			if b.Revision > p.Revision && b.First.Before(p.Until) {
				t.Fatalf("block %+v granted after the pause %+v starts inside it", b, p)
			}
		}
	}
	assertDisjoint(t, blocks)
}

// TestReserveCapsAGrantByTheNodesSharingTheKey has nodes ask one key for a
// full block each: alone a node gets it; while others reserved within
// ShareSpan of its ask a grant holds what their last grants left of Full,
// at least Full over the nodes sharing, and never fewer than Least; once
// they are gone a node alone gets full blocks again. A pause keeps the
// sharers.
func TestReserveCapsAGrantByTheNodesSharingTheKey(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	stores := map[string]*fleet.Store{}
	for _, n := range []string{"a", "b", "c"} {
		stores[n] = fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	}
	const iv = 10 * time.Millisecond
	at := t0
	ask := func(node string, least int) fleet.Block {
		t.Helper()
		b, err := stores[node].Reserve(ctx, "k", fleet.Ask{Node: node, From: at, Count: 90, Interval: iv, Full: 90, Least: least})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, step := range []struct {
		node  string
		least int
		want  int
	}{
		{"a", 1, 90}, {"a", 1, 90}, // alone: full blocks
		{"b", 1, 45}, {"a", 1, 45}, // two share it
		{"c", 1, 30}, {"a", 1, 30}, {"b", 1, 30},
		{"c", 40, 40}, // a taker asks for more than the share
	} {
		if b := ask(step.node, step.least); b.Count != step.want {
			t.Fatalf("%s granted %+v, want %d slots", step.node, b, step.want)
		}
	}
	// A pause keeps the sharers: a, b and c still share.
	last := ask("a", 1)
	if _, err := stores["b"].Pause(ctx, "k", last.End().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	if b := ask("a", 1); b.Count != 30 {
		t.Fatalf("a granted %+v after a pause, want a third of a full block", b)
	}
	// Past ShareSpan after b's and c's last grants ended, a is alone.
	at = last.End().Add(time.Second + fleet.ShareSpan + time.Nanosecond)
	if b := ask("a", 1); b.Count != 90 {
		t.Fatalf("a granted %+v once the others were gone, want a full block", b)
	}
	// A node taking little leaves the rest of a full block to the others.
	if _, err := stores["b"].Reserve(ctx, "k", fleet.Ask{Node: "b", From: at, Count: 1, Interval: iv, Full: 90, Least: 1}); err != nil {
		t.Fatal(err)
	}
	if b := ask("a", 1); b.Count != 89 {
		t.Fatalf("a granted %+v beside b's one slot, want 89", b)
	}
}

// TestReserveReadsAnArrivalTimeWithoutSharers has a key written as a build
// before sharers wrote it, a bare time: it reads as shared by nobody, and
// the next grant starts at it.
func TestReserveReadsAnArrivalTimeWithoutSharers(t *testing.T) {
	c := etcdtest.Start(t, 1)
	client := etcdtest.NewClient(t, c.Endpoints()...)
	ctx := context.Background()
	tat := t0.Add(time.Second)
	if _, err := client.Put(ctx, fleet.DefaultPrefix+"budget/k/tat", strconv.FormatInt(tat.UnixNano(), 10)); err != nil {
		t.Fatal(err)
	}
	st := fleet.NewStore(client, clock.Real{}, "")
	b, err := st.Reserve(ctx, "k", fleet.Ask{Node: "a", From: t0, Count: 90, Interval: time.Millisecond, Full: 90})
	if err != nil {
		t.Fatal(err)
	}
	if !b.First.Equal(tat) || b.Count != 90 {
		t.Fatalf("granted %+v, want 90 slots from %v", b, tat)
	}
	resp, err := client.Get(ctx, fleet.DefaultPrefix+"budget/k/tat")
	if err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("%d %d:90:a", b.End().UnixNano(), b.End().UnixNano())
	if got := string(resp.Kvs[0].Value); got != want {
		t.Fatalf("arrival time %q, want %q", got, want)
	}
}
