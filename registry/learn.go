package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
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
	// from Status". A refusal (OutcomeThrottled, any 429, and any 503: nginx
	// limit_req answers a plain 503) slows the source down; a success
	// counts toward a probe; anything else (other 5xx, transport errors,
	// body errors: the breaker's business) teaches nothing.
	Outcome auditd.Outcome

	// Sent is when the request left, on the registry's clock. A refusal of
	// a request sent before the last decrease does not decrease again: it
	// was paced at the old limit. Zero means "now", and then a decrease is
	// held off for one request interval at the new limit instead.
	Sent time.Time

	// Hint is what the response's headers said. Limit per Window (an
	// X-RateLimit-Limit without a window is taken per
	// Options.AssumedWindow) sets the learned limit when it changes;
	// Remaining 0 with a Reset asks for a pause.
	Hint hints.Hint
}

// refused reports whether o is the server saying "too many".
func (o *Observation) refused() bool {
	return o.Outcome == auditd.OutcomeThrottled ||
		o.Status == http.StatusTooManyRequests || o.Status == http.StatusServiceUnavailable
}

// succeeded reports whether o counts toward a probe.
func (o *Observation) succeeded() bool {
	if o.Outcome != "" {
		return o.Outcome == auditd.OutcomeSuccess && !o.refused()
	}
	return o.Status >= 200 && o.Status < 300
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
	if g != nil && (d.Changed || d.GroupChanged) {
		g.setMember(e.id, e.rate())
	}
	d.Limits = e.limitsWith(g)
	d.Retune = d.Changed || d.GroupChanged
	return d, err
}

// learn applies the lessons of obs to source e and its group g (nil when
// none), recording in d what moved. It stops at the first error, with every
// change made before it committed. Callers hold e.mu and g.mu.
func (r *Registry) learn(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	o := &r.opts
	c := change{runID: obs.RunID, sourceID: obs.SourceID}

	// An advertised quota first: a 429 that ships X-RateLimit-Limit corrects
	// the limit at once instead of merely cutting it.
	if h := &obs.Hint; h.HasLimit && h.Limit > 0 {
		w := o.AssumedWindow
		if h.HasWindow && h.Window > 0 {
			w = h.Window
		}
		c.cause = CauseHeader
		old := e.st
		if x, ok := e.advertise(h.Limit, w, o); ok {
			moved, err := r.move(ctx, e, old, x.limit, x.window, c, now)
			if err != nil {
				return err
			}
			d.Changed = moved
		}
		// Members of a group sit behind one gateway: its advertised quota is
		// the one they share.
		if g != nil {
			old := g.st
			if x, ok := g.advertise(h.Limit, w, o); ok {
				moved, err := r.move(ctx, g, old, x.limit, x.window, c, now)
				if err != nil {
					return err
				}
				d.GroupChanged = moved
			}
		}
	}

	switch {
	case obs.refused():
		e.runCount = 0
		correlated := false
		if g != nil {
			g.runCount = 0
			correlated = g.noteThrottle(obs.SourceID, now)
		}
		// A throttle seen by two members of a group within a window is the
		// gateway's shared quota speaking: it acts on the group, and the
		// member is left alone.
		x := e
		if correlated {
			x = g
		}
		if !x.fresh(obs.Sent, now) {
			return nil
		}
		l, w := x.decrease(o)
		if l == x.st.Limit && w == x.st.Window.D() {
			return nil // at the floor already
		}
		old := x.st
		x.st.Bad = old.Limit
		c.cause = CauseThrottle
		if _, err := r.move(ctx, x, old, l, w, c, now); err != nil {
			return err
		}
		x.step, x.lastCut = o.ProbeStep, now
		d.Changed = d.Changed || x == e
		d.GroupChanged = d.GroupChanged || x == g

	case obs.succeeded():
		c.cause = CauseProbeUp
		if e.sustained(now, o) {
			if l, w, ok := e.probe(o); ok {
				moved, err := r.move(ctx, e, e.st, l, w, c, now)
				if err != nil {
					return err
				}
				d.Changed = d.Changed || moved
			}
		}
		if g != nil && g.sustained(now, o) {
			if l, w, ok := g.probe(o); ok {
				moved, err := r.move(ctx, g, g.st, l, w, c, now)
				if err != nil {
					return err
				}
				d.GroupChanged = d.GroupChanged || moved
			}
		}
	}
	return nil
}

// entry is the registry's state for one source or one group.
type entry struct {
	mu    sync.Mutex
	id    string
	group bool          // a group entry; src and grp are zero
	src   auditd.Source // configuration, without Headers
	// headers are the source's secret request headers, kept out of src so
	// that nothing reading src can leak them.
	headers map[string]string
	grp     *entry // the source's group entry, nil without one
	ceil    rate   // the most this entry may ever be set to
	st      state  // persisted

	// In memory only.
	runStart time.Time // first success of the current run
	runCount int       // successes in the current run
	step     int       // next probe step above any refused limit
	held     int       // runs held just below the refused limit
	lastCut  time.Time // last decrease by a throttle

	// Groups only: the member throttled last and when, each member's own
	// limit, and their sum per group window.
	lastBy       string
	lastByAt     time.Time
	members      map[string]rate
	membersLimit int
}

// state is what is persisted of an entry.
type state struct {
	Limit     int             `json:"limit"`
	Window    auditd.Duration `json:"window"`
	Base      auditd.Duration `json:"base_window,omitempty"` // window to return to after stretching at a limit of one
	Cause     string          `json:"cause,omitempty"`
	TaughtAt  time.Time       `json:"taught_at,omitzero"`
	RunID     string          `json:"run_id,omitempty"`
	SourceID  string          `json:"source_id,omitempty"`
	AdvLimit  int             `json:"advertised_limit,omitempty"`
	AdvWindow auditd.Duration `json:"advertised_window,omitempty"`
	Bad       int             `json:"throttled_at,omitempty"` // limit last refused
}

