package registry

import (
	"context"
	"net/http"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/hints"
)

// Observation is what one response tells the registry. The fetch loop fills
// it from the response's status, its own classification and the headers
// hints.Parse read.
type Observation struct {
	RunID    string // run whose response this is
	SourceID string

	// Status is the HTTP status; 0 for a transport error.
	Status int
	// Outcome is the fetch loop's classification; empty means "derive it
	// from Status". OutcomeThrottled (which the loop sets for a 429, a 503
	// with Retry-After, and a plain 503 that Refusal took for a refusal)
	// slows the source down; a success counts toward a round; a plain 503
	// the loop did not take for a refusal is weighed against the responses
	// around it (see the package doc); anything else teaches nothing.
	Outcome auditd.Outcome

	// Sent is when the request left, on the registry's clock. A refusal of
	// a request sent before the last cut does not cut again: it was paced
	// at the old rate. Zero means "now".
	Sent time.Time

	// Hint is what the response's headers said.
	Hint hints.Hint

	// InFlight is how many of the source's requests were in flight when
	// this one left, itself included (limiter.Permit.InFlight); 0 when
	// unknown, which teaches the source's concurrency nothing.
	InFlight int
}

// quotaSpent reports whether h says nothing is left of the quota until a
// Reset.
func quotaSpent(h *hints.Hint) bool {
	return h.HasRemaining && h.Remaining <= 0 && h.HasReset && h.Reset > 0
}

// refused reports whether o is the server saying "too many".
func (o *Observation) refused() bool {
	return o.Outcome == auditd.OutcomeThrottled || o.Status == http.StatusTooManyRequests ||
		(o.Status == http.StatusServiceUnavailable && o.Hint.HasRetryAfter)
}

// ambiguous reports whether o is a plain 503: nginx limit_req's refusal, and
// also what a server down for maintenance answers.
func (o *Observation) ambiguous() bool {
	return o.Status == http.StatusServiceUnavailable && !o.refused()
}

// succeeded reports whether o counts toward a round.
func (o *Observation) succeeded() bool {
	if o.Outcome != "" {
		return o.Outcome == auditd.OutcomeSuccess && !o.refused()
	}
	return o.Status >= 200 && o.Status < 300
}

// failed reports whether o is what an outage looks like: a 5xx that is not a
// refusal, or no response at all.
func (o *Observation) failed() bool {
	return !o.refused() && (o.Status == 0 || o.Status >= 500 || o.Outcome == auditd.OutcomeServerError)
}

// Decision is what the fetch loop does after an Observe.
type Decision struct {
	Limits // in force after the observation

	// Changed reports that the source's own Limit or Window moved;
	// GroupChanged, the group's. Retune reports that Pace moved: call the
	// limiter's SetLimit(source, d.Pace()).
	Changed      bool
	GroupChanged bool
	Retune       bool

	// Pause is how long the server says no request will be admitted
	// (Remaining 0). It is the server's hint, not clamped: the caller clamps
	// it like a Retry-After and pauses the source, or its group, for it.
	// Zero when there is nothing to wait for.
	Pause time.Duration

	// Concurrency is the requests the source may have in flight;
	// ConcurrencyChanged reports that it moved: call the limiter's
	// SetConcurrency(source, d.Concurrency).
	Concurrency        int
	ConcurrencyChanged bool

	// Spent reports that the refusal observed shows only a window or a
	// quota spent, not a request at fault: a refusal of an episode after its
	// first, of a source seen to have a fixed window, or saying nothing is
	// left until a Reset; never a plain 503. The fetch loop does not count it against the
	// request's attempts.
	Spent bool
}

// Refusal reports whether the registry takes obs, a response not yet
// observed, for the server refusing a request for its rate rather than
// failing: a 429, a 503 with Retry-After, or a plain 503 to a request sent
// soon after the source's pace (or its group's) rose, with the source
// answering successes just before, unless a run of failures has shown it
// down. The fetch loop asks before it classifies the response, so that such
// a 503 slows the source like a 429 and does not count against its breaker.
// It changes nothing.
func (r *Registry) Refusal(obs Observation) bool {
	if obs.refused() {
		return true
	}
	if !obs.ambiguous() {
		return false
	}
	r.mu.RLock()
	e := r.sources[obs.SourceID]
	r.mu.RUnlock()
	if e == nil {
		return false
	}
	sent := obs.Sent
	if sent.IsZero() {
		sent = r.opts.Clock.Now()
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.risingAt(sent) {
		return true
	}
	if g := e.grp; g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.risingAt(sent) && !e.down
	}
	return false
}

