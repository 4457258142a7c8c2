package fleet_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// TestPauseReachesEveryNode has one of three nodes pause a key and reports
// how long the pause took from the write to each node's watch. Every node,
// the writer included, drops its held slots before the pause, and every
// block granted afterwards starts after it.
func TestPauseReachesEveryNode(t *testing.T) {
	c := etcdtest.Start(t, 3)
	const nodes, rounds = 3, 10
	type seen struct {
		node int
		p    fleet.Pause
		at   time.Time
	}
	paused := make(chan seen, nodes*rounds*2)
	var all []*fleet.Slots
	var stores []*fleet.Store
	for n := range nodes {
		st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()[n]), clock.Real{}, "")
		s, err := fleet.NewSlots(st, clock.Real{}, fleet.Config{Key: "geo", Rate: fleet.Rate{Limit: 100, Window: time.Second},
			Notify: func(e fleet.Event) {
				if e.Kind == fleet.EventPaused {
					paused <- seen{n, e.Pause, time.Now()}
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		s.Open()
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		all, stores = append(all, s), append(stores, st)
		s.Earliest(time.Now(), 1) // hold a block
	}
	waitHeld(t, all)

	var lat, writes []time.Duration
	for r := range rounds {
		until := time.Now().Add(time.Duration(r+1) * 200 * time.Millisecond)
		wrote := time.Now()
		p, err := stores[0].Pause(context.Background(), "geo", until)
		if err != nil {
			t.Fatal(err)
		}
		writes = append(writes, time.Since(wrote))
		got := map[int]bool{}
		for len(got) < nodes {
			select {
			case s := <-paused:
				if s.p.Revision == p.Revision && !got[s.node] {
					got[s.node] = true
					lat = append(lat, s.at.Sub(wrote))
				}
			case <-time.After(10 * time.Second): // a guard against a hang
				t.Fatalf("round %d: %d of %d nodes saw the pause", r, len(got), nodes)
			}
		}
		for n, s := range all {
			if at, ok := s.Earliest(time.Now(), 1); ok && at.Before(p.Until) {
				t.Fatalf("node %d hands out a slot at %v inside the pause until %v", n, at, p.Until)
			}
			if st := s.Stats(); st.PausedUntil.Before(p.Until) {
				t.Fatalf("node %d paused until %v, want %v", n, st.PausedUntil, p.Until)
			}
		}
		b, err := stores[1].Reserve(context.Background(), "geo", fleet.Ask{From: time.Now(), Count: 1, Interval: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if b.First.Before(p.Until) {
			t.Fatalf("block at %v granted inside the pause until %v", b.First, p.Until)
		}
	}
	slices.Sort(lat)
	slices.Sort(writes)
	t.Logf("pause, from the call to write it to each of 3 watchers (%d observations): p50 %v, p90 %v, max %v; the write alone: p50 %v, max %v",
		len(lat), lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1], writes[len(writes)/2], writes[len(writes)-1])
}

// waitHeld waits until every Slots has been granted a block.
func waitHeld(t *testing.T, all []*fleet.Slots) {
	t.Helper()
	for n, s := range all {
		for s.Stats().Reserved == 0 {
			select {
			case <-s.Changed():
			case <-time.After(10 * time.Second): // a guard against a hang
				t.Fatalf("node %d got no block", n)
			}
		}
	}
}

// TestBreakerPauseNamesItsNode: a pause written for a node's breaker
// (PauseFor) reaches another node's watch naming that node; a plain pause
// that ends sooner leaves it as it is, and one that ends later replaces it,
// naming nobody.
func TestBreakerPauseNamesItsNode(t *testing.T) {
	c := etcdtest.Start(t, 1)
	writer := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()[0]), clock.Real{}, "")
	other := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()[0]), clock.Real{}, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	seen := make(chan fleet.Pause, 8)
	go func() { _ = other.Watch(ctx, "geo", seen) }()
	next := func() fleet.Pause {
		t.Helper()
		for {
			select {
			case p := <-seen:
				if !p.Until.IsZero() {
					return p
				}
			case <-time.After(10 * time.Second): // a guard against a hang
				t.Fatal("the watch saw no pause")
			}
		}
	}
	until := time.Now().Add(time.Minute).Round(0)
	p, err := writer.PauseFor(ctx, "geo", until, "node2")
	if err != nil || p.Breaker != "node2" || !p.Until.Equal(until) {
		t.Fatalf("PauseFor: %+v, %v", p, err)
	}
	if got := next(); got.Breaker != "node2" || !got.Until.Equal(until) || got.Revision != p.Revision {
		t.Fatalf("the other node saw %+v, want node2's breaker pause %+v", got, p)
	}
	if kept, err := other.Pause(ctx, "geo", until.Add(-time.Second)); err != nil || kept.Breaker != "node2" || !kept.Until.Equal(until) {
		t.Fatalf("a shorter plain pause: %+v, %v; want node2's kept", kept, err)
	}
	longer, err := other.Pause(ctx, "geo", until.Add(time.Second))
	if err != nil || longer.Breaker != "" {
		t.Fatalf("a longer plain pause: %+v, %v; want it naming nobody", longer, err)
	}
	if got := next(); got.Breaker != "" || !got.Until.Equal(until.Add(time.Second)) {
		t.Fatalf("the watch then saw %+v, want the plain pause", got)
	}
}
