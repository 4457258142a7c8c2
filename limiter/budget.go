package limiter

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// Budget limits: beyond these the int64 nanosecond arithmetic could overflow.
const (
	MaxLimit  = 1 << 30
	MaxWindow = 366 * 24 * time.Hour
)

// BudgetConfig is the shape of a Budget.
type BudgetConfig struct {
	// Limit cost units in any Window is the strict ceiling. Required.
	Limit  int
	Window time.Duration
	// Burst is the token bucket's capacity: how much may leave back to back
	// after an idle spell. Zero means DefaultBurst; it is capped at Limit.
	Burst int
}

// Budget is a request budget: a token bucket that paces (capacity Burst,
// refilled at Limit/Window) in front of a sliding-window log that no window
// of length Window ever holds more than Limit units of. It is safe for
// concurrent use; the Limiter keeps one per source or gateway group, and the
// API can keep one per token.
//
// The bucket is kept in GCRA form: one "theoretical arrival time" (tat)
// stands for the token count, tokens = Burst - (tat-now)/interval, so a read
// refills it without a timer and the hot path is integer arithmetic.
type Budget struct {
	mu    sync.Mutex
	clock clock.Clock
	epoch time.Time // times below are nanoseconds since epoch (monotonic for the real clock)
	last  int64     // latest now seen; time never runs backwards here

	ceiling window // the configured Limit per Window; never loosened by SetLimit
	learned window // a tighter limit learned at run time; limit 0 when unset
	burst   int64  // configured bucket capacity

	interval int64 // nanoseconds per token at the effective rate
	capacity int64 // effective burst: min(burst, every window's limit)
	tat      int64

	log  []entry // admissions in time order, log[head:] live
	head int

	pauseUntil int64 // no admission before this; 0 when not paused

	// Waiters of Limiter.Acquire queue here in the order they arrived at
	// their source's gates (Permit arrival stamps, which a group's members
	// share), so a large cost is not starved by a stream of small ones, a
	// member's request by another's, and Allow does not jump the queue.
	queue   []uint64
	changed chan struct{} // closed on any change a waiter could care about; nil when nobody waits
}

type entry struct {
	at   int64
	cost int64
}

type window struct {
	limit int64
	dur   int64
	start int   // index into log of the first entry inside the window
	sum   int64 // cost of log[start:]
}

// Decision is a non-blocking admission verdict.
type Decision struct {
	Admitted bool
	// Gate is what refused it: GateRate or GatePause ("" when admitted).
	Gate Gate
	// RetryAfter is how long until this cost would be admitted if nothing
	// else were admitted meanwhile: an honest Retry-After.
	RetryAfter time.Duration
}

// NewBudget returns a full Budget on clock c.
func NewBudget(c clock.Clock, cfg BudgetConfig) (*Budget, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Burst == 0 {
		cfg.Burst = DefaultBurst
	}
	b := &Budget{clock: c, epoch: c.Now()}
	b.ceiling = window{limit: int64(cfg.Limit), dur: int64(cfg.Window)}
	b.burst = int64(cfg.Burst)
	b.retune()
	return b, nil
}

func (cfg BudgetConfig) validate() error {
	if cfg.Limit < 1 || cfg.Limit > MaxLimit {
		return fmt.Errorf("limit %d: %w", cfg.Limit, ErrInvalidConfig)
	}
	if cfg.Window <= 0 || cfg.Window > MaxWindow {
		return fmt.Errorf("window %v: %w", cfg.Window, ErrInvalidConfig)
	}
	if cfg.Burst < 0 || cfg.Burst > MaxLimit {
		return fmt.Errorf("burst %d: %w", cfg.Burst, ErrInvalidConfig)
	}
	return nil
}

// Allow admits cost units now if every gate has room, and otherwise reports
// which gate refused and how long until it would not. It never blocks and
// does not allocate. A cost above the capacity can never be admitted and is
// ErrCostExceedsCapacity.
func (b *Budget) Allow(cost int) (Decision, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkCost(cost); err != nil {
		return Decision{}, err
	}
	now := b.now()
	at, gate := b.earliest(now, int64(cost))
	if len(b.queue) > 0 && gate == "" {
		// Blocking waiters were here first; report the wait they see.
		return Decision{Gate: GateRate, RetryAfter: time.Duration(b.interval * int64(cost))}, nil
	}
	if gate != "" {
		return Decision{Gate: gate, RetryAfter: time.Duration(at - now)}, nil
	}
	b.commit(now, int64(cost))
	return Decision{Admitted: true}, nil
}

