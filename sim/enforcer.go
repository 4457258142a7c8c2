package sim

import (
	"math/bits"
	"sync"
	"time"
)

// verdict is what an enforcer decided about one request, with what a gateway
// would advertise about its state afterwards.
type verdict struct {
	ok        bool
	wait      time.Duration // when rejected: until a request would be admitted
	requests  int           // the limit in force: requests per window
	window    time.Duration
	remaining int           // requests that could be admitted back to back now
	reset     time.Duration // until the limit is fully replenished
}

// counter is one shape's bookkeeping. Offsets are durations since the
// simulator started and never go backwards (the enforcer sees to that).
type counter interface {
	admit(at time.Duration) verdict
	// retune puts new numbers in force at offset at.
	retune(at time.Duration, requests int, window time.Duration, burst int)
}

// enforcer applies one Limit, changes included, to the requests of one
// upstream or of every upstream in a group. It is safe for concurrent use.
type enforcer struct {
	mu      sync.Mutex
	changes []Change
	next    int // index of the first change not yet in force
	window  time.Duration
	burst   int
	last    time.Duration // latest offset seen
	c       counter
}

// newEnforcer returns the enforcer for l, or nil when l limits nothing.
func newEnforcer(l *Limit) *enforcer {
	if l == nil || l.Shape == ShapeNone {
		return nil
	}
	e := &enforcer{changes: l.Changes, window: l.Window, burst: l.Burst}
	switch l.Shape {
	case ShapeLeakyBucket, ShapeTokenBucket:
		b := &bucket{leaky: l.Shape == ShapeLeakyBucket}
		b.retune(0, l.Requests, l.Window, l.Burst)
		e.c = b
	case ShapeFixedWindow:
		e.c = &fixedWindow{requests: l.Requests, window: l.Window, index: -1}
	case ShapeSlidingWindow:
		e.c = &slidingLog{requests: l.Requests, window: l.Window}
	}
	return e
}

func (e *enforcer) admit(at time.Duration) verdict {
	e.mu.Lock()
	defer e.mu.Unlock()
	// Requests read the clock before taking the lock, so two of them can
	// arrive out of order by a hair; counting the late one at the latest
	// offset keeps every counter's time monotonic.
	at = max(at, e.last)
	e.last = at
	// Changes take effect lazily, at the first request after they fall due,
	// but at their own offset, so the result is what a server that changed
	// on the dot would have done.
	for e.next < len(e.changes) && e.changes[e.next].After <= at {
		ch := e.changes[e.next]
		if ch.Window != nil {
			e.window = *ch.Window
		}
		if ch.Burst != nil {
			e.burst = *ch.Burst
		}
		e.c.retune(ch.After, ch.Requests, e.window, e.burst)
		e.next++
	}
	return e.c.admit(at)
}

// bucket is a leaky bucket in GCRA form (what nginx limit_req does) and, with
// another capacity, a token bucket: the two are the same algorithm. It holds
// up to capacity requests and drains requests per window.
//
// The level is kept in units of request·window-nanoseconds: a request adds
// window units and each nanosecond drains requests units. Integer arithmetic
// is then exact for any rate, 1/3 s included, and the bounds in scenario.go
// keep capacity*window below 2^63.
type bucket struct {
	leaky    bool  // capacity is burst+1 (nginx); otherwise burst (token bucket)
	requests int64 // drain per nanosecond, in units
	window   int64 // units one request adds
	capacity int64 // in requests
	level    int64 // in units, as of last
	last     time.Duration
}

func (b *bucket) drain(at time.Duration) {
	if at <= b.last {
		return
	}
	elapsed := int64(at - b.last)
	b.last = at
	if elapsed >= ceilDiv(b.level, b.requests) {
		b.level = 0
		return
	}
	b.level -= elapsed * b.requests
}

func (b *bucket) admit(at time.Duration) verdict {
	b.drain(at)
	v := verdict{requests: int(b.requests), window: time.Duration(b.window)}
	full := b.capacity * b.window
	if b.level+b.window <= full {
		b.level += b.window
		v.ok = true
	} else {
		v.wait = time.Duration(ceilDiv(b.level+b.window-full, b.requests))
	}
	v.remaining = int((full - b.level) / b.window)
	v.reset = time.Duration(ceilDiv(b.level, b.requests))
	return v
}

func (b *bucket) retune(at time.Duration, requests int, window time.Duration, burst int) {
	b.drain(at)
	// The water in the bucket, counted in requests, stays when the window
	// changes: rescale the level to the new unit.
	if b.window != 0 && int64(window) != b.window {
		hi, lo := bits.Mul64(uint64(b.level), uint64(window))
		q, _ := bits.Div64(hi, lo, uint64(b.window))
		b.level = int64(q)
	}
	b.requests, b.window = int64(requests), int64(window)
	b.capacity = int64(burst)
	if b.leaky {
		b.capacity++
	}
}

// fixedWindow admits requests in each window [k*window, (k+1)*window) after
// the start; windows are aligned to the start, not to the wall clock.
type fixedWindow struct {
	requests int
	window   time.Duration
	index    int64 // the window count belongs to; -1 before the first
	count    int
}

func (f *fixedWindow) admit(at time.Duration) verdict {
	k := int64(at / f.window)
	if k != f.index {
		f.index, f.count = k, 0
	}
	end := time.Duration(k+1)*f.window - at
	v := verdict{requests: f.requests, window: f.window, reset: end}
	if f.count < f.requests {
		f.count++
		v.ok = true
	} else {
		v.wait = end
	}
	v.remaining = max(0, f.requests-f.count)
	return v
}

func (f *fixedWindow) retune(_ time.Duration, requests int, window time.Duration, _ int) {
	if window != f.window {
		f.index = -1 // other boundaries: count afresh
	}
	f.requests, f.window = requests, window
}

// slidingLog admits a request when fewer than requests were admitted in the
// half-open interval (at-window, at]: an admitted request stops counting
// exactly window after it was admitted. Rejected requests are not counted.
type slidingLog struct {
	requests int
	window   time.Duration
	times    []time.Duration // admitted offsets still counting, oldest first
}

func (s *slidingLog) admit(at time.Duration) verdict {
	i := 0
	for i < len(s.times) && s.times[i] <= at-s.window {
		i++
	}
	s.times = s.times[i:]
	v := verdict{requests: s.requests, window: s.window}
	if len(s.times) < s.requests {
		s.times = append(s.times, at)
		v.ok = true
	} else {
		// Room appears when all but requests-1 of the live entries expired.
		v.wait = s.times[len(s.times)-s.requests] + s.window - at
	}
	v.remaining = max(0, s.requests-len(s.times))
	if n := len(s.times); n > 0 {
		v.reset = s.times[n-1] + s.window - at
	}
	return v
}

func (s *slidingLog) retune(_ time.Duration, requests int, window time.Duration, _ int) {
	s.requests, s.window = requests, window
}

// ceilDiv is a/b rounded up, for a >= 0 and b > 0.
func ceilDiv(a, b int64) int64 {
	if a <= 0 {
		return 0
	}
	return (a-1)/b + 1
}
