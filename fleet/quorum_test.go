package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
)

// TestReservationsNeedAQuorum stops one member of three, the leader, and
// reservations go on; stops a second and they fail, granting nothing, and
// the slots granted before stay disjoint.
func TestReservationsNeedAQuorum(t *testing.T) {
	c := startCluster(t, 3)
	st := fleet.NewStore(newClient(t, c.endpoints()...), clock.Real{}, "")
	var blocks []fleet.Block
	reserve := func(timeout time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		b, err := st.Reserve(ctx, "geo", 10, time.Millisecond)
		if err == nil {
			blocks = append(blocks, b)
		}
		return err
	}
	if err := reserve(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	lead := c.leader()
	if lead < 0 {
		t.Fatal("no leader")
	}
	c.members[lead].stop()
	for i := range 5 {
		if err := reserve(10 * time.Second); err != nil { // a new leader is elected meanwhile
			t.Fatalf("reservation %d with two of three members: %v", i, err)
		}
	}
	second := (lead + 1) % 3
	c.members[second].stop()
	for i := range 3 {
		if err := reserve(time.Second); err == nil {
			t.Fatalf("reservation %d granted with one member of three", i)
		}
	}
	if len(blocks) != 6 {
		t.Fatalf("%d blocks, want 6", len(blocks))
	}
	assertDisjoint(t, blocks)
}