// Record counts an admission of cost made at a past time, at: one a process
// before a restart made, read back from the ledger, so that a restart does
// not begin with empty windows and send a second window's worth at once.
// Record admissions oldest first, before any new one: one older than an
// admission the budget already holds is not counted.
func (b *Budget) Record(at time.Time, cost int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := at.Sub(b.epoch).Nanoseconds()
	if n := len(b.log); n > b.head && b.log[n-1].at > t || t > b.now() {
		return
	}
	b.commit(t, int64(cost))
}

// move counts cost, counted at from, at to instead (Permit.Sent; times
// in nanoseconds since epoch), and returns where it is counted now. It
// only ever moves a count later, and never past now, so the log stays in
// time order and no window that ends after now holds less than it did.
func (b *Budget) move(from, to, cost int64) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	t := min(to, b.now())
	if t <= from {
		return from
	}
	windows := []*window{&b.ceiling}
	if b.learned.limit != 0 {
		windows = append(windows, &b.learned)
	}
	// Take cost off its entry, unless compact dropped it (no window saw it
	// any more). An entry before a window's start is not in its sum. The
	// entry is recent: only the admissions since it follow it.
	i := len(b.log) - 1
	for i >= 0 && b.log[i].at > from {
		i--
	}
	if i >= 0 && b.log[i].at == from && b.log[i].cost >= cost {
		b.log[i].cost -= cost
		for _, w := range windows {
			if i >= w.start {
				w.sum -= cost
			}
		}
	}
	// Add it at t, after the entries at or before t. An entry before a
	// window's start is older than that window (or, in a learned window
	// that counts from its retune, older than the retune), as the log
	// before start is.
	j := len(b.log)
	for j > 0 && b.log[j-1].at > t {
		j--
	}
	if j > 0 && b.log[j-1].at == t {
		b.log[j-1].cost += cost
		for _, w := range windows {
			if j-1 >= w.start {
				w.sum += cost
			}
		}
		return t
	}
	b.log = slices.Insert(b.log, j, entry{at: t, cost: cost})
	for _, w := range windows {
		if j < w.start {
			w.start++
		} else {
			w.sum += cost
		}
	}
	return t
}

// carry takes over what from, the budget b replaces, holds: its admissions
// (every window of b counts them), the tokens it owes (in tokens, paid back
// at b's pace) and its pause. b is new: nothing else holds it yet.
func (b *Budget) carry(from *Budget) {
	from.mu.Lock()
	defer from.mu.Unlock()
	now := b.now()
	shift := from.epoch.Sub(b.epoch).Nanoseconds() // from's times in b's
	// All of from's log: b's windows, longer or shorter, slide past what is
	// too old for them.
	for _, e := range from.log {
		if e.cost > 0 {
			b.log = append(b.log, entry{at: e.at + shift, cost: e.cost})
			b.ceiling.sum += e.cost
		}
	}
	b.owe(now, max(from.tat+shift, b.tat), from.interval)
	if from.pauseUntil != 0 {
		b.pauseUntil = max(from.pauseUntil+shift, 0)
	}
}

// Delay reports how long until cost would be admitted, without admitting it.
func (b *Budget) Delay(cost int) (time.Duration, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkCost(cost); err != nil {
		return 0, err
	}
	now := b.now()
	at, _ := b.earliest(now, int64(cost))
	return time.Duration(at - now), nil
}

// SetLimit tightens the budget to limit per window (the registry's learned
// limit). It can only slow the budget down: the configured ceiling stays in
// force beside it, and the pacing rate is the lower of the two. A limit of 0
// removes the learned limit. A faster or equal limit's window counts the
// admissions the budget still holds, so a retune never opens a burst; a
// slower one counts from now on (the bucket's debt carries over, so it
// opens none either): the admissions made at the faster pace were within
// the limit in force then, and holding them to the new one would stall the
// source for a window after every cut. Reconciliation's R9 counts alike.
func (b *Budget) SetLimit(limit int, per time.Duration) error {
	if limit == 0 {
		b.mu.Lock()
		b.learned = window{}
		b.rescale()
		b.mu.Unlock()
		return nil
	}
	if err := (BudgetConfig{Limit: limit, Window: per}).validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := b.learned
	b.learned.limit, b.learned.dur = int64(limit), int64(per)
	switch {
	case old.limit == 0:
		// Start counting from the oldest entry the ceiling still holds, so
		// the new window sees the admissions already made inside it.
		b.learned.start, b.learned.sum = b.ceiling.start, b.ceiling.sum
	case slower(b.learned, old):
		b.learned.start, b.learned.sum = len(b.log), 0
	}
	b.rescale()
	return nil
}

