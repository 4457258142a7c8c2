package fleet

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// Defaults for Config.
const (
	DefaultBlock   = time.Second
	DefaultLead    = 200 * time.Millisecond
	DefaultGrace   = 20 * time.Millisecond
	DefaultMaxSkew = 10 * time.Millisecond
	DefaultTimeout = 2 * time.Second
	DefaultRetry   = 250 * time.Millisecond
)

// Rate is a limit the fleet is told: at most Limit slots in any Window.
type Rate struct {
	Limit  int
	Window time.Duration
}

// Config shapes one key's Slots on one node.
type Config struct {
	// Key names the shared budget: a source id, or a gateway group's.
	Key  string
	Rate Rate
	// Node names this node in the key's state, where the nodes sharing the
	// key are counted (Ask.Node); default a random name. Two nodes of one
	// fleet must not share a name.
	Node string
	// Block is the most time of the rate one reservation takes; default
	// DefaultBlock. A node with little demand takes less (see doc.go).
	Block time.Duration
	// Lead is the least time before its held slots run out that a node
	// reserves the next block; default DefaultLead. A node reserves earlier,
	// once half its last block's span is left, when that is longer.
	Lead time.Duration
	// Grace is how long after its time a slot may still be taken; a slot
	// nobody takes by then is wasted. Default DefaultGrace.
	Grace time.Duration
	// MaxSkew is the most any two nodes' wall clocks may differ; default
	// DefaultMaxSkew. Slots are spaced, and pauses lengthened, to absorb it.
	MaxSkew time.Duration
	// Timeout bounds each etcd call; default DefaultTimeout.
	Timeout time.Duration
	// Retry is the wait after a failed reservation before the next try;
	// default DefaultRetry.
	Retry time.Duration
	// Notify, when set, receives every reservation, pause, cut-off and
	// rejoin this node acts on, in order, from the Slots' goroutines. A
	// grant (EventReserved) is reported before any of its slots is handed
	// out, so a Notify that records it durably before returning has every
	// grant on record ahead of its slots' use. Notify must not block for
	// longer than such a record takes.
	Notify func(Event)
}

// Backend is the shared state Slots reserve from; *Store is the etcd one.
type Backend interface {
	Reserve(ctx context.Context, key string, a Ask) (Block, error)
	PauseFor(ctx context.Context, key string, until time.Time, breaker string) (Pause, error)
	Watch(ctx context.Context, key string, ch chan<- Pause) error
}

// Slots hands out one node's slots of one key: locally, from the blocks it
// holds, with no etcd on the way, while a goroutine reserves the next block
// before the held ones run out and another follows the key's pause. It is
// safe for concurrent use.
type Slots struct {
	cfg      Config
	backend  Backend
	clock    clock.Clock
	interval int64 // nanoseconds between slots, the skew guard included
	max      int   // most slots one reservation takes

	mu       sync.Mutex
	held     []Block       // granted and not yet spent, in time order
	next     int           // held[0]'s next slot
	pause    int64         // unix nanoseconds: no slot before it is handed out
	want     int           // size of the next reservation
	span     int64         // nanoseconds the last granted block spans
	lastSlot int64         // unix nanoseconds of the last granted block's last slot
	end      int64         // unix nanoseconds where the last granted block's span ends
	behind   bool          // the last grant came after other nodes' slots: the key is shared
	wasted   bool          // a run since the node's demand began wasted slots
	streak   int           // reservations in a row that found the node busy
	trip     time.Duration // how long the last reservation took, up to Lead
	need     int           // largest cost a taker found too few slots for since the last reservation; 0 when none
	retry    bool          // the last reservation failed: try again after Retry, taker or not
	usedRun  int           // slots used since the last reservation
	lateRun  int64         // nanoseconds: the latest after its time a slot was taken since the last reservation
	lostRun  int           // slots wasted since the last reservation
	stats    Stats
	changed  chan struct{} // closed on any change a taker could care about; nil when nobody waits

	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// Stats counts a Slots' slots since it was made.
type Stats struct {
	Blocks   int64 // reservations granted to this node: its etcd writes
	Reserved int64 // slots granted to this node
	Used     int64 // handed out by Take
	Wasted   int64 // expired unused, or dropped for a pause
	Held     int   // granted and still usable
	// CutOff is true while the last reservation failed: the node hands out
	// what it holds and then nothing until etcd answers again.
	CutOff      bool
	PausedUntil time.Time
	// Trip is the last granted reservation's round trip to etcd, capped
	// at Lead.
	Trip time.Duration
}

// NewSlots returns the Slots of cfg.Key on backend, with time read from c. It
// holds no slot until Open starts it and a taker asks.
func NewSlots(backend Backend, c clock.Clock, cfg Config) (*Slots, error) {
	if !cfg.Rate.Valid() {
		return nil, fmt.Errorf("slots %s: %d per %v: %w", cfg.Key, cfg.Rate.Limit, cfg.Rate.Window, ErrInvalidRate)
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&cfg.Block, DefaultBlock}, {&cfg.Lead, DefaultLead}, {&cfg.Grace, DefaultGrace},
		{&cfg.MaxSkew, DefaultMaxSkew}, {&cfg.Timeout, DefaultTimeout}, {&cfg.Retry, DefaultRetry}} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Node == "" {
		cfg.Node = rand.Text()[:8]
	}
	s := &Slots{cfg: cfg, backend: backend, clock: c, kick: make(chan struct{}, 1)}
	s.interval = Interval(cfg.Rate, cfg.Grace, cfg.MaxSkew).Nanoseconds()
	s.max = max(1, int(cfg.Block.Nanoseconds()/s.interval))
	s.want = 1 // grown by use: a node that just started wastes little
	return s, nil
}

