package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// keptEvents is an auditd.Appender that keeps what it is given.
type keptEvents struct {
	mu     sync.Mutex
	events []auditd.Event
}

func (k *keptEvents) Append(_ context.Context, e auditd.Event) (auditd.Event, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.events = append(k.events, e)
	return e, nil
}

// fleetNodeOn returns a fleet node of etcd at endpoint, sharing the
// sources of its registry once synced, with no run goroutine: the test
// calls sync and applyPause itself. Its shares are closed at cleanup.
func fleetNodeOn(t *testing.T, endpoint string) (*fleetNode, *registry.Registry, *limiter.Limiter, *keptEvents) {
	t.Helper()
	client := etcdtest.NewClient(t, endpoint)
	db, err := bolt.Open(filepath.Join(t.TempDir(), "auditd.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	led := &keptEvents{}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clock.Real{}})
	if err != nil {
		t.Fatal(err)
	}
	lim := limiter.New(clock.Real{})
	n := &fleetNode{node: "n1", lag: defaultFleetLag, client: client, store: fleet.NewStore(client, clock.Real{}, ""),
		lim: lim, reg: reg, led: led, log: slog.New(slog.DiscardHandler), shares: map[string]*fleetShare{}, groups: map[string]bool{},
		wake: make(chan struct{}, 1), done: make(chan struct{})}
	t.Cleanup(func() {
		n.mu.Lock()
		shares := n.shares
		n.shares = nil
		n.mu.Unlock()
		for _, s := range shares {
			n.closeShare(s)
		}
	})
	return n, reg, lim, led
}

// putSource puts source id, in group when not empty, at 10 a second in
// reg and lim, as serve's fetch loop configures its gates.
func putSource(t *testing.T, reg *registry.Registry, lim *limiter.Limiter, id, group string) {
	t.Helper()
	src := auditd.Source{ID: id, BaseURL: "http://upstream.test", Group: group, Limit: 10, Window: auditd.Duration(time.Second)}
	if err := reg.PutSource(context.Background(), "test", src); err != nil {
		t.Fatal(err)
	}
	if err := lim.Configure(id, limiter.ConfigFromSource(src)); err != nil {
		t.Fatal(err)
	}
}

// TestFleetGroupPausesReachAMemberStill: a gateway group's share outlives
// the member it was first found by when the group's ceiling is unchanged.
// Once that member has left the group, a pause the fleet learns still
// pauses the group's budget, through a member still in it, and not the
// budget the member that left now has of its own.
func TestFleetGroupPausesReachAMemberStill(t *testing.T) {
	n, reg, lim, _ := fleetNodeOn(t, etcdtest.Start(t, 1).Endpoints()[0])
	putSource(t, reg, lim, "a", "gw")
	putSource(t, reg, lim, "b", "gw")
	n.sync()
	first := n.shares["gw"]
	if first == nil || first.member != "a" {
		t.Fatalf("the group's share %+v, want one found by its member a", first)
	}
	putSource(t, reg, lim, "a", "") // a leaves the group; b keeps the group's ceiling as it was
	n.sync()
	if n.shares["gw"] != first {
		t.Fatal("the group's share was remade: its ceiling changed, and this test tests nothing")
	}
	until := time.Now().Add(time.Minute).Round(0)
	n.applyPause(fleet.Event{Kind: fleet.EventPaused, Key: "gw", Pause: fleet.Pause{Key: "gw", Until: until}})
	group, err := lim.Budget("b")
	if err != nil {
		t.Fatal(err)
	}
	if got := group.PausedUntil(); got.Before(until) {
		t.Errorf("the group's budget paused until %v, want %v", got, until)
	}
	own, err := lim.Budget("a")
	if err != nil {
		t.Fatal(err)
	}
	if got := own.PausedUntil(); !got.IsZero() {
		t.Errorf("a, out of the group, had its own budget paused until %v for the group", got)
	}
}

// TestFleetCloseRecordsAPauseOnItsWay: a pause the node saw as it stops,
// its write to etcd on its way, is handed to the ledger before close
// returns, a gateway group's under Group though its share is gone by
// then. Here etcd is cut off: the writes fail at their timeout, and the
// pauses, held here, are recorded as local ones (revision 0).
func TestFleetCloseRecordsAPauseOnItsWay(t *testing.T) {
	proxy := etcdtest.StartProxy(t, etcdtest.Start(t, 1).Endpoints()[0])
	n, reg, lim, led := fleetNodeOn(t, proxy.URL())
	n.cancel = func() {} // no run goroutine
	close(n.done)
	putSource(t, reg, lim, "a", "")
	putSource(t, reg, lim, "b", "gw")
	n.sync()
	s, g := n.shares["a"], n.shares["gw"]
	if s == nil || g == nil {
		t.Fatalf("source a and group gw shared: %v, %v", s != nil, g != nil)
	}
	proxy.Cut()
	s.Pause(time.Now().Add(time.Minute))
	g.Pause(time.Now().Add(time.Minute))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a guard against a hang
	defer cancel()
	_ = n.close(ctx) // the revoke fails, etcd cut off
	led.mu.Lock()
	defer led.mu.Unlock()
	var source, group bool
	for _, e := range led.events {
		if e.Type != auditd.EventFleetPaused {
			continue
		}
		source = source || e.SourceID == "a" && e.Group == ""
		group = group || e.Group == "gw" && e.SourceID == ""
	}
	if !source || !group {
		t.Fatalf("close returned with the source's pause recorded %v, the group's %v (under Group); recorded %d events", source, group, len(led.events))
	}
}

// TestFleetLearningStopWaitsForItsCalls: a cut on its way when the key's
// learning stops (its share closed or remade, the node stopping) is
// written before stop returns, as the key's pauses and limits set by hand
// are; once stopped, the learning starts none.
func TestFleetLearningStopWaitsForItsCalls(t *testing.T) {
	store, _, l := learningOnEtcd(t, func(fleet.Event) {})
	to := fleet.Rate{Limit: 50, Window: 10 * time.Second}
	if !l.cut(func() (limitCut, bool) {
		<-l.ctx.Done()                     // the learning is stopping
		time.Sleep(100 * time.Millisecond) // a slow etcd's answer
		return limitCut{to, to, fleet.CauseRefused}, true
	}) {
		t.Fatal("the cut did not start")
	}
	l.stop(context.Background())
	if lim, err := store.Limit(context.Background(), "geo"); err != nil || lim.Rate != to {
		t.Fatalf("the limit when stop returned: %v (%v), want %v, cut before it returned", lim.Rate, err, to)
	}
	if l.cut(func() (limitCut, bool) { return limitCut{}, false }) {
		t.Fatal("a cut started once the learning had stopped")
	}
}

// TestFleetSpacesSlotsForAnAdvertisedQuota: the fleet's limit is 100 per
// 10 s, under the told ceiling of 20 a second; the server advertises 10
// a second. The node's next block is spaced for the quota's window, not
// for the limit's ten seconds (fleet.Slots.SetRate), and stays so through
// answers without the quota for a minute (quotaMemory).
func TestFleetSpacesSlotsForAnAdvertisedQuota(t *testing.T) {
	ctx := context.Background()
	cluster := etcdtest.Start(t, 1)
	store := fleet.NewStore(etcdtest.NewClient(t, cluster.Endpoints()...), clock.Real{}, "")
	start, ceiling := fleet.Rate{Limit: 100, Window: 10 * time.Second}, fleet.Rate{Limit: 20, Window: time.Second}
	if _, err := store.Start(ctx, "geo", start, "other"); err != nil {
		t.Fatal(err)
	}
	blocks := make(chan fleet.Block, 8)
	slots, err := fleet.NewSlots(store, clock.Real{}, fleet.Config{Key: "geo", Rate: ceiling, Notify: func(e fleet.Event) {
		if e.Kind == fleet.EventReserved {
			blocks <- e.Block
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	learned := make(chan fleet.Limit, 8)
	fc := clock.NewFake(time.Now()) // the learning's own clock: when the quota was last seen
	l := startLearning(store, slots, fc, "geo", "n1", start, ceiling, func(e fleet.Event) {
		if e.Kind == fleet.EventLearned {
			learned <- e.Limit
		}
	})
	t.Cleanup(func() { l.stop(ctx) })
	select {
	case <-learned:
	case <-time.After(10 * time.Second): // a guard against a hang
		t.Fatal("the fleet's limit was never applied")
	}
	quota := fleet.Rate{Limit: 10, Window: time.Second}
	l.observed(time.Now(), limiter.ClassSuccess, hints.Hint{Limit: quota.Limit, HasLimit: true, Window: quota.Window, HasWindow: true})
	slots.Open()
	t.Cleanup(func() { _ = slots.Close(ctx) })
	slots.Earliest(time.Now(), 1)
	select {
	case b := <-blocks:
		if want := fleet.Interval(quota, fleet.DefaultGrace, fleet.DefaultMaxSkew); b.Interval != want {
			t.Fatalf("a block spaced %v, want %v: the advertised quota's spacing (the limit's own is %v)",
				b.Interval, want, fleet.Interval(start, fleet.DefaultGrace, fleet.DefaultMaxSkew))
		}
	case <-time.After(10 * time.Second): // a guard against a hang
		t.Fatal("no block reserved")
	}
	// Answers without the quota (a server that puts it on some answers
	// only) keep it for a minute, then the guard goes.
	kept := func() fleet.Rate {
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.quota
	}
	fc.Advance(59 * time.Second)
	l.observed(fc.Now(), limiter.ClassSuccess, hints.Hint{})
	if q := kept(); q != quota {
		t.Fatalf("the quota kept 59 s after an answer carried it: %v, want %v", q, quota)
	}
	fc.Advance(2 * time.Second)
	l.observed(fc.Now(), limiter.ClassSuccess, hints.Hint{})
	if q := kept(); q != (fleet.Rate{}) {
		t.Fatalf("the quota kept 61 s after an answer carried it: %v, want none", q)
	}
}