// slower reports whether window a allows fewer units per unit of time than b.
func slower(a, b window) bool {
	return float64(a.limit)*float64(b.dur) < float64(b.limit)*float64(a.dur)
}

// Pause closes the budget until until (taking the later of the current pause
// and until), and returns the pause now in force.
func (b *Budget) Pause(until time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if t := until.Sub(b.epoch).Nanoseconds(); t > b.pauseUntil {
		b.pauseUntil = t
		b.broadcast()
	}
	return b.epoch.Add(time.Duration(b.pauseUntil))
}

// PausedUntil returns when the current pause ends (the zero Time when the
// budget has never been paused).
func (b *Budget) PausedUntil() time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pauseUntil == 0 {
		return time.Time{}
	}
	return b.epoch.Add(time.Duration(b.pauseUntil))
}

// Tokens returns the bucket's current token count.
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	debt := max(b.tat-b.now(), 0)
	return float64(b.capacity) - float64(debt)/float64(b.interval)
}

// Constrain applies a server's Remaining (units left until reset): the
// bucket is drained so that at most remaining units leave before refill, and
// a remaining of 0 pauses the budget for reset. It only ever slows the
// budget; it reports the pause in force.
func (b *Budget) Constrain(remaining int, reset time.Duration) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if remaining <= 0 && reset > 0 {
		if t := now + int64(reset); t > b.pauseUntil {
			b.pauseUntil = t
			b.broadcast()
		}
	} else if r := int64(remaining); r < b.capacity {
		b.tat = max(b.tat, now+(b.capacity-r)*b.interval)
	}
	if b.pauseUntil == 0 {
		return time.Time{}
	}
	return b.epoch.Add(time.Duration(b.pauseUntil))
}

// Limits reports the limit and window in force (the learned one when set)
// and the configured ceiling.
func (b *Budget) Limits() (limit int, window time.Duration, ceiling int, ceilingWindow time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit, window = int(b.ceiling.limit), time.Duration(b.ceiling.dur)
	if b.learned.limit != 0 {
		limit, window = int(b.learned.limit), time.Duration(b.learned.dur)
	}
	return limit, window, int(b.ceiling.limit), time.Duration(b.ceiling.dur)
}

// checkCost rejects a cost that no wait could ever satisfy.
func (b *Budget) checkCost(cost int) error {
	if cost < 1 {
		return fmt.Errorf("cost %d: %w", cost, ErrInvalidCost)
	}
	if int64(cost) > b.capacity {
		return fmt.Errorf("cost %d, capacity %d: %w", cost, b.capacity, ErrCostExceedsCapacity)
	}
	return nil
}

// now returns nanoseconds since epoch, never less than the last reading.
func (b *Budget) now() int64 {
	n := b.clock.Now().Sub(b.epoch).Nanoseconds()
	if n < b.last {
		return b.last
	}
	b.last = n
	return n
}

// earliest returns the earliest time at or after now when cost fits every
// gate, and the gate that holds it back ("" when it fits now). Both gates
// only loosen as time passes, so waiting until the latest of their
// individual times admits the cost if nothing else is admitted meanwhile.
func (b *Budget) earliest(now, cost int64) (int64, Gate) {
	at, gate := now, Gate("")
	if b.pauseUntil > at {
		at, gate = b.pauseUntil, GatePause
	}
	if t := b.tat - (b.capacity-cost)*b.interval; t > at {
		at, gate = t, GateRate
	}
	if t := b.ceiling.fits(b.log, now, cost); t > at {
		at, gate = t, GateRate
	}
	if b.learned.limit != 0 {
		if t := b.learned.fits(b.log, now, cost); t > at {
			at, gate = t, GateRate
		}
	}
	return at, gate
}