// Interval is the spacing of a rate's slots with the guard added: a window
// of the rate stretched by the grace a slot may be taken late and the most
// two nodes' clocks may differ, divided by the limit, rounded up. Slots that
// far apart put at most Limit takes in any Window of real time.
func Interval(r Rate, grace, skew time.Duration) time.Duration {
	if !r.Valid() {
		r = Rate{Limit: 1, Window: MaxWindow} // the sparsest the fleet counts
	}
	span := int64(r.Window + grace + skew) // at most a year and a few seconds
	return time.Duration((span + int64(r.Limit) - 1) / int64(r.Limit))
}

// Check rejects a cost that no set of slots could serve at once: its slots
// span more than the grace.
func (s *Slots) Check(cost int) error {
	s.mu.Lock()
	interval, spans := s.interval, s.spansGrace(cost) // SetRate changes them
	s.mu.Unlock()
	if spans {
		return fmt.Errorf("slots %s: cost %d at %v apart, grace %v: %w", s.cfg.Key, cost, time.Duration(interval), s.cfg.Grace, ErrCostExceedsGrace)
	}
	return nil
}

// spansGrace reports whether cost slots at the interval now span the grace,
// so that none could be taken at once. The caller holds s.mu.
func (s *Slots) spansGrace(cost int) bool {
	return int64(cost-1)*s.interval >= int64(s.cfg.Grace)
}

// Earliest returns when cost slots can be taken, at or after now, from the
// slots this node holds; false when it holds too few, in which case it asks
// for more and the caller waits on Changed. The answer holds until another
// taker takes, a pause arrives or the slots expire. A cost that Check
// refuses at the rate now (SetRate spaced the slots past its grace) gets
// false and asks for nothing: no block could serve it, and asking would
// reserve and waste blocks back to back, pushing the key's arrival time
// ahead of every node.
func (s *Slots) Earliest(now time.Time, cost int) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.spansGrace(cost) {
		return now, false
	}
	at, ok := s.earliestLocked(now.UnixNano(), cost)
	if !ok {
		s.need = max(s.need, cost)
		s.poke()
	}
	return time.Unix(0, max(at, now.UnixNano())), ok
}

// Take spends cost slots at now and reports true, or spends nothing and
// reports false when Earliest(now, cost) is after now.
func (s *Slots) Take(now time.Time, cost int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := now.UnixNano()
	at, ok := s.earliestLocked(n, cost)
	if !ok || at > n {
		return false
	}
	s.lateRun = max(s.lateRun, n-s.at(0))
	for range cost {
		s.advance()
	}
	s.stats.Used += int64(cost)
	s.usedRun += cost
	if end, ok := s.lastLocked(); !ok || end-n <= s.ahead() {
		s.poke()
	}
	return true
}

// ahead is how long before its last held slot a node that is using its
// slots reserves the next block: half the last block's span, so that a
// reservation late by up to that much still leaves no gap between the
// node's blocks, and never less than Lead. The caller holds s.mu.
func (s *Slots) ahead() int64 {
	return max(int64(s.cfg.Lead), s.span/2)
}

// earliestLocked drops what has expired at now and returns the time of the
// cost-th held slot, when cost slots within one grace of each other are held.
func (s *Slots) earliestLocked(now int64, cost int) (int64, bool) {
	s.expire(now)
	for {
		if s.count() < cost {
			return 0, false
		}
		first, last := s.at(0), s.at(cost-1)
		if last-first < int64(s.cfg.Grace) {
			return last, true
		}
		s.waste(1) // a gap between blocks: the first would expire before the last comes
	}
}

// expire drops held slots past their grace at now or before the pause.
func (s *Slots) expire(now int64) {
	for s.count() > 0 {
		t := s.at(0)
		if t+int64(s.cfg.Grace) > now && t >= s.pause {
			return
		}
		s.waste(1)
	}
}

func (s *Slots) waste(n int) {
	for range n {
		s.advance()
	}
	s.stats.Wasted += int64(n)
	s.lostRun += n
}

// advance spends held's next slot.
func (s *Slots) advance() {
	s.next++
	if s.next == s.held[0].Count {
		s.held[0] = Block{}
		s.held, s.next = s.held[1:], 0
	}
}

// count returns how many held slots are left.
func (s *Slots) count() int {
	n := -s.next
	for _, b := range s.held {
		n += b.Count
	}
	return n
}

// at returns the time of the i-th held slot left (i < count()).
func (s *Slots) at(i int) int64 {
	i += s.next
	for _, b := range s.held {
		if i < b.Count {
			return b.First.UnixNano() + int64(i)*b.Interval.Nanoseconds()
		}
		i -= b.Count
	}
	panic("fleet: slot index out of range")
}

// lastLocked returns the time of the last held slot.
func (s *Slots) lastLocked() (int64, bool) {
	n := s.count()
	if n == 0 {
		return 0, false
	}
	return s.at(n - 1), true
}

// Changed returns a channel closed at the next change a taker could care
// about: a block granted, a pause learned.
func (s *Slots) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return s.changed
}

func (s *Slots) broadcast() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}

// poke wakes the reservation loop.
func (s *Slots) poke() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// Stats returns the counters and state now.
func (s *Slots) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expire(s.clock.Now().UnixNano())
	st := s.stats
	st.Held = s.count()
	st.Trip = s.trip
	if s.pause != 0 {
		st.PausedUntil = time.Unix(0, s.pause)
	}
	return st
}
