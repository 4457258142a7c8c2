package fleet_test

import (
	"context"
	"slices"
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
				b, err := st.Reserve(context.Background(), "geo", time.Now(), 1+(n+i)%7, interval)
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
	b1, err := st.Reserve(ctx, "k", fc.Now(), 3, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := st.Reserve(ctx, "k", fc.Now(), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !b1.First.Equal(t0) || !b2.First.Equal(t0.Add(3*time.Second)) || b2.Revision <= b1.Revision {
		t.Fatalf("blocks %+v %+v", b1, b2)
	}
	// Idle past the arrival time: the next block starts now, the unused
	// time is not saved up.
	fc.Advance(time.Hour)
	b3, err := st.Reserve(ctx, "k", fc.Now(), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !b3.First.Equal(fc.Now()) {
		t.Fatalf("after idle block at %v, want now %v", b3.First, fc.Now())
	}
	// Another node's Store, with no cached state, still continues after.
	other := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b4, err := other.Reserve(ctx, "k", fc.Now(), 1, time.Second)
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
				b, err := st.Reserve(ctx, "geo", time.Now(), 3, time.Millisecond)
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
