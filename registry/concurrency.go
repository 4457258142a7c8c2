package registry

import (
	"context"
	"time"

	"github.com/auditd/auditd"
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
	// slotsFill is the share of what the slots let through (slots over the
	// latency) past which a pace no longer binds: its rounds, held back by
	// the slots, prove nothing of it, and it grows no further.
	slotsFill = 0.9
	// slotsSlack is how far past what the slots let through a pace may
	// stand while they hold: beyond it, the pace comes down to slotsAbove
	// times it (cause slots), so that the pace shown is the one acted on.
	// A little above, not at it: a pace rounded down to whole requests
	// under what the slots let through would bind in their place, and
	// so would one cut by a refusal the slots' count mistook for the
	// pace's (a request counted out before the server counted it out),
	// each costing a few percent of what the server allows.
	slotsSlack = 1.15
	slotsAbove = 1.1
	// latencyWeight is the weight of a success's latency in the source's
	// running mean (an exponentially weighted moving average).
	latencyWeight = 0.1
)

// CauseSlots is the cause of a pace brought down to what the source's
// slots let through (its requests in flight over their latency), which
// sent less than the pace allowed: the slots, not the pace, held it.
const CauseSlots = "slots"

// concLearner is what a source's concurrency learning keeps in memory.
type concLearner struct {
	okMax   int           // the most in flight a success was sent with, lately
	okMaxAt time.Time     // when okMax was last seen
	full    int           // successes sent with every slot in use since the slots last moved
	refused int           // the fewest in flight refused since a probe last held; 0 when none
	cutAt   time.Time     // when the slots were last cut
	hold    time.Duration // how long to hold below refused, at full use, before a probe
	probing bool          // the slots are at refused, a probe
	latency time.Duration // the running mean of successes' latency (latencyWeight)
}

// see adds a success's latency to the running mean.
func (c *concLearner) see(latency time.Duration) {
	if c.latency == 0 {
		c.latency = latency
		return
	}
	c.latency += time.Duration(latencyWeight * float64(latency-c.latency))
}

// through is what n slots let through at the latency seen, in requests a
// second; 0 when nothing is known, when the pace counts records rather
// than requests, or when it is a gateway group's, shared with others.
func (e *entry) through(n int) float64 {
	if e.conc.latency <= 0 || e.src.Count == auditd.CountRecords || e.grp != nil {
		return 0
	}
	return float64(n) / e.conc.latency.Seconds()
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
		c.see(now.Sub(obs.Sent))
		through := e.through(n)
		if through > 0 && e.rate().perSecond() >= slotsFill*through {
			// The slots, not the pace, hold the sends back: the round
			// says nothing of the pace, which grows no further. (A
			// probe of one slot more lets the pace grow into it: the
			// probe is then tested, and a refusal brings both back.)
			e.roundCount = 0
		}
		if k < n {
			return false, nil
		}
		// Every slot in use, and the server took it: after a round of
		// them (as many successes as slots), one slot more, unless the
		// slots are at their ceiling or hold below a number refused:
		// then they are what the source is paced by.
		if c.full++; c.full < n {
			return false, nil
		}
		grow := n < e.concCeil()
		if grow && c.refused > 0 && n+1 >= c.refused {
			if grow = now.Sub(c.cutAt) >= c.hold; grow {
				c.probing = true
			}
		}
		if !grow {
			return false, r.paceSlots(ctx, e, obs, through, now, d)
		}
		return false, r.setConcurrency(ctx, e, obs, n+1, now, d)
	case obs.refused():
		// A refusal of the probe, sent with its slot in use, is the
		// probe's, whatever a success before it showed: the count in
		// flight is the client's, which holds answers the server has
		// already counted out, so a success may come with one more than
		// the server took.
		probe := c.probing && k >= n && c.okMax > 0
		if !probe && (k < 2 || k <= c.okMax || c.okMax == 0) {
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

// paceSlots brings e's pace down to just above through (slotsAbove), what
// its slots let through, when the pace stands past it by more than
// slotsSlack: the pace shown is then within a few percent of the one the
// source is sent at. Recorded as a registry.changed of cause slots; the
// slots stay.
func (r *Registry) paceSlots(ctx context.Context, e *entry, obs *Observation, through float64, now time.Time, d *Decision) error {
	if through <= 0 || e.rate().perSecond() <= slotsSlack*through {
		return nil
	}
	l, w := e.limitFor(slotsAbove*through, &r.opts)
	if !e.rate().faster(rate{l, w}) {
		return nil
	}
	c := change{cause: CauseSlots, runID: obs.RunID, sourceID: obs.SourceID}
	moved, err := r.move(ctx, e, e.st, l, w, c, now)
	d.note(e, e, moved)
	return err
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
