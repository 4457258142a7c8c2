// Package clock is the seam between auditd and time. Everything that paces,
// waits or times out takes a Clock, so tests drive time by hand (Fake) and run
// in microseconds instead of sleeping.
//
// Pacing uses differences of Now values, which carry Go's monotonic reading
// for the real clock; wall time is recorded, never used for pacing.
package clock

import (
	"context"
	"time"
)

// Clock tells the time and makes timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that auditd uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// Real is the system clock.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a *time.Timer behind the Timer interface.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.t.C }
func (t realTimer) Stop() bool          { return t.t.Stop() }

// Sleep waits for d on c, or until ctx is done, whichever is first; it returns
// ctx.Err() when ctx ended the wait. A d <= 0 returns at once.
func Sleep(ctx context.Context, c Clock, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