// fits slides w to now and returns when cost fits in it.
func (w *window) fits(log []entry, now, cost int64) int64 {
	for w.start < len(log) && log[w.start].at <= now-w.dur {
		w.sum -= log[w.start].cost
		w.start++
	}
	if w.sum+cost <= w.limit {
		return now
	}
	// The cost fits once enough of the oldest entries have left the window;
	// an entry admitted at t counts during [t, t+dur).
	excess := w.sum + cost - w.limit
	for i := w.start; i < len(log); i++ {
		excess -= log[i].cost
		if excess <= 0 {
			return log[i].at + w.dur
		}
	}
	return now // unreachable: cost <= limit
}

// commit records an admission of cost at now. The caller has checked that
// earliest(now, cost) == now.
func (b *Budget) commit(now, cost int64) {
	b.tat = max(b.tat, now) + cost*b.interval
	// An admission at the instant of the last joins its entry, unless a
	// slower retune since began its window after that entry: that window
	// would count the cost and never see it leave.
	if n := len(b.log); n > b.head && b.log[n-1].at == now && (b.learned.limit == 0 || n-1 >= b.learned.start) {
		b.log[n-1].cost += cost
	} else {
		b.log = append(b.log, entry{at: now, cost: cost})
	}
	b.ceiling.sum += cost
	if b.learned.limit != 0 {
		b.learned.sum += cost
	}
	b.compact()
}

// compact drops entries that no window can see any more, in place, once
// they are at least half the log.
func (b *Budget) compact() {
	keep := b.ceiling.start
	if b.learned.limit != 0 {
		keep = min(keep, b.learned.start)
	}
	if keep < 1024 || keep < len(b.log)/2 {
		return
	}
	n := copy(b.log, b.log[keep:])
	clear(b.log[n:])
	b.log = b.log[:n]
	b.ceiling.start -= keep
	if b.learned.limit != 0 {
		b.learned.start -= keep
	}
}

// retune derives the pacing interval and effective capacity from the
// windows: the slower of the configured and learned rates, rounded up so
// pacing never runs faster than either.
func (b *Budget) retune() {
	b.interval = ceilDiv(b.ceiling.dur, b.ceiling.limit)
	b.capacity = min(b.burst, b.ceiling.limit)
	if b.learned.limit != 0 {
		b.interval = max(b.interval, ceilDiv(b.learned.dur, b.learned.limit))
		b.capacity = min(b.capacity, b.learned.limit)
	}
}

// rescale retunes and converts the bucket's debt from the old interval to
// the new, so the tokens owed stay the same in tokens rather than in time.
func (b *Budget) rescale() {
	now := b.now()
	old := b.interval
	b.retune()
	b.owe(now, b.tat, old)
	b.broadcast()
}

// owe sets the bucket to owe what a bucket of tat, paced at old, owed at
// now: the same tokens (not the same time) at b's interval, and never
// more than its capacity.
func (b *Budget) owe(now, tat, old int64) {
	b.tat = tat
	if debt := tat - now; debt > 0 && old != b.interval {
		b.tat = now + int64(math.Ceil(float64(debt)/float64(old)*float64(b.interval)))
	}
	if b.tat-now > b.capacity*b.interval {
		b.tat = now + b.capacity*b.interval
	}
}

// broadcast wakes every waiter so it re-reads the gates.
func (b *Budget) broadcast() {
	if b.changed != nil {
		close(b.changed)
		b.changed = nil
	}
}

// watch returns a channel closed at the next change.
func (b *Budget) watch() <-chan struct{} {
	if b.changed == nil {
		b.changed = make(chan struct{})
	}
	return b.changed
}

// enqueue adds the waiter of arrival stamp ticket in arrival order.
func (b *Budget) enqueue(ticket uint64) {
	b.queue = insertSorted(b.queue, ticket)
}

// insertSorted adds v to the ascending q, unless q holds it.
func insertSorted(q []uint64, v uint64) []uint64 {
	i, found := slices.BinarySearch(q, v)
	if found {
		return q
	}
	return slices.Insert(q, i, v)
}

func (b *Budget) dequeue(ticket uint64) {
	for i, t := range b.queue {
		if t == ticket {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			if i == 0 {
				b.broadcast()
			}
			return
		}
	}
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
