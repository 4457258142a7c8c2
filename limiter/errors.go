package limiter

import (
	"errors"
	"fmt"
	"time"
)

// ErrUnknownSource is returned for a source that was never configured.
var ErrUnknownSource = errors.New("limiter: unknown source")

// ErrInvalidConfig is returned when a configuration is out of range.
var ErrInvalidConfig = errors.New("limiter: invalid configuration")

// ErrGroupConflict is returned when a source joins a gateway group with a
// budget different from the one the group already has: members share one
// budget, so they must agree on it.
var ErrGroupConflict = errors.New("limiter: group budget conflict")

// ErrInvalidCost is returned for a cost below 1.
var ErrInvalidCost = errors.New("limiter: invalid cost")

// ErrCostExceedsCapacity is matched (errors.Is) by every *CostError.
var ErrCostExceedsCapacity = errors.New("limiter: cost exceeds capacity")

// CostError is returned at once, never after a wait, for a cost that no
// amount of waiting could admit: above the window's limit or the bucket's
// capacity. It names the bound, so a caller can say how to split the work.
type CostError struct {
	Cost  int
	Bound int // the most one request may cost
	// Window is the ceiling's window when Bound is its limit; zero when
	// Bound is the bucket's capacity (burst).
	Window time.Duration
}

func (e *CostError) Error() string {
	if e.Window > 0 {
		return fmt.Sprintf("limiter: cost %d exceeds the window's limit of %d per %v", e.Cost, e.Bound, e.Window)
	}
	return fmt.Sprintf("limiter: cost %d exceeds the bucket's capacity (burst) of %d", e.Cost, e.Bound)
}

// Is makes errors.Is(err, ErrCostExceedsCapacity) true.
func (e *CostError) Is(target error) bool { return target == ErrCostExceedsCapacity }

// ErrStillDown is returned by Acquire for a Request with StopAtReopen when,
// while it waited at the breaker, a half-open probe failed and the breaker
// opened again: the source is still down. The request was not admitted.
var ErrStillDown = errors.New("limiter: source still down (breaker opened again)")

// ErrShed is matched (errors.Is) by every *ShedError.
var ErrShed = errors.New("limiter: shed")

// ShedError reports that a request could not be admitted before its
// deadline. The fetch loop routes it to a fallback and records a shed event
// with Cause = Gate.
type ShedError struct {
	Gate Gate
	// Wait is how long the gate would have held the request past now; 0 when
	// the gate gives no estimate (concurrency slots, half-open probes).
	Wait time.Duration
}

func (e *ShedError) Error() string {
	return fmt.Sprintf("limiter: shed at %s gate (wait %v)", e.Gate, e.Wait)
}

// Is makes errors.Is(err, ErrShed) true.
func (e *ShedError) Is(target error) bool { return target == ErrShed }

// ErrSourceDown is matched (errors.Is) by every *DownError.
var ErrSourceDown = errors.New("limiter: source down")

// DownError reports that the breaker held a request that asked not to wait
// for it (Request.Fallback, Request.DownAfter). The request was not
// admitted.
type DownError struct {
	State   BreakerState // open, or half_open with every probe out
	Reopens int          // probes that failed since the breaker last closed
	Since   time.Time    // when the breaker opened after it last closed
	// Wait is how long until the breaker lets a probe through; 0 when a
	// probe is out and its outcome decides.
	Wait time.Duration
}

func (e *DownError) Error() string {
	return fmt.Sprintf("limiter: source down (breaker %s, %d failed probes)", e.State, e.Reopens)
}

// Is makes errors.Is(err, ErrSourceDown) true.
func (e *DownError) Is(target error) bool { return target == ErrSourceDown }
