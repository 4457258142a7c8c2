package limiter

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd/clock"
)

// Gate names what held a request back. The values are the Cause of the
// fetch loop's wait and shed events (docs/EVENTS.md).
type Gate string

// Gates, in the order Acquire checks them.
const (
	GateBackoff     Gate = "backoff"     // the request's own retry delay (Request.NotBefore)
	GateBreaker     Gate = "breaker"     // breaker open, or half-open with every probe out
	GateConcurrency Gate = "concurrency" // every slot of the source in use
	GatePause       Gate = "pause"       // the source or its group is paused (Retry-After, Remaining 0)
	GateRate        Gate = "rate"        // token bucket or sliding window
)

// Limiter holds the gates of every configured source. It is safe for
// concurrent use.
type Limiter struct {
	// Jitter returns a uniform random duration in [0, n). Default: math/rand/v2.
	// Tests replace it to make backoff deterministic.
	Jitter func(n time.Duration) time.Duration

	clock    clock.Clock
	arrivals atomic.Uint64                      // stamps requests in arrival order (Permit.arrival)
	mu       sync.Mutex                         // serialises Configure
	sources  atomic.Pointer[map[string]*source] // copy on write: lookups take no lock
	groups   map[string]*groupBudget
	shared   atomic.Pointer[map[string]Shared] // Share: copy on write; nil when nothing is shared
}

type groupBudget struct {
	budget *Budget
	cfg    BudgetConfig
}

// New returns a Limiter with no sources, driven by c.
func New(c clock.Clock) *Limiter {
	l := &Limiter{
		Jitter: func(n time.Duration) time.Duration {
			if n <= 0 {
				return 0
			}
			return rand.N(n)
		},
		clock:  c,
		groups: make(map[string]*groupBudget),
	}
	l.sources.Store(&map[string]*source{})
	return l
}