// Observe learns from one response. When nothing changes (the common case)
// it neither touches bbolt nor allocates. Each change is appended to the
// ledger as registry.changed, then persisted. On an error Observe stops: a
// change whose append failed is undone, those before it stand, and the
// Decision describes the limits in force.
func (r *Registry) Observe(ctx context.Context, obs Observation) (Decision, error) {
	r.mu.RLock()
	e := r.sources[obs.SourceID]
	r.mu.RUnlock()
	if e == nil {
		return Decision{}, ErrSourceNotFound
	}
	now := r.opts.Clock.Now()
	if obs.Sent.IsZero() || obs.Sent.After(now) {
		obs.Sent = now
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	g := e.grp
	if g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
	}

	var d Decision
	inFlight, err := r.learnConcurrency(ctx, e, &obs, now, &d)
	if err == nil && !inFlight {
		err = r.learn(ctx, e, g, &obs, now, &d)
	}

	h := &obs.Hint
	// A refusal with nothing left and no Retry-After: the Reset is when
	// to come back.
	untilReset := obs.refused() && quotaSpent(h) && !h.HasRetryAfter
	if quotaSpent(h) {
		d.Pause = h.Reset
		// Reset is when the quota is whole again; a bucket or a sliding
		// window frees one request long before that. With the quota known,
		// a success that leaves nothing waits one interval of it: a window
		// that is truly spent refuses the next request, and its Reset (or
		// Retry-After) is the wait.
		if e.st.AdvLimit > 0 && !untilReset {
			d.Pause = min(d.Pause, e.st.AdvWindow.D()/time.Duration(e.st.AdvLimit))
		}
	}
	// The waits the server asked for (Remaining 0, Retry-After), which the
	// admitted rate leaves out. The drain pause below is auditd's own: the
	// server's bucket refills during it at the server's rate, so it stays
	// in the span, and what was admitted from one refusal to the next is
	// that rate. A Retry-After as short as the drain pause is a bucket's
	// refill like it: only what goes past that says how long to wait
	// rather than how fast to go.
	wait := d.Pause
	if obs.refused() {
		x := e
		if g != nil {
			x = g
		}
		// A plain 503 may be an outage's first: it spends attempts.
		plain := obs.Status == http.StatusServiceUnavailable && !h.HasRetryAfter
		d.Spent = !plain && (quotaSpent(h) || x.episode > 1 || x.windowed)
		drain := x.drainPause(now)
		switch {
		case untilReset:
			// The pause is the Reset.
		case obs.Hint.HasRetryAfter:
			wait = max(wait, min(obs.Hint.RetryAfter, maxPause)-drain)
		case x.episode > 0:
			// A refusal that says nothing of when to come back (a 429 or
			// a plain 503 without Retry-After) means the server's bucket
			// or window is full: pause the source while it drains a
			// little, so the next request tests the new pace rather than
			// the old one's backlog. Each further refusal of the episode
			// doubles the pause, within a share of the episode's age: a
			// spent window refuses until it resets, and a pause that runs
			// far past its boundary wastes the next window.
			p := x.episodePause(drain, now)
			d.Pause = max(d.Pause, p)
			x.drained += p
		}
	}
	e.paused += wait
	if g != nil {
		g.paused += wait
	}
	if g != nil && (d.Changed || d.GroupChanged) {
		g.setMember(e.id, e.rate())
	}
	d.Limits = e.limitsWith(g)
	if last := e.seen.Load(); last == nil || *last != d.Limits {
		seen := d.Limits // only a change allocates
		e.seen.Store(&seen)
	}
	d.Retune = d.Changed || d.GroupChanged
	return d, err
}
