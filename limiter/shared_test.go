package limiter_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
)

// fakeShared is a node's share of a fleet limit: the slots the test grants
// it, each good for grace after its time, as fleet.Slots hands them out.
type fakeShared struct {
	mu      sync.Mutex
	grace   time.Duration
	slots   []time.Time
	taken   []time.Time
	pauses  []time.Time
	opened  []time.Time // BreakerOpened
	maxCost int
	changed chan struct{}
	short   chan struct{} // a token each time Earliest finds too few slots
}

func newFakeShared() *fakeShared {
	return &fakeShared{grace: 20 * time.Millisecond, maxCost: 2, changed: make(chan struct{}), short: make(chan struct{}, 100)}
}

func (f *fakeShared) grant(at ...time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.slots = append(f.slots, at...)
	close(f.changed)
	f.changed = make(chan struct{})
}

func (f *fakeShared) Check(cost int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cost > f.maxCost {
		return errors.New("cost exceeds the slots' grace")
	}
	return nil
}

func (f *fakeShared) expire(now time.Time) {
	for len(f.slots) > 0 && !f.slots[0].Add(f.grace).After(now) {
		f.slots = f.slots[1:]
	}
}

func (f *fakeShared) Earliest(now time.Time, cost int) (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(now)
	if len(f.slots) < cost {
		f.short <- struct{}{}
		return time.Time{}, false
	}
	if at := f.slots[cost-1]; at.After(now) {
		return at, true
	}
	return now, true
}

func (f *fakeShared) Take(now time.Time, cost int) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.expire(now)
	if len(f.slots) < cost || f.slots[cost-1].After(now) {
		return false
	}
	f.slots = f.slots[cost:]
	f.taken = append(f.taken, now)
	return true
}

func (f *fakeShared) Changed() <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.changed
}

func (f *fakeShared) Pause(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pauses = append(f.pauses, until)
}

func (f *fakeShared) BreakerOpened(until time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.opened = append(f.opened, until)
}

func (f *fakeShared) Lag() time.Duration { return 40 * time.Millisecond }

func (f *fakeShared) takes() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]time.Time(nil), f.taken...)
}

var roomy = limiter.Config{Limit: 1000, Window: time.Second, Burst: 1000}

func TestSharedAdmitsAtTheFleetSlot(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": roomy})
	sh := newFakeShared()
	l.Share("s", sh)
	ch := acquireAsync(context.Background(), c, l, "s", limiter.Request{}, 0)
	<-sh.short // holds no slot: waits for a grant, with no timer
	sh.grant(epoch.Add(30 * time.Millisecond))
	c.WaitForTimers(1) // the slot is known: waits for its time
	c.Advance(29 * time.Millisecond)
	select {
	case r := <-ch:
		t.Fatalf("admitted before its fleet slot: %+v", r.p)
	default:
	}
	c.Advance(time.Millisecond)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.p.Admitted.Equal(epoch.Add(30 * time.Millisecond)) {
		t.Fatalf("admitted at %v, want at the slot", r.p.Admitted)
	}
	if len(r.p.Waits) != 1 || r.p.Waits[0].Gate != limiter.GateFleet || r.p.Waits[0].Actual != 30*time.Millisecond {
		t.Fatalf("waits = %+v, want one fleet wait of 30ms", r.p.Waits)
	}
	if got := sh.takes(); len(got) != 1 || !got[0].Equal(r.p.Admitted) {
		t.Fatalf("slots taken at %v, want one at the admission", got)
	}
	if want := r.p.Admitted.Add(sh.Lag()); !r.p.SendBy.Equal(want) {
		t.Fatalf("SendBy = %v, want the admission plus the fleet's lag, %v", r.p.SendBy, want)
	}
}

// Without a fleet a permit has no time to leave by: nothing changes.
func TestUnsharedPermitHasNoSendBy(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{"s": roomy})
	p := mustAcquire(t, l, "s")
	defer p.Release()
	if !p.SendBy.IsZero() {
		t.Fatalf("SendBy = %v without a fleet, want zero", p.SendBy)
	}
}

func TestSharedCutOffShedsAtDeadline(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": roomy})
	sh := newFakeShared() // cut off: no grant ever comes
	l.Share("s", sh)
	ch := acquireAsync(context.Background(), c, l, "s", limiter.Request{Deadline: epoch.Add(time.Second)}, 1)
	c.Advance(time.Second)
	r := <-ch
	var shed *limiter.ShedError
	if !errors.As(r.err, &shed) || shed.Gate != limiter.GateFleet || shed.Wait != 0 {
		t.Fatalf("err = %v, want a shed at the fleet gate with no estimate", r.err)
	}
	if st, _ := l.State("s"); st.InFlight != 0 || st.Queued != 0 {
		t.Fatalf("shed request left state %+v", st)
	}
	if b, _ := l.Budget("s"); b.Tokens() != 1000 {
		t.Fatalf("budget counted a request the fleet refused: %v tokens", b.Tokens())
	}
}

