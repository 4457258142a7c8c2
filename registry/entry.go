package registry

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
)

// configView is what a source entry shows of its configuration.
type configView struct {
	src         auditd.Source // without Headers
	headerNames []string      // sorted
}

// entry is the registry's state for one source or one group.
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
	refusedAt  time.Time     // the last refusal
	upAgain    time.Time     // the first success after an outage: what was admitted before says nothing since
	prev       rate          // the pace before the last change
	changed    time.Time     // when the pace last changed
	held       int           // rounds held just under the refused rate
	hold       int           // rounds to hold before the next probe above it, and a probe must hold
	probing    bool          // the pace is a probe above the refused rate
	probedAt   time.Time     // when the last probe began
	base       rate          // the pace held clean before the last probe
	retry      bool          // the last probe was refused: hold at base, probe no further than it
	stableFrom time.Time     // the first of the probes refused in a row since a probe held or a cut; zero when none
	gain       float64       // share above the refused rate the next probe tries
	clean      int           // probes in a row that held
	resumed    bool          // slow start resumed after clean probes; until a refusal
	proven     bool          // a round has proved the pace since the last cut
	afterStart bool          // slow start ended, and no round has proved a pace since
	good       float64       // the pace the last round proved, in requests per second
	dropAt     time.Time     // the last cut that found the server well behind the pace
	missed     int           // refusals met recovering since a probe last held
	episode    int           // refusals counted since the last success: one episode, cut once
	episodeAt  time.Time     // the first refusal of the current or last episode
	windowed   bool          // an episode showed a spent window: refusals end no pace, its end sets it
	cycleFrom  time.Time     // when the current window began, as far as seen: the end of the last episode
	bounded    bool          // cycleFrom is a window's boundary, not the first success
	lastPause  time.Duration // the pause after the latest refusal of an episode
	cycleOK    int           // successes since cycleFrom
	cycleLen   time.Duration // the last window seen spent, from boundary to boundary
	pacedSum   float64       // requests the pace allowed from the last cut to the last change
	drained    time.Duration // auditd's own drain pauses since the last cut
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

	conc concLearner // requests in flight (concurrency.go)

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
	// Concurrency is the requests in flight learned; 0 when none was.
	Concurrency int `json:"concurrency,omitempty"`
}

// capped reports whether st's advertised quota caps the pace: its window
// was advertised, or read off a Reset that counts down.
func (st *state) capped() bool {
	return st.AdvLimit > 0 && st.AdvWindow > 0 && (st.WindowFrom == WindowAdvertised || st.WindowFrom == WindowReset)
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

// setMember records member id's own limit in group e.
func (e *entry) setMember(id string, r rate) {
	if e.members == nil {
		e.members = make(map[string]rate)
	}
	e.members[id] = r
	e.resum()
}

// dropMember forgets a member that left group e.
func (e *entry) dropMember(id string) {
	delete(e.members, id)
	e.resum()
}

// resum recomputes the sum of the members' limits per group window.
func (e *entry) resum() {
	w := e.st.Window.D()
	if w <= 0 {
		return
	}
	var sum float64
	for _, m := range e.members {
		sum += float64(m.limit) * float64(w) / float64(m.window)
	}
	e.membersLimit = max(1, int(sum))
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

// cap is the most e may be raised to: its ceiling, and the quota its server
// advertised with a window of its own, whichever is slower.
func (e *entry) cap() rate {
	if e.st.capped() {
		if adv := (rate{e.st.AdvLimit, e.st.AdvWindow.D()}); e.ceil.limit == 0 || e.ceil.faster(adv) {
			return adv
		}
	}
	return e.ceil
}
