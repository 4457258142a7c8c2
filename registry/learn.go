package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

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
	err := r.learn(ctx, e, g, &obs, now, &d)

	h := &obs.Hint
	if h.HasRemaining && h.Remaining <= 0 && h.HasReset && h.Reset > 0 {
		d.Pause = h.Reset
		// Reset is when the quota is whole again; a bucket or a sliding
		// window frees one request long before that. With the quota known,
		// wait one interval of it: a fixed window that is truly spent answers
		// the next request with a 429 and the Retry-After to honour.
		if e.st.AdvLimit > 0 {
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
		drain := max(settle, min(2*x.interval(), maxDrain))
		switch {
		case obs.Hint.HasRetryAfter:
			wait = max(wait, min(obs.Hint.RetryAfter, maxPause)-drain)
		case d.Changed || d.GroupChanged:
			// A refusal that says nothing of when to come back (a 429 or
			// a plain 503 without Retry-After) means the server's bucket
			// or window is full: pause the source while it drains a
			// little, so the next request tests the new pace rather than
			// the old one's backlog.
			d.Pause = max(d.Pause, drain)
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
	seen := d.Limits
	e.seen.Store(&seen)
	d.Retune = d.Changed || d.GroupChanged
	return d, err
}

// learn applies the lessons of obs to source e and its group g (nil when
// none), recording in d what moved. It stops at the first error, with every
// change made before it committed. Callers hold e.mu and g.mu.
func (r *Registry) learn(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	o := &r.opts

	// An advertised quota first: a 429 that ships X-RateLimit-Limit corrects
	// the limit at once instead of merely cutting it.
	if h := &obs.Hint; h.HasLimit && h.Limit > 0 {
		moved, err := r.advertised(ctx, e, obs, now)
		if err != nil {
			return err
		}
		d.Changed = moved
		// Members of a group sit behind one gateway: its advertised quota is
		// the one they share.
		if g != nil {
			moved, err := r.advertised(ctx, g, obs, now)
			if err != nil {
				return err
			}
			d.GroupChanged = moved
		}
	}

	// Remaining 0 in slow start: the pace has used up what the server
	// allows, which ends slow start as a refusal would, without one.
	if h := &obs.Hint; h.HasRemaining && h.Remaining <= 0 && !obs.refused() {
		for _, x := range []*entry{e, g} {
			if x == nil || x.st.Phase == PhaseSteady {
				continue
			}
			moved, err := r.spent(ctx, x, obs, now, o)
			if err != nil {
				return err
			}
			d.Changed = d.Changed || (moved && x == e)
			d.GroupChanged = d.GroupChanged || (moved && x == g)
		}
	}

	switch {
	case obs.refused():
		// Members of a group draw on one budget, in whatever order their
		// requests come: a throttle of any of them is the gateway's shared
		// quota speaking. It acts on the group, and the member is left alone.
		x := e
		if g != nil {
			x = g
		}
		plain := obs.Status == http.StatusServiceUnavailable && !obs.Hint.HasRetryAfter
		before, hold := x.st, x.hold
		moved, err := r.refuse(ctx, x, obs, obs.Sent, now, o)
		if err != nil {
			return err
		}
		if plain {
			// A plain 503 taken for a refusal may yet turn out to be the
			// first of an outage: keep what to go back to, and count it
			// toward the failures that would show one.
			if moved && x.undo == nil {
				x.undo, x.undoHold = &before, hold
			}
			if err := r.fail(ctx, e, g, obs, now, d); err != nil {
				return err
			}
		} else {
			e.streak = 0 // the server is up, and counting
			if g != nil {
				g.streak = 0
			}
		}
		d.Changed = d.Changed || (moved && x == e)
		d.GroupChanged = d.GroupChanged || (moved && x == g)
		e.suspect = time.Time{}

	case obs.succeeded():
		for _, x := range []*entry{e, g} {
			if x == nil {
				continue
			}
			if x.streak > 0 && x.failSince.After(x.lastCut) {
				// Time the source spent failing is not time it refused
				// for rate: the admitted rate leaves it out.
				x.paused += now.Sub(x.failSince)
			}
			// Failures alone for outageTime, even too few to have shown
			// it down (a pace slowed by the cuts sends few): an outage
			// after all, whose cuts are undone.
			if x.undo != nil && x.streak >= suspectStreak+1 && now.Sub(x.failSince) >= outageTime {
				moved, err := r.revert(ctx, x, obs, now)
				if err != nil {
					return err
				}
				d.Changed = d.Changed || (moved && x == e)
				d.GroupChanged = d.GroupChanged || (moved && x == g)
			}
			x.okAt, x.streak, x.undo, x.down = now, 0, nil, false
		}
		// A plain 503 between successes, or two, was the server refusing
		// that request for its rate: an outage answers every request.
		if !e.suspect.IsZero() {
			sent := e.suspect
			e.suspect = time.Time{}
			late := *obs
			late.Status = http.StatusServiceUnavailable
			moved, err := r.refuse(ctx, e, &late, sent, now, o)
			if err != nil {
				return err
			}
			d.Changed = d.Changed || moved
		}
		e.hist.add(now, e.interval())
		moved, err := r.round(ctx, e, obs, now, o)
		if err != nil {
			return err
		}
		d.Changed = d.Changed || moved
		if g != nil {
			g.hist.add(now, g.interval())
			moved, err := r.round(ctx, g, obs, now, o)
			if err != nil {
				return err
			}
			d.GroupChanged = d.GroupChanged || moved
		}

	case obs.failed():
		if obs.ambiguous() && e.suspect.IsZero() && e.streak < suspectStreak {
			e.suspect = obs.Sent
		}
		if err := r.fail(ctx, e, g, obs, now, d); err != nil {
			return err
		}
		if e.streak >= suspectStreak {
			e.suspect = time.Time{}
		}
	}
	return nil
}

// fail counts a failure of source e (and its group g): a 5xx, a transport
// error, or a plain 503. Enough of them in a row, with no success for
// outageTime, are an outage: the source is down, plain 503s are no longer
// taken for refusals until it answers a success, and a cut that a plain 503
// at the start of the run made is undone, so the source resumes at the pace
// it had learned before. (A gateway refusing a pace far above its rate also
// answers several 503s in a row, but lets one through every interval of its
// rate.)
func (r *Registry) fail(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	for _, x := range []*entry{e, g} {
		if x == nil {
			continue
		}
		if x.streak == 0 {
			x.failSince = now
		}
		x.streak++
		x.roundCount = 0
		if x.streak < r.outageStreak(e) || now.Sub(x.failSince) < outageTime {
			continue
		}
		x.down = true
		if x.undo != nil {
			moved, err := r.revert(ctx, x, obs, now)
			if err != nil {
				return err
			}
			d.Changed = d.Changed || (moved && x == e)
			d.GroupChanged = d.GroupChanged || (moved && x == g)
		}
	}
	return nil
}

// outageTime is how long a source must answer nothing but failures to be
// taken for down.
const outageTime = 10 * time.Second

// suspectStreak is the most failures in a row whose plain 503s may still be
// refusals once a success follows: beyond it, they were an outage.
const suspectStreak = 2

// outageStreak is how many failures in a row make an outage: the source's
// breaker threshold.
func (r *Registry) outageStreak(e *entry) int {
	if t := e.src.Breaker.Threshold; t > 0 {
		return t
	}
	return r.opts.OutageStreak
}

// advertised learns from an advertised quota in obs for entry x (a source,
// or the group it belongs to), and reports whether x's limit moved.
func (r *Registry) advertised(ctx context.Context, x *entry, obs *Observation, now time.Time) (bool, error) {
	h := &obs.Hint
	w, from := x.win.window(h, now, &r.opts)
	if x.st.AdvLimit == h.Limit && x.st.AdvWindow.D() == w && x.st.WindowFrom == from {
		return false, nil // an unchanged advertisement teaches nothing new
	}
	old := x.st
	x.st.AdvLimit, x.st.AdvWindow, x.st.WindowFrom = h.Limit, auditd.Duration(w), from
	x.st.Base = auditd.Duration(w)
	l, nw := clamp(h.Limit, w, x.ceil)
	switch from {
	case WindowAdvertised:
		// The server said what it allows: that is the pace, and the cap.
		x.st.Phase, x.st.Refused, x.probing, x.held = PhaseSteady, 0, false, 0
	case WindowReset:
		// A fixed or sliding window's Reset is never longer than the window:
		// the quota over the longest Reset seen is a pace to hold, and to
		// probe past with care, not a cap.
		if x.st.Phase != PhaseSteady {
			x.st.Phase, x.st.Refused, x.probing, x.held = PhaseSteady, 0, false, 0
			x.doubling = true
		}
	default:
		// An assumed window, a bucket's, or one read off a Reset that does
		// not move is only a starting point: where
		// slow start is still under way it goes on from the faster of the
		// two, until a refusal or a Remaining of 0 ends it.
		if x.st.Phase != PhaseSteady && x.rate().faster(rate{l, nw}) {
			l, nw = x.st.Limit, x.st.Window.D()
		}
	}
	c := change{cause: CauseHeader, runID: obs.RunID, sourceID: obs.SourceID, window: from}
	return r.move(ctx, x, old, l, nw, c, now)
}

// refuse cuts entry x after a refusal of a request sent at sent, unless the
// request left before x's last cut (it was paced at the old rate). The cut
// goes to Decrease times the lower of the pace the request was sent at and
// the rate the server admitted over the busy spell before it.
func (r *Registry) refuse(ctx context.Context, x *entry, obs *Observation, sent, now time.Time, o *Options) (bool, error) {
	x.roundCount = 0
	// A request sent before the last cut was paced at the old rate; one
	// sent just after it meets a server still full of the faster pace (a
	// bucket that has not drained, a window that still holds it). Neither
	// says anything of the new pace.
	if !x.lastCut.IsZero() && sent.Before(x.lastCut.Add(max(settle, 2*x.interval()))) {
		return false, nil
	}
	// The pace the refused request was sent at bounds the server's rate
	// from above, and what it was found to admit, from below: recovery
	// climbs back toward the lower of the refused pace and a step above
	// what was admitted; the cut goes below both.
	bad := x.rateAt(sent)
	refused := bad
	var next float64
	switch {
	case x.st.Phase != PhaseSteady:
		// The first refusal: back to the pace of the last clean round. What
		// was admitted before is slow start's, and says nothing yet.
		next = bad / o.Growth
		x.hist = history{}
	default:
		// What the server admitted since the last cut bounds its rate from
		// above only where it fell short of the pace in force meanwhile
		// (refusals, pauses it asked for); otherwise it is only the pace
		// that was sent, and the refused pace is the bound.
		adm, ok := x.hist.admitted(now, x.lastCut, x.paused)
		if ok && adm < bad {
			if adm < o.Decrease*x.paced(now) {
				bad = adm
			}
			// Either way the server's rate is not far above what it
			// admitted: recovery heads a step past it, not to the
			// refused pace.
			refused = min(refused, adm*(1+o.ProbeGain))
		}
		next = o.Decrease * bad
		if !x.proven && !x.lastCut.IsZero() {
			// Refused again before a round proved the pace of the last cut:
			// the server is still well behind; halve.
			next = min(next, x.rateAt(sent)/2)
		}
	}
	if x.probing || now.Sub(x.probedAt) < probeMemory {
		// The probe above the last refusal was refused too (or soon after
		// it held): wait longer before the next one.
		x.hold = min(2*max(x.hold, o.ProbeHold), o.MaxHold)
	} else if x.st.Phase == PhaseSteady && x.st.Refused > 0 {
		x.missed++ // refused on the way back up
	}
	x.probing, x.held, x.proven, x.gain, x.doubling = false, 0, false, o.ProbeGain, false
	x.lastCut, x.pacedSum, x.paused = now, 0, 0
	x.st.Refused = refused
	x.st.Phase = PhaseSteady
	l, w := x.limitFor(next, o)
	if cur := x.rate(); !cur.faster(rate{l, w}) {
		// Never a rise: at the floor already, or the pace was already below.
		l, w = x.limitFor(o.Decrease*cur.perSecond(), o)
	}
	old := x.st
	c := change{cause: CauseThrottle, runID: obs.RunID, sourceID: obs.SourceID, status: obs.Status}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err != nil {
		return false, err
	}
	if !moved {
		return false, r.persist(x) // the phase and the refused rate changed
	}
	return true, nil
}

// spent ends entry x's slow start on a response that said nothing remains
// of the server's quota: back to the pace of the last clean round, with the
// pace that spent it taken as refused.
func (r *Registry) spent(ctx context.Context, x *entry, obs *Observation, now time.Time, o *Options) (bool, error) {
	cur := x.rate()
	x.st.Phase, x.st.Refused = PhaseSteady, cur.perSecond()
	x.lastCut, x.hist, x.roundCount, x.held, x.probing = now, history{}, 0, 0, false
	l, w := x.limitFor(cur.perSecond()/o.Growth, o)
	old := x.st
	c := change{cause: CauseHeader, runID: obs.RunID, sourceID: obs.SourceID, remaining: true}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err == nil && !moved {
		err = r.persist(x)
	}
	return moved, err
}

// revert undoes the cut recorded in x.undo: the outage that followed showed
// the plain 503 behind it was not a refusal.
func (r *Registry) revert(ctx context.Context, x *entry, obs *Observation, now time.Time) (bool, error) {
	st := *x.undo
	x.undo = nil
	x.hold = x.undoHold // the 503s doubled it as refused probes: they were not
	old := x.st
	x.st.Refused, x.st.Phase = st.Refused, st.Phase
	if x.st.Phase == "" {
		x.st.Phase = PhaseStart
	}
	x.lastCut = time.Time{}
	c := change{cause: CauseOutage, runID: obs.RunID, sourceID: obs.SourceID}
	return r.move(ctx, x, old, st.Limit, st.Window.D(), c, now)
}

// round counts a success toward entry x's current round, and when the round
// is complete raises x's pace by what the phase allows: Growth in slow
// start; after a refusal, half the way back toward the refused rate, a hold
// just under it, then a probe above it whose step doubles while probes stay
// clean.
func (r *Registry) round(ctx context.Context, x *entry, obs *Observation, now time.Time, o *Options) (bool, error) {
	// A round after the first refusal is ProbeAfter successes, or as many
	// as the pace sends in roundTime if fewer (a slow pace must not take
	// minutes a round), and never fewer than a slow start's.
	need := max(o.StartRound, min(o.ProbeAfter, int(math.Ceil(float64(roundTime)/float64(x.interval())))))
	if x.st.Phase != PhaseSteady {
		need = max(o.StartRound, int(math.Ceil(float64(startRoundTime)/float64(x.interval()))))
	}
	if !x.sustained(now, need, o) {
		return false, nil
	}
	x.proven = true
	cur := x.rate().perSecond()
	g := o.ProbeGain
	if x.st.Refused <= 0 {
		x.st.Refused = cur / (1 - g) // steady with nothing refused: hold here, then probe
	}
	// Recovery stops ProbeGain under the rate refused, and another
	// ProbeGain further under it for each refusal met on the way back up
	// since a probe last held: the refused pace was only a little above the
	// server's rate.
	top := 1 - g*float64(1+min(x.missed, 2))
	var next float64
	cause := CauseProbeUp
	switch {
	case x.st.Phase != PhaseSteady:
		next, cause = cur*o.Growth, CauseSlowStart
	case x.probing:
		// A probe past the last refusal must hold as long as the pace held
		// before it: a gateway's burst hides a pace above its rate for a
		// while, and a round or two proves nothing.
		if x.held++; x.held < max(x.hold, o.ProbeHold) || now.Sub(x.probedAt) < probeProof {
			return false, nil
		}
		x.missed = 0
		// The server allows this pace now: hold here, then probe again;
		// twice as far when the pace came from a window read off a Reset
		// and nothing was refused since (the window may have been read
		// long, by a second of rounding).
		x.probing, x.held, x.hold = false, 0, o.ProbeHold
		if x.doubling {
			x.gain = min(2*x.gain, o.Growth-1)
		}
		x.st.Refused = cur / (1 - g)
		return false, r.persist(x)
	case cur < (top-g)*x.st.Refused && x.faster(min(top*x.st.Refused, max(cur+x.unit(), (cur+x.st.Refused)/2)), o):
		// Recovering after a cut: halve the distance each round, up to
		// just under the rate refused.
		next = min(top*x.st.Refused, max(cur+x.unit(), (cur+x.st.Refused)/2))
		cause = CauseRecover
	default:
		// Just under the rate refused (as near as whole requests per
		// window go): hold, then probe past it.
		if x.held++; x.held < max(x.hold, o.ProbeHold) {
			return false, nil
		}
		// Held clean at the top: the margin below the refused rate can go.
		x.held, x.probing, x.probedAt, x.missed = 0, true, now, 0
		next = x.st.Refused * (1 + max(g, x.gain))
	}
	l, w := x.limitFor(next, o)
	if !(rate{l, w}).faster(x.rate()) {
		// At the cap, or too slow for a step to show in whole requests:
		// take one request more per window.
		if x.st.Limit >= x.cap().in(x.st.Window.D()) {
			x.probing = false
			return false, nil
		}
		l, w = x.limitFor(x.rate().perSecond()+x.unit(), o)
		if !(rate{l, w}).faster(x.rate()) {
			x.probing = false
			return false, nil
		}
	}
	old := x.st
	c := change{cause: cause, runID: obs.RunID, sourceID: obs.SourceID}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if moved {
		x.rose = now
	}
	return moved, err
}

// entry is the registry's state for one source or one group.
// configView is what a source entry shows of its configuration.
type configView struct {
	src         auditd.Source // without Headers
	headerNames []string      // sorted
}

type entry struct {
	mu sync.Mutex
	// seen is the limits last read under mu, for Peek while a change holds
	// mu (one waiting on the ledger, say).
	seen      atomic.Pointer[Limits]
	seenState atomic.Pointer[State] // likewise, for PeekState
	id        string
	group     bool          // a group entry; src and grp are zero
	src       auditd.Source // configuration, without Headers
	// headers are the source's secret request headers, kept out of src so
	// that nothing reading src can leak them.
	headers map[string]string
	// config is src and the sorted names of headers as last set (setConfig),
	// for the views that must not wait on mu (ListSources, GetSource,
	// HeaderNames): a change recorded on a stalled ledger holds mu.
	config atomic.Pointer[configView]
	grp    *entry // the source's group entry, nil without one
	ceil   rate   // the most this entry may ever be set to
	st     state  // persisted

	// Learning, in memory only: after a restart a source must show a fresh
	// round before its pace moves again.
	roundStart time.Time     // first success of the current round
	roundCount int           // successes in the current round
	rose       time.Time     // when the pace last rose
	lastCut    time.Time     // last cut by a refusal
	prev       rate          // the pace before the last change
	changed    time.Time     // when the pace last changed
	held       int           // rounds held just under the refused rate
	hold       int           // rounds to hold before the next probe above it, and a probe must hold
	probing    bool          // the pace is a probe above the refused rate
	probedAt   time.Time     // when the last probe began
	gain       float64       // share above the refused rate the next probe tries
	doubling   bool          // the gain doubles with each clean probe: no refusal since a Reset's window
	proven     bool          // a round has proved the pace since the last cut
	missed     int           // refusals met recovering since a probe last held
	pacedSum   float64       // requests the pace allowed from the last cut to the last change
	paused     time.Duration // waits the server asked for, and failing spells, since the last cut
	hist       history       // recent successes, for the rate the server admits
	win        windowGuess
	okAt       time.Time // last success
	streak     int       // failures (5xx, transport) since the last success
	failSince  time.Time // the first of them
	suspect    time.Time // sent time of a plain 503 not yet judged; zero when none
	undo       *state    // what to go back to if an outage follows a plain 503's cut
	undoHold   int       // and the probe hold then
	down       bool      // failures in a row showed an outage; until a success

	// Groups only: each member's own limit, and their sum per group window.
	members      map[string]rate
	membersLimit int
}

// state is what is persisted of an entry.
type state struct {
	Limit      int             `json:"limit"`
	Window     auditd.Duration `json:"window"`
	Base       auditd.Duration `json:"base_window,omitempty"` // window rates are expressed in
	Cause      string          `json:"cause,omitempty"`
	TaughtAt   time.Time       `json:"taught_at,omitzero"`
	RunID      string          `json:"run_id,omitempty"`
	SourceID   string          `json:"source_id,omitempty"`
	AdvLimit   int             `json:"advertised_limit,omitempty"`
	AdvWindow  auditd.Duration `json:"advertised_window,omitempty"`
	WindowFrom string          `json:"window_from,omitempty"` // how AdvWindow was learned
	// Phase is PhaseStart until the first refusal, PhaseSteady after. A
	// state stored before phases existed has none, and starts over in
	// slow start from the limit it has: a cut an outage made recovers.
	Phase string `json:"phase,omitempty"`
	// Refused is the rate, in requests per second, last refused: the lower
	// of the pace a refused request was sent at and the rate the server
	// admitted just before.
	Refused float64 `json:"refused_rate,omitempty"`
	// Bad is the limit last refused, as states stored before Refused kept
	// it. It is read, never written.
	Bad int `json:"throttled_at,omitempty"`
}

// refusedLimit is the rate last refused as a limit per st's window.
func (st *state) refusedLimit() int {
	return int(math.Round(st.Refused * st.Window.D().Seconds()))
}

// Phases of learning.
const (
	PhaseStart  = "slow_start" // no refusal yet: the pace grows by Growth each clean round
	PhaseSteady = "steady"     // after a refusal: recover toward it, hold, probe past it
)

// change says who and what taught a change.
type change struct {
	cause     string
	runID     string
	sourceID  string
	principal string
	status    int    // a refusal's status
	window    string // how an advertised window was learned
	remaining bool   // a Remaining of 0 taught it
}

// rate returns e's learned limit per window.
func (e *entry) rate() rate { return rate{e.st.Limit, e.st.Window.D()} }

// interval is the time between two requests at e's pace.
func (e *entry) interval() time.Duration {
	return e.st.Window.D() / time.Duration(max(e.st.Limit, 1))
}

// unit is the smallest step of e's pace, in requests per second: one
// request per the window its limit is expressed in.
func (e *entry) unit() float64 {
	return 1 / e.st.Window.D().Seconds()
}

// paceWindows are the windows a learned pace is expressed in: the shortest
// that holds about paceRequests requests at that pace. A short window keeps
// the limiter's strict sliding window (no more than the limit in any window,
// which reconciliation's R9 checks) from holding a source back for long
// after a cut, when the requests sent at the faster pace are still in it;
// paceRequests per window keeps steps of about 5%.
var paceWindows = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	15 * time.Second, 20 * time.Second, 30 * time.Second, time.Minute,
}

const paceRequests = 20

// limitFor expresses per (requests per second) as a limit per window,
// rounded down so the pace never exceeds it, within e's cap. The window is
// the advertised one when the server gave it (so the quota is kept exactly),
// else the shortest of paceWindows that holds paceRequests at that pace.
// Below one request a minute, the window stretches instead, up to MaxWindow.
func (e *entry) limitFor(per float64, o *Options) (int, time.Duration) {
	per = max(min(per, e.cap().perSecond()), 1/o.MaxWindow.Seconds())
	w := paceWindows[len(paceWindows)-1]
	if e.st.WindowFrom == WindowAdvertised && e.st.AdvWindow > 0 {
		w = e.st.AdvWindow.D()
	} else {
		for _, pw := range paceWindows {
			if per*pw.Seconds() >= paceRequests {
				w = pw
				break
			}
		}
	}
	l := int(math.Floor(per*w.Seconds() + 1e-9))
	if l < 1 {
		l, w = 1, min(o.MaxWindow, time.Duration(math.Ceil(float64(time.Second)/per)))
	}
	return clamp(l, w, e.cap())
}

// faster reports whether per, expressed as a limit per window, is a faster
// pace than e's.
func (e *entry) faster(per float64, o *Options) bool {
	l, w := e.limitFor(per, o)
	return rate{l, w}.faster(e.rate())
}

// rateAt returns the pace in force at t, in requests per second.
func (e *entry) rateAt(t time.Time) float64 {
	if !e.changed.IsZero() && t.Before(e.changed) && e.prev.limit > 0 {
		return e.prev.perSecond()
	}
	return e.rate().perSecond()
}

// risingAt reports whether a request sent at t left soon after e's pace
// rose (within riseWindow, or five intervals of the pace), with a success
// not long before, and e not down: the time a plain 503 is most likely the
// server refusing the faster pace.
func (e *entry) risingAt(t time.Time) bool {
	if e.down || e.rose.IsZero() || t.Before(e.rose) || t.Sub(e.rose) > max(riseWindow, 5*e.interval()) {
		return false
	}
	recent := max(recentSuccess, 4*e.interval())
	return !e.okAt.IsZero() && t.Sub(e.okAt) <= recent
}

// maxPause bounds one server-requested wait, as counted by admitted.
const maxPause = 5 * time.Minute

// maxDrain bounds the pause after a refusal without Retry-After.
const maxDrain = 5 * time.Second

// roundTime bounds the time of a round after the first refusal, in
// successes at the pace.
const roundTime = 10 * time.Second

// startRoundTime is the least a round of slow start lasts: a gateway's
// burst hides a pace above its rate for a while, and doubling every few
// hundred milliseconds runs far past the rate before the first refusal.
const startRoundTime = time.Second

// settle is the least time after a cut before a refusal can cut again.
const settle = time.Second

// probeProof is the least time a probe past the rate last refused must hold
// to count as allowed: a gateway's burst hides a pace a little above its
// rate for seconds. A refusal within probeMemory of a probe's start is the
// probe's.
const (
	probeProof  = 10 * time.Second
	probeMemory = time.Minute
)

// riseWindow is how long after a rise of the pace a plain 503 is taken for a
// refusal; recentSuccess, how long after a success the source still counts
// as answering.
const (
	riseWindow    = 30 * time.Second
	recentSuccess = 5 * time.Second
)

// setMember records member id's own limit in group g.
func (g *entry) setMember(id string, r rate) {
	if g.members == nil {
		g.members = make(map[string]rate)
	}
	g.members[id] = r
	g.resum()
}

// dropMember forgets a member that left group g.
func (g *entry) dropMember(id string) {
	delete(g.members, id)
	g.resum()
}

// resum recomputes the sum of the members' limits per group window.
func (g *entry) resum() {
	w := g.st.Window.D()
	if w <= 0 {
		return
	}
	var sum float64
	for _, m := range g.members {
		sum += float64(m.limit) * float64(w) / float64(m.window)
	}
	g.membersLimit = max(1, int(sum))
}

// paced returns the mean pace in force since the last cut, in requests per
// second; the current pace when there was none.
func (e *entry) paced(now time.Time) float64 {
	if e.lastCut.IsZero() || !now.After(e.lastCut) {
		return e.rate().perSecond()
	}
	from := e.lastCut
	if e.changed.After(from) {
		from = e.changed
	}
	sum := e.pacedSum + e.rate().perSecond()*now.Sub(from).Seconds()
	return sum / now.Sub(e.lastCut).Seconds()
}

// set moves e to l per w, recording what taught it.
func (e *entry) set(l int, w time.Duration, c change, now time.Time) {
	if !e.lastCut.IsZero() && now.After(e.lastCut) {
		from := e.lastCut
		if e.changed.After(from) {
			from = e.changed
		}
		e.pacedSum += e.rate().perSecond() * now.Sub(from).Seconds()
	}
	e.prev, e.changed = e.rate(), now
	e.st.Limit, e.st.Window = l, auditd.Duration(w)
	if e.st.Base == 0 {
		e.st.Base = auditd.Duration(w)
	}
	e.st.Cause, e.st.TaughtAt, e.st.RunID, e.st.SourceID = c.cause, now.UTC(), c.runID, c.sourceID
	e.roundCount = 0 // a round proves only the pace it ran at
	if e.group {
		e.resum()
	}
}

// sustained counts a success and reports whether it completes a round that
// proves the current pace: need successes or more, sent at
// ProbeUtilization of the pace or more. A round that ends without proof
// starts over.
func (e *entry) sustained(now time.Time, need int, o *Options) bool {
	if e.roundCount == 0 {
		e.roundStart = now
	}
	e.roundCount++
	if e.roundCount < need {
		return false
	}
	// n successes paced at the limit cover n intervals: the first one's
	// interval began before it was seen.
	iv := e.interval()
	span := now.Sub(e.roundStart) + iv
	used := float64(e.roundCount)*float64(iv) >= o.ProbeUtilization*float64(span)
	e.roundCount = 0
	return used
}

// cap is the most e may be raised to: its ceiling, and the quota its server
// advertised with a window of its own, whichever is slower.
func (e *entry) cap() rate {
	if e.st.AdvLimit > 0 && e.st.WindowFrom == WindowAdvertised {
		if adv := (rate{e.st.AdvLimit, e.st.AdvWindow.D()}); e.ceil.limit == 0 || e.ceil.faster(adv) {
			return adv
		}
	}
	return e.ceil
}

// move sets e to l per w, taught by c, from state old, and reports whether
// the limit or window moved. Such a move is committed (ledger, then bbolt);
// a change of other state only (a new advertisement that leaves the limit
// where it was) is only persisted. Callers hold e.mu.
func (r *Registry) move(ctx context.Context, e *entry, old state, l int, w time.Duration, c change, now time.Time) (bool, error) {
	if l == old.Limit && w == old.Window.D() {
		if e.st == old {
			return false, nil
		}
		return false, r.persist(e)
	}
	e.set(l, w, c, now)
	return true, r.commit(ctx, e, old, c)
}

// changeDetail is the Detail of a registry.changed event.
type changeDetail struct {
	Scope string `json:"scope"`
	// Phase is the learning phase after the change.
	Phase string `json:"phase,omitempty"`
	// Status is the refusal's HTTP status, for a throttle.
	Status int `json:"status,omitempty"`
	// Refused is the rate last refused, in requests per second.
	Refused float64 `json:"refused_per_second,omitempty"`
	// Window says how the advertised window was learned, for a header.
	Window string `json:"window_from,omitempty"`
	// Remaining is set when a Remaining of 0 ended slow start.
	Remaining *int `json:"remaining,omitempty"`
}

// commit appends the registry.changed event for e's move from old, then
// persists e. An append error restores old.
func (r *Registry) commit(ctx context.Context, e *entry, old state, c change) error {
	ev := auditd.Event{
		Type:      auditd.EventRegistryChanged,
		RunID:     c.runID,
		SourceID:  c.sourceID,
		OldLimit:  old.Limit,
		NewLimit:  e.st.Limit,
		OldWindow: old.Window.D(),
		NewWindow: e.st.Window.D(),
		Cause:     c.cause,
		Principal: c.principal,
	}
	det := changeDetail{Scope: ScopeSource, Phase: e.st.Phase, Status: c.status, Window: c.window}
	if c.remaining {
		det.Remaining = new(int)
	}
	if c.cause == CauseThrottle {
		det.Refused = math.Round(e.st.Refused*1e4) / 1e4
	}
	if e.group {
		ev.Group, det.Scope = e.id, ScopeGroup
	} else {
		ev.Group = e.src.Group
	}
	detail, err := json.Marshal(det)
	if err != nil {
		return fmt.Errorf("encode registry.changed detail for %q: %w", e.id, err)
	}
	ev.Detail = string(detail)
	if _, err := r.opts.Ledger.Append(ctx, ev); err != nil {
		e.st = old
		if e.group {
			e.resum()
		}
		return fmt.Errorf("append registry.changed for %q: %w", e.id, err)
	}
	return r.persist(e)
}

// persist writes e's state. Callers hold e.mu.
func (r *Registry) persist(e *entry) error {
	v, err := json.Marshal(e.st)
	if err != nil {
		return fmt.Errorf("encode state of %q: %w", e.id, err)
	}
	name := bucketLearned
	if e.group {
		name = bucketGroups
	}
	if err := r.db.Update(func(tx *bolt.Tx) error {
		return bucket(tx, name).Put([]byte(e.id), v)
	}); err != nil {
		return fmt.Errorf("store state of %q: %w", e.id, err)
	}
	return nil
}

// rate is limit requests per window.
type rate struct {
	limit  int
	window time.Duration
}

// faster reports whether a allows more requests per unit of time than b.
func (a rate) faster(b rate) bool {
	return float64(a.limit)*float64(b.window) > float64(b.limit)*float64(a.window)
}

// in returns the most requests per window w that stay within a.
func (a rate) in(w time.Duration) int {
	return int(float64(a.limit) * float64(w) / float64(a.window))
}

// perSecond returns a in requests per second.
func (a rate) perSecond() float64 {
	if a.window <= 0 {
		return 0
	}
	return float64(a.limit) / a.window.Seconds()
}

// clamp returns l per w brought within ceiling c: the same window with fewer
// requests when that leaves at least one, else c itself.
func clamp(l int, w time.Duration, c rate) (int, time.Duration) {
	if c.limit == 0 {
		return l, w
	}
	m := c.in(w)
	if l <= m {
		return l, w
	} else if m >= 1 {
		return m, w
	}
	return c.limit, c.window
}
