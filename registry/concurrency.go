package registry

import (
	"context"
	"time"

	"github.com/auditd/auditd/limiter"
)

// MaxConcurrency bounds the requests in flight concurrency learning lets a
// source grow to when the operator configured none.
const MaxConcurrency = 64

// Concurrency learning. A server that refuses beyond N requests in flight
// answers every request sent with N or fewer in flight, and refuses those
// sent with more, whatever the pace: that is how its refusals are told
// from a rate's, which come at any number in flight.
const (
	// concDecrease cuts the slots after a refusal in flight (as
	// Netflix's concurrency-limits' AIMD backs off), never to more than
	// one below the number in flight the server refused.
	concDecrease = 0.9
	// concHold is how long the slots hold one below a number refused, at
	// full use, before they probe it again; each refused probe doubles it,
	// up to concMaxHold.
	concHold    = 30 * time.Second
	concMaxHold = 8 * time.Minute
	// concMemory is how long a success sent with n in flight shows that
	// the server takes n: a server whose limit fell refuses again.
	concMemory = time.Minute
)

// concLearner is what a source's concurrency learning keeps in memory.
type concLearner struct {
	okMax   int           // the most in flight a success was sent with, lately
	okMaxAt time.Time     // when okMax was last seen
	full    int           // successes sent with every slot in use since the slots last moved
	refused int           // the fewest in flight refused since a probe last held; 0 when none
	cutAt   time.Time     // when the slots were last cut
	hold    time.Duration // how long to hold below refused, at full use, before a probe
	probing bool          // the slots are at refused, a probe
}

// concStart is the slots a source starts with: what the operator
// configured, else the limiter's default.
func (e *entry) concStart() int {
	if e.src.Concurrency > 0 {
		return e.src.Concurrency
	}
	return limiter.DefaultConcurrency
}

// concCeil is the most slots e may have: the operator's configured
// concurrency, never exceeded, else MaxConcurrency.
func (e *entry) concCeil() int {
	if e.src.Concurrency > 0 {
		return e.src.Concurrency
	}
	return MaxConcurrency
}

// concurrency is the slots e has now: what was learned, within the
// ceiling, else the start.
func (e *entry) concurrency() int {
	if e.st.Concurrency > 0 {
		return min(e.st.Concurrency, e.concCeil())
	}
	return e.concStart()
}

// concChange is the old and new slots of a concurrency change from old.
func (e *entry) concChange(old state) (from, to int) {
	from = e.concStart()
	if old.Concurrency > 0 {
		from = min(old.Concurrency, e.concCeil())
	}
	return from, e.concurrency()
}

// learnConcurrency learns source e's concurrency from obs, sent with
// obs.InFlight requests in flight, and sets d.Concurrency (and
// d.ConcurrencyChanged when it moved). It reports whether obs was a refusal
// in flight: refused with more in flight than any success in the last
// minute (and there was one), and never with one alone. Such a refusal says nothing of the pace, and the
// rate's learning leaves it out. An observation with no count in flight
// teaches nothing here. Callers hold e.mu.
func (r *Registry) learnConcurrency(ctx context.Context, e *entry, obs *Observation, now time.Time, d *Decision) (bool, error) {
	d.Concurrency = e.concurrency()
	k := obs.InFlight
	if k <= 0 || e.group {
		return false, nil
	}
	c := &e.conc
	if c.okMax > 0 && now.Sub(c.okMaxAt) > concMemory {
		c.okMax = 0 // stale: the server may take fewer now
	}
	n := e.concurrency()
	switch {
	case obs.succeeded():
		if k >= c.okMax {
			c.okMax, c.okMaxAt = k, now
		}
		if c.probing && k >= n {
			// The server took as many in flight as it refused before.
			c.probing, c.refused, c.hold = false, 0, concHold
		}
		if k < n {
			return false, nil
		}
		// Every slot in use, and the server took it: after a round of
		// them (as many successes as slots), one slot more.
		if c.full++; c.full < n || n >= e.concCeil() {
			return false, nil
		}
		if c.refused > 0 && n+1 >= c.refused {
			if now.Sub(c.cutAt) < c.hold {
				return false, nil
			}
			c.probing = true
		}
		return false, r.setConcurrency(ctx, e, obs, n+1, now, d)
	case obs.refused():
		if k < 2 || k <= c.okMax || c.okMax == 0 {
			// A rate's refusal: it came with no more in flight than a
			// success; or no success lately says what the server takes
			// (an outage's 503s refuse at any number in flight).
			return false, nil
		}
		e.streak = 0 // the server is up, and counting
		if k > n {
			return true, nil // sent under more slots than there are now: cut already
		}
		if c.probing || (c.refused > 0 && k >= c.refused) {
			c.hold = min(2*c.hold, concMaxHold)
		}
		if c.hold == 0 {
			c.hold = concHold
		}
		c.probing, c.refused, c.cutAt = false, k, now
		next := max(1, min(k-1, int(concDecrease*float64(n))))
		return true, r.setConcurrency(ctx, e, obs, next, now, d)
	}
	return false, nil
}

// setConcurrency moves e's slots to n, recorded as a registry.changed of
// cause concurrency.
func (r *Registry) setConcurrency(ctx context.Context, e *entry, obs *Observation, n int, now time.Time, d *Decision) error {
	e.conc.full = 0
	old := e.st
	e.st.Concurrency = n
	c := change{cause: CauseConcurrency, runID: obs.RunID, sourceID: obs.SourceID}
	if obs.refused() {
		c.status = obs.Status
	}
	if err := r.commit(ctx, e, old, c); err != nil {
		return err
	}
	d.Concurrency, d.ConcurrencyChanged = e.concurrency(), true
	return nil
}

// movedConcurrency is s's slots when learning moved them from where a
// source starts, else 0: a snapshot names only what was learned.
func movedConcurrency(s State) int {
	start := s.Source.Concurrency
	if start == 0 {
		start = limiter.DefaultConcurrency
	}
	if s.Concurrency == start {
		return 0
	}
	return s.Concurrency
}
