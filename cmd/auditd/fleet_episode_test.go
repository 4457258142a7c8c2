package main

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/limiter"
)

// TestFleetCutsOnceAnEpisode drives one node's learning of a key against a
// real etcd: a refusal no hint explains cuts the fleet's limit to three
// quarters; further refusals with no success between them, refusals of
// requests admitted before the cut settled, and refusals the server
// explained (a Retry-After) cut nothing; after a success, the next
// settled refusal cuts again; a limit set by hand on the node becomes the
// fleet's, and a quota the server advertises below it holds the fleet to
// it.
func TestFleetCutsOnceAnEpisode(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	store := fleet.NewStore(etcdtest.NewClient(t, cluster.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	start := fleet.Rate{Limit: 100, Window: 10 * time.Second}
	if _, err := store.Start(ctx, "geo", start, "other"); err != nil {
		t.Fatal(err)
	}
	slots, err := fleet.NewSlots(store, clock.Real{}, fleet.Config{Key: "geo", Rate: fleet.Rate{Limit: 20, Window: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var learned []float64 // per second, as the node applied them
	l := startLearning(store, slots, "geo", "n1", start, fleet.Rate{Limit: 20, Window: time.Second}, func(e fleet.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == fleet.EventLearned {
			learned = append(learned, ratePerSecond(e.Limit.Rate))
		}
	})
	t.Cleanup(func() { l.stop(context.Background()) })

	// applied waits until the node applies a limit of want a second and
	// returns when it did.
	applied := func(want float64) time.Time {
		t.Helper()
		for range 500 {
			l.mu.Lock()
			lim, at := l.limit, l.applied
			l.mu.Unlock()
			if ratePerSecond(lim.Rate) == want {
				return at
			}
			time.Sleep(10 * time.Millisecond)
		}
		lim, _ := l.Limit()
		t.Fatalf("the node never applied %g/s; it holds %+v", want, lim)
		return time.Time{}
	}
	// stored returns the fleet's limit once no cut is on its way.
	stored := func() fleet.Limit {
		t.Helper()
		for l.cutting.Load() {
			time.Sleep(5 * time.Millisecond)
		}
		lim, err := store.Limit(ctx, "geo")
		if err != nil {
			t.Fatal(err)
		}
		return lim
	}
	at := applied(10)
	settled := func() time.Time { return at.Add(fleet.Settle + time.Millisecond) }

	l.observed(settled(), limiter.ClassThrottled, hints.Hint{})
	if got := stored(); ratePerSecond(got.Rate) != 7.5 || got.Refused != start || got.By != "n1" {
		t.Fatalf("after a refusal the fleet's limit is %+v, want 7.5/s, refused at 10/s", got)
	}
	at = applied(7.5)
	l.observed(settled(), limiter.ClassThrottled, hints.Hint{}) // no success since the cut
	if got := stored(); ratePerSecond(got.Rate) != 7.5 {
		t.Fatalf("a second refusal of one episode cut to %+v", got.Rate)
	}
	l.observed(at, limiter.ClassSuccess, hints.Hint{})
	l.observed(at.Add(time.Second), limiter.ClassThrottled, hints.Hint{})                                   // admitted before the cut settled
	l.observed(settled(), limiter.ClassThrottled, hints.Hint{RetryAfter: time.Second, HasRetryAfter: true}) // the server said when: a pause
	if got := stored(); ratePerSecond(got.Rate) != 7.5 {
		t.Fatalf("an unsettled or explained refusal cut to %+v", got.Rate)
	}
	l.observed(settled(), limiter.ClassThrottled, hints.Hint{})
	if got := stored(); ratePerSecond(got.Rate) != 5.6 {
		t.Fatalf("a settled refusal after a success left %+v, want 5.6/s", got.Rate)
	}
	applied(5.6)
	// An operator's limit, set on this node, is the fleet's: written
	// whatever it was, the refusal forgotten.
	l.setByHand(fleet.Rate{Limit: 9, Window: time.Second})
	applied(9)
	if got := stored(); got.Refused != (fleet.Rate{}) || got.By != "n1" {
		t.Errorf("after the operator's limit the fleet holds %+v, want 9/s by n1 and no refusal", got)
	}
	// A quota the server advertises holds the fleet to it; one above the
	// limit in force changes nothing.
	quota := func(n int) hints.Hint {
		return hints.Hint{Limit: n, HasLimit: true, Window: time.Minute, HasWindow: true}
	}
	l.observed(settled(), limiter.ClassSuccess, quota(1200)) // 20/s
	if got := stored(); ratePerSecond(got.Rate) != 9 {
		t.Fatalf("a quota above the limit moved it to %+v", got.Rate)
	}
	l.observed(settled(), limiter.ClassSuccess, quota(300)) // 5/s
	if got := stored(); ratePerSecond(got.Rate) != 5 || got.Refused != (fleet.Rate{Limit: 300, Window: time.Minute}) {
		t.Fatalf("an advertised 5/s left the fleet at %+v", got)
	}
	applied(5)
	if ok, refused := l.ok.Load(), l.refused.Load(); ok != 3 || refused != 5 {
		t.Errorf("counted %d answers and %d refusals, want 3 and 5", ok, refused)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(learned) != 5 || learned[0] != 10 || learned[1] != 7.5 || learned[2] != 5.6 || learned[3] != 9 || learned[4] != 5 {
		t.Errorf("fleet.learned events at %v a second, want 10, 7.5, 5.6, 9, 5", learned)
	}
}

// ratePerSecond is r a second, to the thousandth.
func ratePerSecond(r fleet.Rate) float64 {
	return math.Round(1000*r.PerSecond()) / 1000
}
