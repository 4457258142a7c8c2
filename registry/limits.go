package registry

import (
	"time"

	"github.com/auditd/auditd"
)

// Limits is what the limiter needs to pace one source.
type Limits struct {
	Limit  int           // requests per Window for the source itself
	Window time.Duration //
	Group  string        // gateway group; empty when none
	// GroupLimit per GroupWindow is the budget the whole group shares, as
	// learned from correlated throttles; MembersLimit is the sum of its
	// members' own limits per GroupWindow. Zero when Group is empty.
	GroupLimit   int
	GroupWindow  time.Duration
	MembersLimit int
}

// Pace returns the budget the limiter paces the source at. Without a group
// it is the source's own limit. In a group, whose members draw on one
// budget, it is the group's limit or the sum of the members' own limits,
// whichever is lower: a member's throttle that was not correlated cuts only
// that member's limit, and through the sum it still slows the shared budget
// (the limiter cannot pace one member apart from the others).
func (l Limits) Pace() (limit int, window time.Duration) {
	if l.Group == "" {
		return l.Limit, l.Window
	}
	if l.MembersLimit > 0 && l.MembersLimit < l.GroupLimit {
		return l.MembersLimit, l.GroupWindow
	}
	return l.GroupLimit, l.GroupWindow
}

// Limits returns the current limits of source id.
func (r *Registry) Limits(id string) (Limits, error) {
	e := r.lookup(id)
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.limits()
	e.seen.Store(&l)
	return l, nil
}

// Peek is Limits for those who only show or estimate with them (a run's
// view, its finish estimate): it never waits for a change in progress,
// which holds the source while its registry.changed is made durable (and
// so for as long as a stalled ledger refuses writes). It returns the
// limits now when no change is in progress, else those last read.
func (r *Registry) Peek(id string) (Limits, error) {
	e := r.lookup(id)
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	if release, ok := e.tryHold(); ok {
		defer release()
		l := e.limitsWith(e.grp)
		e.seen.Store(&l)
		return l, nil
	}
	if l := e.seen.Load(); l != nil {
		return *l, nil
	}
	return r.Limits(id) // never read yet: wait, as Limits does
}

// limits reads e's limits and its group's. Callers hold e.mu, not the
// group's.
func (e *entry) limits() Limits {
	g := e.grp
	if g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
	}
	return e.limitsWith(g)
}

// limitsWith reads e's limits and those of its group g (nil without one).
// Callers hold e.mu and g.mu.
func (e *entry) limitsWith(g *entry) Limits {
	l := Limits{Limit: e.st.Limit, Window: e.st.Window.D()}
	if g != nil {
		l.Group, l.GroupLimit, l.GroupWindow, l.MembersLimit = g.id, g.st.Limit, g.st.Window.D(), g.membersLimit
	}
	return l
}

// State is everything the registry holds about one source, for reading:
// its configuration (without secrets) and what it has learned.
type State struct {
	Source auditd.Source // configuration, tier and breaker policy; Headers is always nil

	Limit  int           // learned limit per Window
	Window time.Duration //
	// CeilingLimit per CeilingWindow is the most the source may be sent.
	CeilingLimit  int
	CeilingWindow time.Duration
	// AdvertisedLimit per AdvertisedWindow is the last quota the source
	// advertised in its headers; zero when it never did.
	AdvertisedLimit  int
	AdvertisedWindow time.Duration
	Cause            string    // what taught Limit and Window; empty for the default
	TaughtAt         time.Time // when; zero for the default
	TaughtRun        string    // run whose response taught it
	TaughtBy         string    // source whose response taught it
	ThrottledAt      int       // the rate last refused, per Window; zero when none
	Phase            string    // PhaseStart or PhaseSteady
	WindowFrom       string    // how the advertised window was learned (WindowAdvertised...); empty when none
	Concurrency      int       // requests it may have in flight: learned within the configured, else the start

	Group              string // gateway group; the Group fields are zero without one
	GroupLimit         int
	GroupWindow        time.Duration
	GroupCeilingLimit  int
	GroupCeilingWindow time.Duration
	GroupCause         string
	GroupTaughtAt      time.Time
	GroupThrottledAt   int // the group limit last refused; zero when none
	MembersLimit       int // the members' own limits summed per GroupWindow
}

// State returns what the registry holds about source id.
func (r *Registry) State(id string) (State, error) {
	e := r.lookup(id)
	if e == nil {
		return State{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if g := e.grp; g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
	}
	return e.state(), nil
}

// state reads e's state and its group's, and keeps it for PeekState.
// Callers hold e.mu and the group's.
func (e *entry) state() State {
	s := State{
		Source:           e.src,
		Limit:            e.st.Limit,
		Window:           e.st.Window.D(),
		CeilingLimit:     e.ceil.limit,
		CeilingWindow:    e.ceil.window,
		AdvertisedLimit:  e.st.AdvLimit,
		AdvertisedWindow: e.st.AdvWindow.D(),
		Cause:            e.st.Cause,
		TaughtAt:         e.st.TaughtAt,
		TaughtRun:        e.st.RunID,
		TaughtBy:         e.st.SourceID,
		ThrottledAt:      e.st.refusedLimit(),
		Phase:            e.st.Phase,
		WindowFrom:       e.st.WindowFrom,
		Concurrency:      e.concurrency(),
		Group:            e.src.Group,
	}
	if g := e.grp; g != nil {
		s.GroupLimit, s.GroupWindow = g.st.Limit, g.st.Window.D()
		s.GroupCause, s.GroupTaughtAt = g.st.Cause, g.st.TaughtAt
		s.GroupCeilingLimit, s.GroupCeilingWindow = g.ceil.limit, g.ceil.window
		s.GroupThrottledAt, s.MembersLimit = g.st.refusedLimit(), g.membersLimit
	}
	e.seenState.Store(&s)
	return s
}

// tryHold takes e and its group, as Limits and State do, unless a change
// holds either; release lets them go.
func (e *entry) tryHold() (release func(), ok bool) {
	if !e.mu.TryLock() {
		return nil, false
	}
	g := e.grp
	if g != nil && !g.mu.TryLock() {
		e.mu.Unlock()
		return nil, false
	}
	return func() {
		if g != nil {
			g.mu.Unlock()
		}
		e.mu.Unlock()
	}, true
}

// PeekState is State for what only shows it (the metrics' gauges): it
// never waits for a change in progress (one held by a stalled ledger),
// answering with the state last read instead.
func (r *Registry) PeekState(id string) (State, error) {
	e := r.lookup(id)
	if e == nil {
		return State{}, ErrSourceNotFound
	}
	if release, ok := e.tryHold(); ok {
		defer release()
		return e.state(), nil
	}
	if st := e.seenState.Load(); st != nil {
		return *st, nil
	}
	return r.State(id) // never read yet: wait, as State does
}
