package fleet_test

import (
	"context"
	"fmt"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
)

// A caller's gate: ask when a slot can be taken, wait for it (or for a block
// when none is held), then take it. The limiter's Acquire would do the same
// under its budget's lock.
func ExampleSlots() {
	fc := clock.NewFake(t0)
	s, _ := fleet.NewSlots(newMemBackend(fc), fc, fleet.Config{Key: "geo", Rate: fleet.Rate{Limit: 10, Window: time.Second}})
	s.Open()
	defer s.Close(context.Background())

	for taken := 0; taken < 3; {
		changed := s.Changed()
		at, ok := s.Earliest(fc.Now(), 1)
		switch {
		case !ok:
			<-changed // a block is on its way (or the node is cut off)
		case at.After(fc.Now()):
			fc.Set(at) // a real caller sleeps on its clock
		case s.Take(fc.Now(), 1):
			fmt.Println("sent at", fc.Now().Sub(t0))
			taken++
		}
	}
	// Output:
	// sent at 0s
	// sent at 103ms
	// sent at 206ms
}
