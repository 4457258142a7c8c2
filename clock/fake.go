package clock

import (
	"sort"
	"sync"
	"time"
)

// Fake is a Clock that moves only when told to. Timers fire, in deadline
// order, when Advance or Set moves the time to or past their deadline.
// It is safe for concurrent use.
type Fake struct {
	mu      sync.Mutex
	now     time.Time
	timers  []*fakeTimer
	waiters chan struct{} // closed and replaced whenever a timer is created
}

// NewFake returns a Fake clock set to start.
func NewFake(start time.Time) *Fake {
	return &Fake{now: start, waiters: make(chan struct{})}
}

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// NewTimer returns a timer that fires when the fake time reaches Now()+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := &fakeTimer{f: f, when: f.now.Add(d), c: make(chan time.Time, 1)}
	if d <= 0 {
		t.c <- f.now
		t.fired = true
		return t
	}
	f.timers = append(f.timers, t)
	close(f.waiters)
	f.waiters = make(chan struct{})
	return t
}

// Advance moves the time forward by d, firing every timer that falls due.
func (f *Fake) Advance(d time.Duration) { f.Set(f.Now().Add(d)) }

// Set moves the time to t (never backwards), firing every timer that falls due.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if t.Before(f.now) {
		return
	}
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].when.Before(f.timers[j].when) })
	keep := f.timers[:0]
	for _, tm := range f.timers {
		if !tm.when.After(t) {
			tm.fired = true
			tm.c <- tm.when
			continue
		}
		keep = append(keep, tm)
	}
	clear(f.timers[len(keep):])
	f.timers = keep
	f.now = t
}

// Pending returns how many timers wait to fire.
func (f *Fake) Pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// Next returns the deadline of the earliest pending timer, and false when
// none is pending.
func (f *Fake) Next() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	next := f.timers[0].when
	for _, t := range f.timers[1:] {
		if t.when.Before(next) {
			next = t.when
		}
	}
	return next, true
}

// WaitForTimers blocks until at least n timers are pending. Tests use it to
// know that the goroutines under test have started waiting.
func (f *Fake) WaitForTimers(n int) {
	for {
		f.mu.Lock()
		if len(f.timers) >= n {
			f.mu.Unlock()
			return
		}
		ch := f.waiters
		f.mu.Unlock()
		<-ch
	}
}

type fakeTimer struct {
	f     *Fake
	when  time.Time
	c     chan time.Time
	fired bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Stop() bool {
	t.f.mu.Lock()
	defer t.f.mu.Unlock()
	if t.fired {
		return false
	}
	for i, x := range t.f.timers {
		if x == t {
			t.f.timers = append(t.f.timers[:i], t.f.timers[i+1:]...)
			break
		}
	}
	t.fired = true
	return true
}
