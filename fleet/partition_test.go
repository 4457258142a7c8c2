package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// TestPartitionedNodeStopsAtItsBlock cuts one node's connection to etcd (a
// TCP proxy between its client and the cluster) while another node keeps
// its own: the cut node hands out the slots it holds and then none, reports
// the cut, and resumes once the proxy heals; the other never stops.
func TestPartitionedNodeStopsAtItsBlock(t *testing.T) {
	c := etcdtest.Start(t, 1)
	px := etcdtest.StartProxy(t, c.Endpoints()[0])
	events := make(chan fleet.Event, 256)
	cfg := fleet.Config{Key: "geo", Rate: fleet.Rate{Limit: 100, Window: time.Second}, Block: 200 * time.Millisecond,
		Timeout: 300 * time.Millisecond, Retry: 50 * time.Millisecond,
		Notify: func(e fleet.Event) {
			if e.Kind != fleet.EventReserved {
				events <- e
			}
		}}
	cut, err := fleet.NewSlots(fleet.NewStore(etcdtest.NewClient(t, px.URL()), clock.Real{}, ""), clock.Real{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Notify = nil
	other, err := fleet.NewSlots(fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, ""), clock.Real{}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*fleet.Slots{cut, other} {
		s.Open()
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	ctx := context.Background()
	waitFor(t, ctx, cut, 20) // grown past its first small blocks

	px.Cut()
	cutAt := cut.Stats()
	// Take everything the cut node can: its held slots and whatever it
	// reserves before its client notices, then nothing.
	var e fleet.Event
	for e.Kind != fleet.EventCutOff {
		select {
		case e = <-events:
		default:
			tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
			_, _ = take(tctx, cut)
			cancel()
		}
	}
	if e.Err == nil {
		t.Fatalf("cut_off without a cause: %+v", e)
	}
	guard := time.Now().Add(10 * time.Second) // a guard against a hang
	for cut.Stats().Held > 0 && time.Now().Before(guard) {
		tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		_, _ = take(tctx, cut)
		cancel()
	}
	st := cut.Stats()
	if _, ok := cut.Earliest(time.Now(), 1); ok || !st.CutOff || st.Held != 0 {
		t.Fatalf("cut node still has slots: %+v", st)
	}
	if st.Used > st.Reserved {
		t.Fatalf("cut node used %d, reserved %d", st.Used, st.Reserved)
	}
	if cutAt.Held > 0 && st.Used == cutAt.Used {
		t.Fatalf("cut node held %d at the cut and handed out none", cutAt.Held)
	}
	t.Logf("cut node: held %d at the cut, used %d of %d reserved in all", cutAt.Held, st.Used, st.Reserved)

	// The rest of the fleet carries on.
	before := other.Stats().Reserved
	waitFor(t, ctx, other, int(before)+1)

	px.Heal()
	for e.Kind != fleet.EventRejoined {
		select {
		case e = <-events:
		case <-time.After(10 * time.Second): // a guard against a hang
			t.Fatal("no rejoin after healing")
		}
	}
	waitFor(t, ctx, cut, int(st.Reserved)+1)
	if cut.Stats().CutOff {
		t.Fatal("still cut off after rejoining")
	}
}

// waitFor takes slots of s until it has been granted at least n in all.
func waitFor(t *testing.T, ctx context.Context, s *fleet.Slots, n int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a guard against a hang
	defer cancel()
	for s.Stats().Reserved < int64(n) {
		if ctx.Err() != nil {
			t.Fatalf("granted %d, want %d", s.Stats().Reserved, n)
		}
		tctx, c := context.WithTimeout(ctx, 20*time.Millisecond)
		_, _ = take(tctx, s)
		c()
	}
}
