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

// BudgetConfig is the shape of a Budget: three knobs, each in cost units,
// the strictest of which holds at every instant.
type BudgetConfig struct {
	// Limit cost units in any Window is the strict ceiling. Required.
	Limit  int
	Window time.Duration
	// Rate is the token bucket's refill in cost units per second. Zero
	// means Limit per Window.
	Rate float64
	// Burst is the token bucket's capacity: how many cost units may leave
	// back to back after an idle spell. Zero means DefaultBurst. It is not
	// capped at Limit: a bucket of 200 under a ceiling of 120 a second
	// holds 200 tokens, and the window holds each second to 120.
	Burst int
	// CountRequests makes a learned limit (SetLimit) count requests,
	// whatever each costs, for a server that counts requests; otherwise
	// it counts cost units, as the ceiling does.
	CountRequests bool
}

// Budget is a request budget: a token bucket that paces (capacity Burst,
// refilled at Rate) in front of a sliding-window log that no window of
// length Window ever holds more than Limit units of. A learned limit
// (SetLimit) adds a window and a bucket of its own, paced at its limit per
// window. It is safe for concurrent use; the Limiter keeps one per source
// or gateway group, and the API can keep one per token.
//
// Each bucket is kept in GCRA form: one "theoretical arrival time" (tat)
// stands for the token count, tokens = capacity - (tat-now)/interval, so a
// read refills it without a timer and the hot path is integer arithmetic.
type Budget struct {
	mu    sync.Mutex
	clock clock.Clock
	epoch time.Time // times below are nanoseconds since epoch (monotonic for the real clock)
	last  int64     // latest now seen; time never runs backwards here

	ceiling window // the configured Limit per Window, in cost units; never loosened by SetLimit
	learned window // a tighter limit learned at run time; limit 0 when unset

	interval int64 // nanoseconds per token at the configured Rate
	capacity int64 // Burst
	tat      int64

	// The learned limit's own bucket, in the learned window's units:
	// capacity min(Burst, its limit), one token per its window/limit.
	linterval int64
	lcapacity int64
	ltat      int64

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

// entry is what was admitted at one instant: cost units over n requests.
type entry struct {
	at   int64
	cost int64
	n    int64
}

type window struct {
	limit    int64
	dur      int64
	start    int   // index into log of the first entry inside the window
	sum      int64 // units of log[start:]
	requests bool  // counts requests, not cost units
}

// units is what an admission of cost counts in w.
func (w *window) units(cost, n int64) int64 {
	if w.requests {
		return n
	}
	return cost
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
	b.learned.requests = cfg.CountRequests
	b.capacity = int64(cfg.Burst)
	if cfg.Rate > 0 {
		b.interval = int64(math.Ceil(1e9 / cfg.Rate)) // rounded up: never faster than Rate
	} else {
		b.interval = ceilDiv(b.ceiling.dur, b.ceiling.limit)
	}
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
	// A full bucket refills in Burst/Rate: that must fit the nanosecond
	// arithmetic as a window does.
	if burst := float64(max(cfg.Burst, DefaultBurst)); cfg.Rate < 0 || math.IsNaN(cfg.Rate) || math.IsInf(cfg.Rate, 0) ||
		cfg.Rate > 1e9 || cfg.Rate > 0 && burst/cfg.Rate > MaxWindow.Seconds() {
		return fmt.Errorf("rate %v per second: %w", cfg.Rate, ErrInvalidConfig)
	}
	return nil
}

// Allow admits cost units now if every gate has room, and otherwise reports
// which gate refused and how long until it would not. It never blocks and
// does not allocate, but to refuse a cost that can never be admitted
// (above the window's limit or the bucket's capacity): a *CostError.
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
	// Take the request off its entry, unless compact dropped it (no window
	// saw it any more). An entry before a window's start is not in its
	// sum. The entry is recent: only the admissions since it follow it.
	i := len(b.log) - 1
	for i >= 0 && b.log[i].at > from {
		i--
	}
	if i >= 0 && b.log[i].at == from && b.log[i].cost >= cost && b.log[i].n >= 1 {
		b.log[i].cost -= cost
		b.log[i].n--
		for _, w := range windows {
			if i >= w.start {
				w.sum -= w.units(cost, 1)
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
		b.log[j-1].n++
		for _, w := range windows {
			if j-1 >= w.start {
				w.sum += w.units(cost, 1)
			}
		}
		return t
	}
	b.log = slices.Insert(b.log, j, entry{at: t, cost: cost, n: 1})
	for _, w := range windows {
		if j < w.start {
			w.start++
		} else {
			w.sum += w.units(cost, 1)
		}
	}
	return t
}

// Refund takes the permit's cost back out of its budget's ceiling and
// bucket (and a learned limit's, when it counts cost units): the upstream
// refused the request and counted none of what it carried, and the retry
// that follows is charged instead. The request itself stays counted where
// requests are (a learned limit in requests), as the dispatch stays on
// record. Call it once, after Observe; Sent does nothing after it.
func (p *Permit) Refund() {
	if p.budget == nil {
		return
	}
	p.budget.refund(p.at, int64(p.Cost))
	p.budget = nil
}

// refund takes cost, counted at at, back out of every gate that counts
// cost units, unless compact dropped its entry (no window saw it any more).
func (b *Budget) refund(at, cost int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tat -= cost * b.interval
	if b.learned.limit != 0 {
		b.ltat -= b.learned.units(cost, 0) * b.linterval
	}
	i := len(b.log) - 1
	for i >= 0 && b.log[i].at > at {
		i--
	}
	if i >= 0 && b.log[i].at == at && b.log[i].cost >= cost {
		b.log[i].cost -= cost
		for _, w := range [...]*window{&b.ceiling, &b.learned} {
			if w.limit != 0 && i >= w.start {
				w.sum -= w.units(cost, 0)
			}
		}
	}
	b.broadcast()
}

// carry takes over what from, the budget b replaces, holds: its admissions
// (every window of b counts them), the tokens its bucket owes (in tokens,
// paid back at b's pace) and its pause. b is new: nothing else holds it
// yet, and it has no learned limit (SetLimit's first call charges the
// learned bucket with the tokens b's bucket owes).
func (b *Budget) carry(from *Budget) {
	from.mu.Lock()
	defer from.mu.Unlock()
	now := b.now()
	shift := from.epoch.Sub(b.epoch).Nanoseconds() // from's times in b's
	// All of from's log: b's windows, longer or shorter, slide past what is
	// too old for them.
	for _, e := range from.log {
		if e.n > 0 {
			b.log = append(b.log, entry{at: e.at + shift, cost: e.cost, n: e.n})
			b.ceiling.sum += e.cost
		}
	}
	b.tat = owe(now, max(from.tat+shift, b.tat), from.interval, b.interval, b.capacity)
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
// limit), in requests when the budget was configured with CountRequests
// and in cost units otherwise. It can only slow the budget down: the
// configured ceiling and bucket stay in force beside it, and the learned
// limit brings a bucket of its own (capacity min(Burst, limit), refilled
// at limit per window). A limit of 0 removes the learned limit. A cost
// above a learned limit in cost units is not refused (a later cut can put
// the limit under a cost already accepted): it is admitted alone in the
// learned window. A faster or equal limit's window counts the
// admissions the budget still holds, so a retune never opens a burst; a
// slower one counts from now on (the bucket's debt carries over, so it
// opens none either): the admissions made at the faster pace were within
// the limit in force then, and holding them to the new one would stall the
// source for a window after every cut. Reconciliation's R9 counts alike.
func (b *Budget) SetLimit(limit int, per time.Duration) error {
	if limit == 0 {
		b.mu.Lock()
		b.learned = window{requests: b.learned.requests}
		b.broadcast()
		b.mu.Unlock()
		return nil
	}
	if err := (BudgetConfig{Limit: limit, Window: per}).validate(); err != nil {
		return err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	old := b.learned
	b.learned.limit, b.learned.dur = int64(limit), int64(per)
	oldInterval := b.linterval
	b.linterval = ceilDiv(b.learned.dur, b.learned.limit)
	b.lcapacity = min(b.capacity, b.learned.limit)
	switch {
	case old.limit == 0:
		// Start counting from the oldest entry the ceiling still holds, so
		// the new window sees the admissions already made inside it, and
		// owe what the configured bucket owes, in tokens.
		b.learned.start, b.learned.sum = b.ceiling.start, 0
		for _, e := range b.log[b.ceiling.start:] {
			b.learned.sum += b.learned.units(e.cost, e.n)
		}
		b.ltat = owe(now, b.tat, b.interval, b.linterval, b.lcapacity)
	case slower(b.learned, old):
		b.learned.start, b.learned.sum = len(b.log), 0
		fallthrough
	default:
		b.ltat = owe(now, b.ltat, oldInterval, b.linterval, b.lcapacity)
	}
	b.broadcast()
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

// Tokens returns the configured bucket's token count, in cost units. A
// learned limit's bucket, in its own units, is apart.
func (b *Budget) Tokens() float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return float64(b.capacity) - float64(max(b.tat-b.now(), 0))/float64(b.interval)
}

// MaxCost is the largest cost the budget can ever admit: the lower of its
// bucket's capacity and its window's limit.
func (b *Budget) MaxCost() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return int(min(b.capacity, b.ceiling.limit))
}

// CheckCost returns the error Allow and Acquire would return at once for
// cost: a *CostError when no wait could admit it, ErrInvalidCost below 1.
func (b *Budget) CheckCost(cost int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.checkCost(cost)
}

// Constrain applies a server's Remaining (units left until reset, in the
// learned limit's units): the learned limit's bucket (the configured one
// before anything was learned) is drained so that at most remaining units
// leave before refill, and a remaining of 0 pauses the budget for reset.
// It only ever slows the budget; it reports the pause in force.
func (b *Budget) Constrain(remaining int, reset time.Duration) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	if remaining <= 0 && reset > 0 {
		if t := now + int64(reset); t > b.pauseUntil {
			b.pauseUntil = t
			b.broadcast()
		}
	} else if r := int64(remaining); b.learned.limit != 0 {
		if r < b.lcapacity {
			b.ltat = max(b.ltat, now+(b.lcapacity-r)*b.linterval)
		}
	} else if r < b.capacity {
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
	if int64(cost) > b.ceiling.limit {
		return &CostError{Cost: cost, Bound: int(b.ceiling.limit), Window: time.Duration(b.ceiling.dur)}
	}
	if int64(cost) > b.capacity {
		return &CostError{Cost: cost, Bound: int(b.capacity)}
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
		u := b.learned.units(cost, 1)
		if t := b.ltat - (b.lcapacity-u)*b.linterval; t > at {
			at, gate = t, GateRate
		}
		if t := b.learned.fits(b.log, now, u); t > at {
			at, gate = t, GateRate
		}
	}
	return at, gate
}

// fits slides w to now and returns when units fit in it. Units above the
// limit (a learned limit cut under a cost) fit once the window is empty.
func (w *window) fits(log []entry, now, units int64) int64 {
	for w.start < len(log) && log[w.start].at <= now-w.dur {
		w.sum -= w.units(log[w.start].cost, log[w.start].n)
		w.start++
	}
	if w.sum+units <= w.limit || w.sum == 0 {
		return now
	}
	// The units fit once enough of the oldest entries have left the
	// window; an entry admitted at t counts during [t, t+dur).
	excess := w.sum + min(units, w.limit) - w.limit
	for i := w.start; i < len(log); i++ {
		excess -= w.units(log[i].cost, log[i].n)
		if excess <= 0 {
			return log[i].at + w.dur
		}
	}
	return now // unreachable: excess <= sum
}

// commit records an admission of cost at now. The caller has checked that
// earliest(now, cost) == now.
func (b *Budget) commit(now, cost int64) {
	b.tat = max(b.tat, now) + cost*b.interval
	if b.learned.limit != 0 {
		b.ltat = max(b.ltat, now) + b.learned.units(cost, 1)*b.linterval
	}
	// An admission at the instant of the last joins its entry, unless a
	// slower retune since began its window after that entry: that window
	// would count the cost and never see it leave.
	if n := len(b.log); n > b.head && b.log[n-1].at == now && (b.learned.limit == 0 || n-1 >= b.learned.start) {
		b.log[n-1].cost += cost
		b.log[n-1].n++
	} else {
		b.log = append(b.log, entry{at: now, cost: cost, n: 1})
	}
	b.ceiling.sum += cost
	if b.learned.limit != 0 {
		b.learned.sum += b.learned.units(cost, 1)
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

// owe returns the tat of a bucket that owes at now what a bucket of tat,
// paced at old, owed: the same tokens (not the same time) at interval,
// and never more than capacity.
func owe(now, tat, old, interval, capacity int64) int64 {
	if debt := tat - now; debt > 0 && old != interval {
		tat = now + int64(math.Ceil(float64(debt)/float64(old)*float64(interval)))
	}
	return min(tat, now+capacity*interval)
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