func TestSharedSlotPastDeadlineShedsAtOnceWithItsWait(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{"s": roomy})
	sh := newFakeShared()
	sh.grant(epoch.Add(3 * time.Second))
	l.Share("s", sh)
	_, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: epoch.Add(time.Second)})
	var shed *limiter.ShedError
	if !errors.As(err, &shed) || shed.Gate != limiter.GateFleet || shed.Wait != 3*time.Second {
		t.Fatalf("err = %v, want a shed at the fleet gate with a 3s wait", err)
	}
}

func TestSharedKeepsTheBudgetsOwnGates(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 10, Window: time.Second}})
	sh := newFakeShared()
	l.Share("s", sh)
	sh.grant(epoch, epoch.Add(10*time.Millisecond))
	mustAcquire(t, l, "s").Release()
	// The fleet holds a slot at 10ms, but the budget's own pace is 100ms.
	ch := acquireAsync(context.Background(), c, l, "s", limiter.Request{}, 1)
	c.Advance(10 * time.Millisecond)
	select {
	case r := <-ch:
		t.Fatalf("a fleet slot admitted past the budget's own rate: %+v", r.p)
	default:
	}
	sh.grant(epoch.Add(100 * time.Millisecond))
	c.Advance(90 * time.Millisecond)
	r := <-ch
	if r.err != nil || !r.p.Admitted.Equal(epoch.Add(100*time.Millisecond)) {
		t.Fatalf("admitted %+v, %v; want at 100ms", r.p, r.err)
	}
}

func TestSharedOfAGroupAndPause(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{
		"a": {Limit: 1000, Window: time.Second, Burst: 1000, Group: "g"},
		"b": {Limit: 1000, Window: time.Second, Burst: 1000, Group: "g"},
	})
	sh := newFakeShared()
	l.Share("g", sh)
	sh.grant(epoch)
	mustAcquire(t, l, "a").Release()
	_, err := l.Acquire(context.Background(), "b", limiter.Request{Deadline: epoch})
	if !errors.Is(err, limiter.ErrShed) {
		t.Fatalf("b took a slot the group's share had already spent: %v", err)
	}
	until := epoch.Add(time.Minute)
	if got, _ := l.Pause("b", until); !got.Equal(until) {
		t.Fatalf("pause in force %v", got)
	}
	if len(sh.pauses) != 1 || !sh.pauses[0].Equal(until) {
		t.Fatalf("fleet told of pauses %v, want %v", sh.pauses, until)
	}
	if _, err := l.Acquire(context.Background(), "a", limiter.Request{Cost: 3}); !errors.Is(err, limiter.ErrCostExceedsCapacity) {
		t.Fatalf("a cost the fleet cannot serve: %v", err)
	}
	l.Share("g", nil)
	var shed *limiter.ShedError
	if _, err := l.Acquire(context.Background(), "a", limiter.Request{Deadline: epoch}); !errors.As(err, &shed) || shed.Gate != limiter.GatePause {
		t.Fatalf("detached and paused: %v, want a shed at the pause gate", err)
	}
}

// TestSharedCostCheckedAgainAtTheGate: a request of cost 2 queues at the
// fleet gate while the fleet can serve it; the fleet's rate is then cut
// (the slots spaced past its grace), so no slots could ever serve it. The
// request fails with ErrCostExceedsCapacity at its next look, rather than
// waiting at the head of the queue for slots that never come.
func TestSharedCostCheckedAgainAtTheGate(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": roomy})
	sh := newFakeShared()
	l.Share("s", sh)
	ch := acquireAsync(context.Background(), c, l, "s", limiter.Request{Cost: 2}, 0)
	<-sh.short // queued at the fleet gate, holding no slots
	sh.mu.Lock()
	sh.maxCost = 1
	sh.mu.Unlock()
	sh.grant(epoch, epoch) // wakes it: two slots at once, yet the cost is now refused
	r := <-ch
	if !errors.Is(r.err, limiter.ErrCostExceedsCapacity) {
		t.Fatalf("a cost the fleet can no longer serve: %+v, %v; want ErrCostExceedsCapacity", r.p, r.err)
	}
	if len(sh.takes()) != 0 {
		t.Fatalf("took %v for a refused cost", sh.takes())
	}
	mustAcquire(t, l, "s").Release() // the queue is free for the next request
}

