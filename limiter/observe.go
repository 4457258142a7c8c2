package limiter

import (
	"net/http"
	"time"

	"github.com/auditd/auditd/hints"
)

// Class is how Observe classified an outcome.
type Class string

// Outcome classes.
const (
	ClassSuccess   Class = "success"      // 1xx-3xx: resets the breaker's failure count
	ClassThrottled Class = "throttled"    // 429, 503 with Retry-After, or a refused plain 503: pauses the source or group
	ClassServer    Class = "server_error" // other 5xx: a breaker failure
	ClassClient    Class = "client_error" // other 4xx: moves nothing
	ClassTransport Class = "transport"    // no response: a breaker failure
)

// Outcome is what came back for an admitted request.
type Outcome struct {
	// Status is the HTTP status; 0 with Err for a transport failure.
	Status int
	Err    error
	// Hint is the response's parsed headers (hints.Parse).
	Hint hints.Hint
	// Attempt counts this request's dispatches from 1; it sets the
	// exponent of the backoff.
	Attempt int
	// Refused says the caller knows a plain 503 to be the server refusing
	// the request for its rate (registry.Registry.Refusal: nginx limit_req
	// answers so): it is a throttle, and does not move the breaker.
	Refused bool
}

// Verdict is everything Observe decided, for the fetch loop to record as is:
// the throttle event's fields, the delay before a retry, the breaker events.
type Verdict struct {
	Source string
	Group  string
	Class  Class
	Probe  bool // the observed request was a half-open probe

	// RetryAfterRaw, RetryAfter and HasRetryAfter are the server's hint as
	// parsed (floored at zero); Clamped is true when RetryAfter exceeded
	// Cap and Cap was used instead.
	RetryAfterRaw string
	RetryAfter    time.Duration
	HasRetryAfter bool
	Clamped       bool
	Cap           time.Duration
	// Backoff is the source's own exponential backoff with jitter.
	Backoff time.Duration
	// Wait is the delay chosen. For a throttle, max(clamped hint, Backoff):
	// jitter lives in Backoff, so it can lengthen a server-mandated delay
	// but never shorten it. For a 5xx or transport failure, Backoff, to be
	// passed back as Request.NotBefore. Zero otherwise.
	Wait time.Duration
	// PausedUntil is the end of the pause now in force on the source's
	// budget (zero when it was never paused). After a throttle it is at
	// least the observation time + Wait.
	PausedUntil time.Time
	// Breaker holds the transitions this outcome caused, in order.
	Breaker []Transition
}

// Throttled reports whether the verdict is a throttle event.
func (v Verdict) Throttled() bool { return v.Class == ClassThrottled }

// Observe records the outcome of the admitted request: it releases the
// permit's slot and probe, moves the breaker (5xx and transport failures
// only), pauses the source or group on a throttle, applies
// Remaining/Reset (which only ever slow the budget), and returns the verdict.
// Call it once per dispatch; later calls see an already released permit.
func (p *Permit) Observe(o Outcome) Verdict {
	l, s := p.l, p.src
	v := Verdict{Source: p.Source, Group: p.Group, Class: classify(o)}
	if s == nil {
		return v
	}
	now := l.clock.Now()

	s.mu.Lock()
	cfg, b := s.cfg, s.budget
	probe, gen := p.probe, p.gen
	v.Probe = p.Probe
	p.once.Do(p.releaseLocked)
	// A 503 with Retry-After is a maintenance page as often as a quota: it
	// pauses the source and counts toward its breaker. A plain 503 known to
	// be a refusal only pauses it.
	failure := v.Class == ClassServer || v.Class == ClassTransport ||
		(v.Class == ClassThrottled && o.Status >= 500 && o.Hint.HasRetryAfter)
	if t := s.breaker.record(failure, v.Class == ClassSuccess, probe, gen, now, cfg, p.Source); t != nil {
		v.Breaker = append(v.Breaker, *t)
		s.broadcast()
	}
	s.mu.Unlock()
	for _, t := range v.Breaker {
		if t.To != BreakerOpen {
			continue
		}
		if sh := l.sharedOf(p.Source, cfg); sh != nil {
			sh.BreakerOpened(t.At.Add(t.Cooldown))
		}
	}

	if lr := l.learnerOf(p.Source, cfg); lr != nil {
		lr.Observed(p.Admitted, v.Class, o.Hint)
	}

	switch v.Class {
	case ClassThrottled:
		v.RetryAfterRaw = o.Hint.RetryAfterRaw
		v.RetryAfter, v.HasRetryAfter = o.Hint.RetryAfter, o.Hint.HasRetryAfter
		v.Cap = cfg.RetryCap
		hint := v.RetryAfter
		if hint > cfg.RetryCap {
			hint, v.Clamped = cfg.RetryCap, true
		}
		v.Backoff = l.backoff(cfg, o.Attempt)
		v.Wait = max(hint, v.Backoff)
		v.PausedUntil = b.Pause(now.Add(v.Wait))
	case ClassServer, ClassTransport:
		v.Backoff = l.backoff(cfg, o.Attempt)
		v.Wait = v.Backoff
	}
	if o.Hint.HasRemaining {
		reset := time.Duration(0)
		if o.Hint.HasReset {
			reset = min(o.Hint.Reset, cfg.RetryCap)
		}
		v.PausedUntil = b.Constrain(o.Hint.Remaining, reset)
	} else if v.Class != ClassThrottled {
		v.PausedUntil = b.PausedUntil()
	}
	return v
}

func classify(o Outcome) Class {
	switch {
	case o.Err != nil || o.Status == 0:
		return ClassTransport
	case o.Status == http.StatusTooManyRequests,
		o.Status == http.StatusServiceUnavailable && (o.Hint.HasRetryAfter || o.Refused):
		return ClassThrottled
	case o.Status >= 500:
		return ClassServer
	case o.Status >= 400:
		return ClassClient
	}
	return ClassSuccess
}

// backoff is BackoffBase doubled per attempt after the first, capped at
// BackoffMax, with "equal jitter": half fixed, half uniform, so retries
// spread out yet never collapse to zero.
func (l *Limiter) backoff(c Config, attempt int) time.Duration {
	d := c.BackoffBase
	for i := 1; i < attempt && d < c.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, c.BackoffMax)
	half := d / 2
	return d - half + l.Jitter(half+1)
}
