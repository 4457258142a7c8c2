package limiter

import (
	"fmt"
	"maps"
	"time"

	"github.com/auditd/auditd/hints"
)

// GateFleet holds a request that its budget admits while the node holds no
// fleet slot for it yet (a Shared attached with Share): the next slot is
// later, or the node has none and waits for a grant, which a node cut off
// from the fleet's store never gets.
const GateFleet Gate = "fleet"

// Shared is a budget's share of a limit that several nodes keep together
// (package fleet's Slots): the node's slots, handed out with no call to the
// shared store on the way. Acquire consults it at the head of the budget's
// queue, after the budget's own gates admit, and takes from it in the same
// step as the budget counts the request.
type Shared interface {
	// Check rejects a cost the shared side could never serve at once.
	Check(cost int) error
	// Earliest returns when cost slots can be taken, at or after now;
	// false when the node holds too few (it asks for more; wait on
	// Changed), or when Check now refuses cost (it asks for nothing:
	// Acquire checks the cost again before it asks).
	Earliest(now time.Time, cost int) (time.Time, bool)
	// Take spends cost slots at now, or nothing and false when Earliest
	// is after now.
	Take(now time.Time, cost int) bool
	// Changed is closed at the next change a waiter could care about (a
	// grant, a pause).
	Changed() <-chan struct{}
	// Pause tells the fleet of a pause this node saw (Limiter.Pause). It
	// must not block on the shared store: a Retry-After is recorded and
	// obeyed here whether or not the fleet can be told.
	Pause(until time.Time)
	// BreakerOpened tells the fleet that this node's breaker of a source
	// of the budget opened until until, when its half-open probe may go:
	// every node pauses until then, and the others a little longer, so
	// that this node's probe decides. It must not block, as Pause.
	BreakerOpened(until time.Time)
	// Lag is how long after a slot is taken its request may still reach
	// the upstream: the slots are spaced for it. A request that cannot
	// leave by then must not be sent (Permit.SendBy).
	Lag() time.Duration
}

// Learner is a Shared that learns its key's rate for the whole fleet
// (package fleet's learner): its slots are handed out at the rate the
// fleet learned, so the node's own learned pace would only hold the node to
// a share of it. While a Learner is attached, the budget paces at its
// ceiling alone (SetLimit is not applied), and the Learner is told of every
// response.
type Learner interface {
	Shared
	// Observed tells of the response to a request admitted at admitted:
	// its class and its parsed rate-limit headers (whether the server said
	// when to come back, which makes a refusal a pause rather than a sign
	// the pace is too fast; the quota it advertises).
	Observed(admitted time.Time, c Class, h hints.Hint)
	// SetByHand makes limit per window the fleet's limit of the key: an
	// operator set it (Limiter.SetLimitByHand). It must not block on the
	// shared store.
	SetByHand(limit int, window time.Duration)
}

// Share attaches s to the budget of key: a gateway group's name for its
// members, or a source id for a source in no group. From then on that
// budget admits a request only when s also hands it a slot. A nil s
// detaches. Without a Shared a budget admits exactly as before.
func (l *Limiter) Share(key string, s Shared) {
	l.mu.Lock()
	defer l.mu.Unlock()
	next := map[string]Shared{}
	if old := l.shared.Load(); old != nil {
		next = maps.Clone(*old)
	}
	if s == nil {
		delete(next, key)
	} else {
		next[key] = s
	}
	if len(next) == 0 {
		l.shared.Store(nil)
	} else {
		l.shared.Store(&next)
	}
	_, learns := s.(Learner)
	for _, src := range *l.sources.Load() {
		src.mu.Lock()
		if learns && (src.id == key || src.cfg.Group == key) {
			_ = src.budget.SetLimit(0, 0) // the fleet's slots pace it: the ceiling alone here
		}
		src.broadcast() // waiters look again
		src.mu.Unlock()
	}
}

// learnerOf returns the Learner attached to source id's budget, or nil.
func (l *Limiter) learnerOf(id string, cfg Config) Learner {
	lr, _ := l.sharedOf(id, cfg).(Learner)
	return lr
}

// sharedOf returns the Shared of a source with cfg, or nil: one atomic load
// when nothing is shared.
func (l *Limiter) sharedOf(id string, cfg Config) Shared {
	m := l.shared.Load()
	if m == nil {
		return nil
	}
	if cfg.Group != "" {
		id = cfg.Group
	}
	return (*m)[id]
}

// CheckShared returns why the Shared attached to source id's budget could
// never serve a request of cost at once (Shared.Check: the fleet hands a
// cost as that many slots within one grace), which Acquire would refuse
// with ErrCostExceedsCapacity; nil when it could, or none is attached.
func (l *Limiter) CheckShared(id string, cost int) error {
	s, err := l.source(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	sh := l.sharedOf(id, s.cfg)
	s.mu.Unlock()
	if sh == nil {
		return nil
	}
	return sh.Check(cost)
}

// takeShared is the fleet gate at the head of the budget's queue: it takes
// cost slots from sh at now, or returns the gate's wait (0 when unknown)
// and the channel to wait on.
func takeShared(sh Shared, now time.Time, cost int) (bool, time.Duration, <-chan struct{}) {
	ch := sh.Changed() // before Earliest: a grant in between still wakes the waiter
	at, ok := sh.Earliest(now, cost)
	switch {
	case !ok:
		return false, 0, ch
	case at.After(now):
		return false, at.Sub(now), ch
	case !sh.Take(now, cost):
		return false, 0, ch
	}
	return true, 0, nil
}

// checkShared is sh.Check as Acquire refuses it; a cost of one, a single
// slot, needs no check (the fleet gate asks on every look).
func checkShared(sh Shared, id string, cost int) error {
	if sh == nil || cost <= 1 {
		return nil
	}
	if err := sh.Check(cost); err != nil {
		return fmt.Errorf("acquire %s: %w: %w", id, ErrCostExceedsCapacity, err)
	}
	return nil
}