// Configure adds source id with cfg, or replaces its configuration. A
// replaced source keeps its breaker and in-flight slots but gets a fresh
// budget (unless it is in a group, whose budget stays as it is).
func (l *Limiter) Configure(id string, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return fmt.Errorf("configure %s: %w", id, err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()

	old := *l.sources.Load()
	var was *Budget // the source's own budget until now, if it had one
	unchanged := false
	if s, ok := old[id]; ok {
		s.mu.Lock()
		if s.cfg.Group == "" {
			was, unchanged = s.budget, s.cfg.budget() == cfg.budget()
		}
		s.mu.Unlock()
	}
	var b *Budget
	if cfg.Group != "" {
		if g, ok := l.groups[cfg.Group]; ok {
			if g.cfg != cfg.budget() {
				return fmt.Errorf("configure %s in group %s: %w", id, cfg.Group, ErrGroupConflict)
			}
			b = g.budget
		}
	} else if unchanged {
		b = was // unchanged: its windows and pause stand
	}
	if b == nil {
		nb, err := NewBudget(l.clock, cfg.budget())
		if err != nil {
			return fmt.Errorf("configure %s: %w", id, err)
		}
		if was != nil {
			// A source put again with new limits goes on from what its
			// gates hold: the admissions in its window, the tokens it owes
			// and a pause; starting over would let a window's quota go
			// twice, and send into a pause the server asked for.
			nb.carry(was)
		}
		b = nb
		if cfg.Group != "" {
			l.groups[cfg.Group] = &groupBudget{budget: b, cfg: cfg.budget()}
		}
	}

	next := make(map[string]*source, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	if s, ok := old[id]; ok {
		s.mu.Lock()
		s.cfg, s.budget = cfg, b
		s.broadcast()
		s.mu.Unlock()
	} else {
		next[id] = &source{id: id, cfg: cfg, budget: b, breaker: breaker{state: BreakerClosed}}
	}
	l.sources.Store(&next)
	return nil
}

// Budget returns the budget that source id draws from (shared by its group).
func (l *Limiter) Budget(id string) (*Budget, error) {
	s, err := l.source(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.budget, nil
}

// SetLimit tightens source id's budget (its group's, when it has one) to
// limit per window; see Budget.SetLimit. The configured ceiling stays in
// force: a learned limit can slow a source, never raise it. While a
// Learner is attached to the budget (Share) the fleet paces it, and
// SetLimit changes nothing.
func (l *Limiter) SetLimit(id string, limit int, window time.Duration) error {
	s, err := l.source(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	b, learner := s.budget, l.learnerOf(id, s.cfg)
	s.mu.Unlock()
	if learner != nil {
		return nil
	}
	if err := b.SetLimit(limit, window); err != nil {
		return fmt.Errorf("set limit of %s: %w", id, err)
	}
	return nil
}

// SetLimitByHand is SetLimit for a limit an operator set: with a Learner
// attached to the budget, the fleet is told to pace the key at it
// (Learner.SetByHand) rather than the call changing nothing.
func (l *Limiter) SetLimitByHand(id string, limit int, window time.Duration) error {
	s, err := l.source(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	learner := l.learnerOf(id, s.cfg)
	s.mu.Unlock()
	if learner == nil {
		return l.SetLimit(id, limit, window)
	}
	learner.SetByHand(limit, window)
	return nil
}

// Pause closes source id (its whole group, when it has one) until until, or
// later if a longer pause is already in force, and returns the pause in
// force. A Shared attached to the budget is told too, so the fleet pauses. The fetch loop calls it again with throttle.Time + Wait once the
// throttle event is durable, so the pause provably covers the recorded wait.
func (l *Limiter) Pause(id string, until time.Time) (time.Time, error) {
	s, err := l.source(id)
	if err != nil {
		return time.Time{}, err
	}
	s.mu.Lock()
	b, sh := s.budget, l.sharedOf(id, s.cfg)
	s.mu.Unlock()
	if sh != nil {
		sh.Pause(until)
	}
	return b.Pause(until), nil
}

// State is a snapshot of one source's gates, for status pages and tests.
type State struct {
	Breaker  BreakerState
	Failures int
	Reopens  int // probes that failed since the breaker last closed
	// BreakerUntil is when an open breaker lets its next probe through;
	// zero unless open.
	BreakerUntil time.Time
	InFlight     int
	Waiting      int // Acquire calls waiting for a concurrency slot
	Queued       int // Acquire calls waiting at the budget's rate queue (the group's, when shared)
	Tokens       float64
	PausedUntil  time.Time
}

// State returns a snapshot of source id.
func (l *Limiter) State(id string) (State, error) {
	s, err := l.source(id)
	if err != nil {
		return State{}, err
	}
	s.mu.Lock()
	st := State{Breaker: s.breaker.state, Failures: s.breaker.failures, Reopens: s.breaker.reopens, InFlight: s.inFlight, Waiting: len(s.waiting)}
	if s.breaker.state == BreakerOpen {
		st.BreakerUntil = s.breaker.openUntil
	}
	b := s.budget
	s.mu.Unlock()
	st.Tokens, st.PausedUntil = b.Tokens(), b.PausedUntil()
	b.mu.Lock()
	st.Queued = len(b.queue)
	b.mu.Unlock()
	return st, nil
}

func (l *Limiter) source(id string) (*source, error) {
	s, ok := (*l.sources.Load())[id]
	if !ok {
		return nil, fmt.Errorf("%q: %w", id, ErrUnknownSource)
	}
	return s, nil
}

// source is one upstream's own gates: concurrency slots and breaker. Its
// budget may be shared with its group. Lock order: source.mu, then Budget.mu.
type source struct {
	id      string
	mu      sync.Mutex
	cfg     Config
	budget  *Budget
	breaker breaker

	inFlight int
	learned  int           // slots set by SetConcurrency; 0: cfg.Concurrency
	admitted int           // requests past every gate, holding their slot (Permit.InFlight)
	waiting  []uint64      // arrival stamps of requests waiting for a slot, oldest first
	changed  chan struct{} // closed when a slot frees, a waiter leaves or the breaker moves
}

func (s *source) broadcast() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

func (s *source) watch() <-chan struct{} {
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}
