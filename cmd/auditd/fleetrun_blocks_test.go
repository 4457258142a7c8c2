package main

import (
	"testing"
	"time"

	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/pack"
)

// A fleet pack reads the blocks of slots from the fleet.reserved events
// a fleet node writes: pack.ReservedBlock reads back what fleetNode.event
// records, for a source's key and a gateway group's.
func TestReservedBlockReadsFleetEvents(t *testing.T) {
	n := &fleetNode{node: "east-1", shares: map[string]*fleetShare{"gateway": {member: "gw-a", group: true}}, groups: map[string]bool{"gateway": true}}
	first := time.Date(2026, 12, 4, 9, 0, 0, 123456789, time.UTC)
	for _, key := range []string{"county", "gateway"} {
		b := fleet.Block{First: first, Interval: 41200 * time.Microsecond, Count: 24, Revision: 4121}
		ev := n.event(fleet.Event{Kind: fleet.EventReserved, Key: key, At: first, Block: b})
		got, ok := pack.ReservedBlock(&ev)
		want := pack.FleetBlock{Source: key, First: first.UnixNano(), Interval: int64(b.Interval), Count: 24, Revision: 4121}
		if !ok || got != want {
			t.Errorf("key %s: %s read back as %+v (%v), want %+v", key, ev.Detail, got, ok, want)
		}
		paused := n.event(fleet.Event{Kind: fleet.EventPaused, Key: key, Pause: fleet.Pause{Key: key, Until: first, Revision: 9}})
		if _, ok := pack.ReservedBlock(&paused); ok {
			t.Errorf("a fleet.paused event read as a block: %+v", paused)
		}
	}
}
