package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// TestReservationsNeedAQuorum stops one member of three, the leader, and
// reservations go on; stops a second and they fail, granting nothing, and
// the slots granted before stay disjoint.
func TestReservationsNeedAQuorum(t *testing.T) {
	c := etcdtest.Start(t, 3)
	st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	var blocks []fleet.Block
	reserve := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		b, err := st.Reserve(ctx, "geo", fleet.Ask{From: time.Now(), Count: 10, Interval: time.Millisecond})
		if err == nil {
			blocks = append(blocks, b)
		}
		return err
	}
	if err := reserve(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	lead := c.Leader()
	if lead < 0 {
		t.Fatal("no leader")
	}
	c.Members[lead].Stop()
	for i := range 5 {
		if err := reserve(10 * time.Second); err != nil { // a new leader is elected meanwhile
			t.Fatalf("reservation %d with two of three members: %v", i, err)
		}
	}
	second := (lead + 1) % 3
	c.Members[second].Stop()
	for i := range 2 {
		if err := reserve(time.Second); err == nil {
			t.Fatalf("reservation %d granted with one member of three", i)
		}
	}
	// A node's Slots on the cluster without a quorum reports the cut and
	// hands out nothing it was not granted.
	events := make(chan fleet.Event, 64)
	s, err := fleet.NewSlots(st, clock.Real{}, fleet.Config{Key: "geo", Rate: fleet.Rate{Limit: 100, Window: time.Second},
		Timeout: 500 * time.Millisecond, Notify: func(e fleet.Event) { events <- e }})
	if err != nil {
		t.Fatal(err)
	}
	s.Open()
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	if _, ok := s.Earliest(time.Now(), 1); ok {
		t.Fatal("a slot without a quorum")
	}
	if e := next(t, events); e.Kind != fleet.EventCutOff {
		t.Fatalf("event %+v, want cut_off", e)
	}
	if st := s.Stats(); st.Reserved != 0 || !st.CutOff {
		t.Fatalf("stats %+v", st)
	}
	if len(blocks) != 6 {
		t.Fatalf("%d blocks, want 6", len(blocks))
	}
	assertDisjoint(t, blocks)
}