// change says who and what taught a change.
type change struct {
	cause     string
	runID     string
	sourceID  string
	principal string
}

// rate returns e's learned limit per window.
func (e *entry) rate() rate { return rate{e.st.Limit, e.st.Window.D()} }

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

// set moves e to l per w, recording what taught it.
func (e *entry) set(l int, w time.Duration, c change, now time.Time) {
	e.st.Limit, e.st.Window = l, auditd.Duration(w)
	if e.st.Base == 0 {
		e.st.Base = auditd.Duration(w)
	}
	e.st.Cause, e.st.TaughtAt, e.st.RunID, e.st.SourceID = c.cause, now.UTC(), c.runID, c.sourceID
	e.runCount = 0 // a run of successes proves only the limit it ran at
	e.held = 0
	if e.group {
		e.resum()
	}
}

// advertise records an advertised quota and returns the limit it sets, when
// the advertisement differs from the last one. An unchanged advertisement
// teaches nothing new: a limit cut by throttles since then stays cut.
func (e *entry) advertise(l int, w time.Duration, o *Options) (rate, bool) {
	if e.st.AdvLimit == l && e.st.AdvWindow.D() == w {
		return rate{}, false
	}
	e.st.AdvLimit, e.st.AdvWindow, e.st.Base = l, auditd.Duration(w), auditd.Duration(w)
	e.st.Bad, e.step = 0, o.ProbeStep
	nl, nw := clamp(l, w, e.ceil)
	return rate{nl, nw}, true
}

// fresh reports whether a throttle of a request sent at sent (zero: unknown)
// may decrease e: the request was paced at the current limit.
func (e *entry) fresh(sent, now time.Time) bool {
	if e.lastCut.IsZero() {
		return true
	}
	if !sent.IsZero() {
		return !sent.Before(e.lastCut)
	}
	interval := e.st.Window.D() / time.Duration(max(e.st.Limit, 1))
	return !now.Before(e.lastCut.Add(interval))
}

// decrease returns e's limit after a throttle: multiplied by Decrease and
// at least one lower; at one, the window doubles instead, up to MaxWindow.
func (e *entry) decrease(o *Options) (int, time.Duration) {
	l, w := e.st.Limit, e.st.Window.D()
	if l > 1 {
		return max(1, min(l-1, int(float64(l)*o.Decrease))), w
	}
	return 1, min(2*w, max(o.MaxWindow, w))
}

// sustained counts a success and reports whether it completes a run that
// proves the current limit: ProbeAfter successes or more, spanning a window,
// at ProbeUtilization of the limit or more. A run that ends without proof
// starts over.
func (e *entry) sustained(now time.Time, o *Options) bool {
	if e.runCount == 0 {
		e.runStart = now
	}
	e.runCount++
	// n successes paced at the limit cover n intervals of window/limit: the
	// first one's interval began before it was seen.
	w := e.st.Window.D()
	span := now.Sub(e.runStart) + w/time.Duration(e.st.Limit)
	// A hundredth of a window of slack absorbs the rounding of the caller's
	// interval (a minute over 18 is not a whole number of nanoseconds).
	if e.runCount < o.ProbeAfter || span+w/100 < w {
		return false
	}
	used := float64(e.runCount) >= o.ProbeUtilization*float64(e.st.Limit)*float64(span)/float64(w)
	e.runCount = 0
	return used
}

// probe returns e's limit one step up, and false when e is at its cap.
func (e *entry) probe(o *Options) (int, time.Duration, bool) {
	l, w := e.st.Limit, e.st.Window.D()
	if base := e.st.Base.D(); base > 0 && w > base {
		// Stretched at a limit of one: shrink the window back first.
		nw := max(base, w/2)
		nl, nw := clamp(l, nw, e.cap())
		return nl, nw, nl != l || nw != w
	}
	top := e.cap().in(w)
	if l >= top {
		return l, w, false
	}
	var step int
	if e.st.Bad > l {
		// Below the limit last refused: halve the distance each probe, so
		// recovery is quick and slows as it nears the refusal; just below
		// it, hold for ProbeHold runs before trying it again, since it is
		// most likely refused again.
		step, e.step = (e.st.Bad-l)/2, o.ProbeStep
		if step == 0 {
			if e.held++; e.held < o.ProbeHold {
				return l, w, false
			}
			step = e.st.Bad - l
		}
		step = max(step, o.ProbeStep)
	} else {
		step = max(e.step, o.ProbeStep)
		if e.step < top {
			e.step = step * 2
		}
	}
	return min(l+step, top), w, true
}

// cap is the most e may be probed to: its ceiling, and the quota its server
// advertised, whichever is slower.
func (e *entry) cap() rate {
	if e.st.AdvLimit > 0 {
		if adv := (rate{e.st.AdvLimit, e.st.AdvWindow.D()}); e.ceil.limit == 0 || e.ceil.faster(adv) {
			return adv
		}
	}
	return e.ceil
}

// noteThrottle records a throttle of member id on group e and reports
// whether it is correlated: another member was throttled within one window.
func (e *entry) noteThrottle(id string, now time.Time) bool {
	correlated := e.lastBy != "" && e.lastBy != id && now.Sub(e.lastByAt) <= e.st.Window.D()
	e.lastBy, e.lastByAt = id, now
	return correlated
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
	if e.group {
		ev.Group, ev.Detail = e.id, `{"scope":"`+ScopeGroup+`"}`
	} else {
		ev.Group, ev.Detail = e.src.Group, `{"scope":"`+ScopeSource+`"}`
	}
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