// TestSharedToldOfBreakerOpenings: the fleet is told when the breaker of a
// shared source opens, with when its probe may go (after the cooldown, and
// after a failed probe the doubled one), and of nothing else it does.
func TestSharedToldOfBreakerOpenings(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 1000, BreakerThreshold: 2, BreakerCooldown: time.Minute}})
	sh := newFakeShared()
	l.Share("s", sh)
	fail := func() limiter.Verdict {
		t.Helper()
		sh.grant(c.Now())
		return mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 503})
	}
	fail()
	opened := c.Now()
	if v := fail(); len(v.Breaker) != 1 || v.Breaker[0].To != limiter.BreakerOpen {
		t.Fatalf("two failures: %+v", v.Breaker)
	}
	c.Advance(time.Minute)
	if v := fail(); !v.Probe || len(v.Breaker) != 1 || v.Breaker[0].To != limiter.BreakerOpen {
		t.Fatalf("the failed probe: probe %v, %+v", v.Probe, v.Breaker)
	}
	reopened := c.Now()
	c.Advance(2 * time.Minute)
	sh.grant(c.Now())
	if v := mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 200}); len(v.Breaker) != 1 || v.Breaker[0].To != limiter.BreakerClosed {
		t.Fatalf("the probe that closed it: %+v", v.Breaker)
	}
	want := []time.Time{opened.Add(time.Minute), reopened.Add(2 * time.Minute)}
	if len(sh.opened) != 2 || !sh.opened[0].Equal(want[0]) || !sh.opened[1].Equal(want[1]) {
		t.Fatalf("fleet told of openings %v, want %v", sh.opened, want)
	}
}

// fakeLearner is a fakeShared that learns the fleet's rate: it records
// what it is told of each response.
type fakeLearner struct {
	*fakeShared
	observed []string
	byHand   []string
}

func (f *fakeLearner) SetByHand(limit int, window time.Duration) {
	f.byHand = append(f.byHand, fmt.Sprintf("%d/%v", limit, window))
}

func (f *fakeLearner) Observed(admitted time.Time, c limiter.Class, h hints.Hint) {
	f.observed = append(f.observed, fmt.Sprintf("%s %s %v", admitted.Sub(epoch), c, h.HasRetryAfter))
}

// TestSharedLearnerPacesTheBudget: with a Learner attached, the fleet's
// slots pace the budget: a learned pace set before or after it is not
// applied, and the Learner is told of every response, a refusal's hint
// included. Detached, the node's own pace applies again.
func TestSharedLearnerPacesTheBudget(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 100, Window: time.Second, Burst: 1}})
	if err := l.SetLimit("s", 1, time.Second); err != nil { // learned alone: 1/s
		t.Fatal(err)
	}
	sh := &fakeLearner{fakeShared: newFakeShared()}
	l.Share("s", sh)
	if err := l.SetLimit("s", 1, time.Second); err != nil {
		t.Fatal(err)
	}
	// Slots 10ms apart: the ceiling (100/s) admits them, 1/s would not. A
	// refusal pauses the budget for its backoff: the next slot is later.
	for i, at := range []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, time.Minute} {
		c.Set(epoch.Add(at))
		sh.grant(c.Now())
		p, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: c.Now()})
		if err != nil {
			t.Fatalf("at %v, with a fleet slot: %v (a pace of its own held it)", at, err)
		}
		var h hints.Hint
		if i == 3 {
			h = hints.Hint{RetryAfter: time.Second, HasRetryAfter: true}
		}
		p.Observe(limiter.Outcome{Status: []int{200, 200, 429, 429}[i], Hint: h})
	}
	want := []string{"0s success false", "10ms success false", "20ms throttled false", "1m0s throttled true"}
	if fmt.Sprint(sh.observed) != fmt.Sprint(want) {
		t.Fatalf("the learner was told %q, want %q", sh.observed, want)
	}
	if err := l.SetLimitByHand("s", 5, time.Second); err != nil || fmt.Sprint(sh.byHand) != "[5/1s]" {
		t.Fatalf("an operator's limit reached the learner as %v (%v), want [5/1s]", sh.byHand, err)
	}
	l.Share("s", nil)
	if err := l.SetLimitByHand("s", 1, time.Second); err != nil {
		t.Fatal(err)
	}
	if d, _ := l.Budget("s"); d != nil {
		if lim, win, _, _ := d.Limits(); lim != 1 || win != time.Second {
			t.Fatalf("detached, the budget paces at %d per %v, want its own 1/s", lim, win)
		}
	}
}
