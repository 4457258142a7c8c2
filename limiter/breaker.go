package limiter

import "time"

// BreakerState is a circuit breaker state; the values are the From and To of
// breaker events.
type BreakerState string

// Breaker states. Legal transitions: closed→open, open→half_open,
// half_open→closed, half_open→open.
const (
	BreakerClosed   BreakerState = "closed"
	BreakerOpen     BreakerState = "open"
	BreakerHalfOpen BreakerState = "half_open"
)

// Transition is one breaker state change, with what the ledger's breaker
// event needs.
type Transition struct {
	Source    string
	From, To  BreakerState
	Failures  int // consecutive failures counted when it moved
	Threshold int
	Cooldown  time.Duration
	At        time.Time
}

// breaker is a source's circuit breaker. It is guarded by its source's mutex.
//
// Only failures (5xx, transport) count; a 429 slows the source through the
// pause gate and never moves the breaker. The count resets only on a
// success. Outcomes of requests admitted in an earlier state (gen differs)
// count toward failures but do not move the state: only a probe decides a
// half-open breaker.
type breaker struct {
	state     BreakerState
	failures  int
	openUntil time.Time
	probes    int           // probes in flight, whichever half-open admitted them
	gen       uint64        // bumped on every transition
	cooldown  time.Duration // of the current or last opening; zero when closed
	reopens   int           // failed probes since it last closed
	downSince time.Time     // when it opened after it last closed; zero when closed
}

// check reports whether a request may pass now; when the breaker is open
// past its cooldown it moves to half-open first and returns the transition.
// wait is how long until it might pass (0 when unknown).
func (b *breaker) check(now time.Time, c Config, id string) (pass bool, wait time.Duration, t *Transition) {
	if b.state == BreakerOpen {
		if now.Before(b.openUntil) {
			return false, b.openUntil.Sub(now), nil
		}
		t = b.move(BreakerHalfOpen, now, c, id)
	}
	if b.state == BreakerHalfOpen && b.probes >= c.BreakerProbes {
		return false, 0, t
	}
	return true, 0, t
}

// record counts an outcome of a request admitted at generation gen, as a
// probe or not, and returns the transition it causes, if any.
func (b *breaker) record(failure, success bool, probe bool, gen uint64, now time.Time, c Config, id string) *Transition {
	switch {
	case success:
		b.failures = 0
		if probe && gen == b.gen && b.state == BreakerHalfOpen {
			return b.move(BreakerClosed, now, c, id)
		}
	case failure:
		b.failures++
		if probe && gen == b.gen && b.state == BreakerHalfOpen {
			return b.move(BreakerOpen, now, c, id)
		}
		if b.state == BreakerClosed && b.failures >= c.BreakerThreshold {
			return b.move(BreakerOpen, now, c, id)
		}
	}
	return nil
}

func (b *breaker) move(to BreakerState, now time.Time, c Config, id string) *Transition {
	switch {
	case to == BreakerOpen && b.state == BreakerHalfOpen:
		// The probe failed: the source is still down; wait longer.
		b.cooldown = min(2*b.cooldown, time.Duration(c.BreakerBackoff)*c.BreakerCooldown)
		b.reopens++
	case to == BreakerOpen:
		b.cooldown, b.downSince = c.BreakerCooldown, now
	case to == BreakerClosed:
		b.cooldown, b.reopens, b.downSince = 0, 0, time.Time{}
	}
	t := &Transition{
		Source: id, From: b.state, To: to,
		Failures: b.failures, Threshold: c.BreakerThreshold, Cooldown: b.cooldown, At: now,
	}
	if to == BreakerHalfOpen {
		t.Cooldown = 0
	}
	// probes stays: a probe still in flight from an earlier half-open
	// is still a request testing the source, so a new half-open admits
	// only what BreakerProbes leaves beside it.
	b.state = to
	b.gen++
	if to == BreakerOpen {
		b.openUntil = now.Add(b.cooldown)
	}
	return t
}
