package limiter_test

import (
	"context"
	"errors"
	"net/http"
	"runtime"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
)

// newLimiter returns a limiter on a fake clock with deterministic jitter
// (always the maximum, so backoff = the full exponential).
// fataler is what newLimiter needs from a *testing.T or a *rapid.T.
type fataler interface {
	Helper()
	Fatalf(format string, args ...any)
}

func newLimiter(tb fataler, cfgs map[string]limiter.Config) (*limiter.Limiter, *clock.Fake) {
	tb.Helper()
	c := clock.NewFake(epoch)
	l := limiter.New(c)
	l.Jitter = func(n time.Duration) time.Duration { return max(n-1, 0) }
	for id, cfg := range cfgs {
		if err := l.Configure(id, cfg); err != nil {
			tb.Fatalf("Configure(%s): %v", id, err)
		}
	}
	return l, c
}

type result struct {
	p   *limiter.Permit
	err error
}

// acquireAsync starts Acquire in a goroutine and waits until it blocks on a
// timer (the fake clock's way of saying "it is waiting").
func acquireAsync(ctx context.Context, c *clock.Fake, l *limiter.Limiter, id string, req limiter.Request, timers int) <-chan result {
	ch := make(chan result, 1)
	go func() {
		p, err := l.Acquire(ctx, id, req)
		ch <- result{p, err}
	}()
	if timers > 0 {
		c.WaitForTimers(timers)
	}
	return ch
}

// advanceToNextTimer sets c to its next timer's time, waiting for a timer
// to be armed when none is (a waiter between stopping one and arming the
// next).
func advanceToNextTimer(c *clock.Fake) {
	for {
		if next, ok := c.Next(); ok {
			c.Set(next)
			return
		}
		runtime.Gosched()
	}
}

func mustAcquire(tb testing.TB, l *limiter.Limiter, id string) *limiter.Permit {
	tb.Helper()
	p, err := l.Acquire(context.Background(), id, limiter.Request{})
	if err != nil {
		tb.Fatalf("Acquire(%s): %v", id, err)
	}
	return p
}

func TestAcquireWaitsAtRateAndReportsIt(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"county": {Limit: 10, Window: time.Second}})
	mustAcquire(t, l, "county").Release()
	ch := acquireAsync(context.Background(), c, l, "county", limiter.Request{}, 1)
	c.Advance(99 * time.Millisecond)
	select {
	case r := <-ch:
		t.Fatalf("admitted before its slot: %+v", r.p)
	default:
	}
	c.Advance(time.Millisecond)
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	want := []limiter.Wait{{Gate: limiter.GateRate, Planned: 100 * time.Millisecond, Actual: 100 * time.Millisecond}}
	if len(r.p.Waits) != 1 || r.p.Waits[0] != want[0] {
		t.Fatalf("waits = %+v, want %+v", r.p.Waits, want)
	}
	if !r.p.Admitted.Equal(epoch.Add(100 * time.Millisecond)) {
		t.Fatalf("admitted at %v", r.p.Admitted)
	}
}

func TestAcquireSheds(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(*limiter.Limiter)
		gate  limiter.Gate
	}{
		{"RateWaitPastDeadline", func(l *limiter.Limiter) { mustAcquire(t, l, "s").Release() }, limiter.GateRate},
		{"PausePastDeadline", func(l *limiter.Limiter) { l.Pause("s", epoch.Add(time.Hour)) }, limiter.GatePause},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1, Window: time.Minute}})
			tt.setup(l)
			p, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: epoch.Add(time.Second)})
			var shed *limiter.ShedError
			if !errors.As(err, &shed) || !errors.Is(err, limiter.ErrShed) || shed.Gate != tt.gate {
				t.Fatalf("err = %v, want shed at %s", err, tt.gate)
			}
			if st, _ := l.State("s"); st.InFlight != 0 {
				t.Fatalf("shed request holds %d slots", st.InFlight)
			}
			if len(p.Waits) != 1 || p.Waits[0].Gate != tt.gate || p.Waits[0].Actual != 0 {
				t.Fatalf("waits = %+v", p.Waits)
			}
		})
	}
	t.Run("ConcurrencyAtDeadline", func(t *testing.T) {
		l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 100, Window: time.Second, Burst: 100, Concurrency: 1}})
		held := mustAcquire(t, l, "s")
		defer held.Release()
		ch := acquireAsync(context.Background(), c, l, "s", limiter.Request{Deadline: epoch.Add(time.Second)}, 1)
		c.Advance(time.Second)
		r := <-ch
		var shed *limiter.ShedError
		if !errors.As(r.err, &shed) || shed.Gate != limiter.GateConcurrency {
			t.Fatalf("err = %v, want shed at concurrency", r.err)
		}
		if got := r.p.Waits; len(got) != 1 || got[0].Actual != time.Second {
			t.Fatalf("waits = %+v", got)
		}
	})
}

func TestAcquireCostAboveCapacityFailsAtOnce(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{"s": {Limit: 10, Window: time.Second, Burst: 5}})
	_, err := l.Acquire(context.Background(), "s", limiter.Request{Cost: 6})
	if !errors.Is(err, limiter.ErrCostExceedsCapacity) {
		t.Fatalf("err = %v", err)
	}
	if _, err := l.Acquire(context.Background(), "nope", limiter.Request{}); !errors.Is(err, limiter.ErrUnknownSource) {
		t.Fatalf("unknown source: %v", err)
	}
}

// TestCancellationNeverLeaksSlot cancels waiters at every gate and checks
// that the slot count comes back to what the holders hold.
func TestCancellationNeverLeaksSlot(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1, Window: time.Second, Concurrency: 2}})
	held := mustAcquire(t, l, "s") // slot 1, and the rate gate is now closed for 1s

	// Waiter A gets slot 2 and waits at the rate gate (a timer); waiter B
	// finds no slot and waits at concurrency (no timer).
	ctxA, cancelA := context.WithCancel(context.Background())
	a := acquireAsync(ctxA, c, l, "s", limiter.Request{}, 1)
	ctxB, cancelB := context.WithCancel(context.Background())
	b := acquireAsync(ctxB, c, l, "s", limiter.Request{}, 0)
	for {
		if st, _ := l.State("s"); st.InFlight == 2 {
			break
		}
		runtime.Gosched()
	}
	cancelB()
	if r := <-b; !errors.Is(r.err, context.Canceled) {
		t.Fatalf("B: %v", r.err)
	}
	cancelA()
	if r := <-a; !errors.Is(r.err, context.Canceled) || len(r.p.Waits) != 1 || r.p.Waits[0].Gate != limiter.GateRate {
		t.Fatalf("A: %v %+v", r.err, r.p.Waits)
	}
	if st, _ := l.State("s"); st.InFlight != 1 {
		t.Fatalf("in flight = %d after cancelling both waiters, want 1", st.InFlight)
	}
	held.Observe(limiter.Outcome{Status: 200, Attempt: 1})
	held.Release() // a second release must not free a slot twice
	if st, _ := l.State("s"); st.InFlight != 0 {
		t.Fatalf("in flight = %d after release", st.InFlight)
	}
	c.Advance(time.Second)
	mustAcquire(t, l, "s").Release()
}

func TestThrottleHonouredToTheMicrosecond(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"geo": {Limit: 100, Window: time.Second, Burst: 100, BackoffBase: time.Millisecond, BackoffMax: time.Millisecond}})
	p := mustAcquire(t, l, "geo")
	h := hints.Parse(http.Header{"Retry-After": {"2.500001"}}, c.Now())
	v := p.Observe(limiter.Outcome{Status: 429, Hint: h, Attempt: 1})
	if !v.Throttled() || v.RetryAfter != 2500001*time.Microsecond || v.Clamped || v.Wait != v.RetryAfter {
		t.Fatalf("verdict = %+v", v)
	}
	if !v.PausedUntil.Equal(epoch.Add(v.Wait)) {
		t.Fatalf("paused until %v, want %v", v.PausedUntil, epoch.Add(v.Wait))
	}
	ch := acquireAsync(context.Background(), c, l, "geo", limiter.Request{}, 1)
	c.Advance(v.Wait - time.Microsecond)
	select {
	case r := <-ch:
		t.Fatalf("dispatched inside the throttle's wait: %+v", r.p)
	default:
	}
	c.Advance(time.Microsecond)
	r := <-ch
	if r.err != nil || !r.p.Admitted.Equal(epoch.Add(v.Wait)) {
		t.Fatalf("admitted at %v, err %v", r.p.Admitted, r.err)
	}
	if w := r.p.Waits; len(w) != 1 || w[0].Gate != limiter.GatePause || w[0].Actual != v.Wait || w[0].Planned != v.Wait {
		t.Fatalf("waits = %+v", w)
	}
}

func TestThrottleClampAndBackoff(t *testing.T) {
	for _, tt := range []struct {
		name        string
		status      int
		retryAfter  string
		attempt     int
		wantClamped bool
		wantBackoff time.Duration
		wantWait    time.Duration
		wantClass   limiter.Class
	}{
		{"HintAboveCapIsClamped", 429, "86400", 1, true, time.Second, 5 * time.Minute, limiter.ClassThrottled},
		{"BackoffWinsOverShortHint", 429, "1", 4, false, 8 * time.Second, 8 * time.Second, limiter.ClassThrottled},
		{"NoHintUsesBackoff", 429, "", 2, false, 2 * time.Second, 2 * time.Second, limiter.ClassThrottled},
		{"BackoffCapped", 429, "", 30, false, time.Minute, time.Minute, limiter.ClassThrottled},
		{"Unavailable503WithRetryAfterThrottles", 503, "30", 1, false, time.Second, 30 * time.Second, limiter.ClassThrottled},
		{"Unavailable503WithoutRetryAfterIsServerError", 503, "", 1, false, time.Second, time.Second, limiter.ClassServer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, _ := newLimiter(t, map[string]limiter.Config{"s": {}})
			p := mustAcquire(t, l, "s")
			h := http.Header{}
			if tt.retryAfter != "" {
				h.Set("Retry-After", tt.retryAfter)
			}
			v := p.Observe(limiter.Outcome{Status: tt.status, Hint: hints.Parse(h, epoch), Attempt: tt.attempt})
			if v.Class != tt.wantClass || v.Clamped != tt.wantClamped || v.Backoff != tt.wantBackoff || v.Wait != tt.wantWait {
				t.Fatalf("verdict = %+v", v)
			}
			if v.RetryAfterRaw != tt.retryAfter {
				t.Fatalf("raw = %q", v.RetryAfterRaw)
			}
		})
	}
}

// TestJitterOnlyAddsToServerDelay: whatever the jitter draws, the chosen
// wait is never below the (clamped) server hint.
func TestJitterOnlyAddsToServerDelay(t *testing.T) {
	for _, jitter := range []func(time.Duration) time.Duration{
		func(time.Duration) time.Duration { return 0 },
		func(n time.Duration) time.Duration { return n - 1 },
	} {
		for attempt := 1; attempt < 8; attempt++ {
			// A limiter per attempt: the pause the last one left is not the subject.
			l, _ := newLimiter(t, map[string]limiter.Config{"s": {BackoffBase: 10 * time.Second, BackoffMax: time.Minute}})
			l.Jitter = jitter
			p := mustAcquire(t, l, "s")
			v := p.Observe(limiter.Outcome{Status: 429, Hint: hints.Hint{HasRetryAfter: true, RetryAfter: 7 * time.Second}, Attempt: attempt})
			if v.Wait < 7*time.Second || v.Wait != max(7*time.Second, v.Backoff) {
				t.Fatalf("attempt %d: wait %v, backoff %v", attempt, v.Wait, v.Backoff)
			}
		}
	}
}

func TestGroupMembersShareBudgetAndPause(t *testing.T) {
	cfg := limiter.Config{Group: "arcgis-online", Limit: 2, Window: time.Second, Burst: 2}
	l, c := newLimiter(t, map[string]limiter.Config{"a": cfg, "b": cfg, "solo": {Limit: 2, Window: time.Second, Burst: 2}})
	mustAcquire(t, l, "a").Release()
	mustAcquire(t, l, "b").Release()
	if _, err := l.Acquire(context.Background(), "a", limiter.Request{Deadline: epoch.Add(time.Millisecond)}); !errors.Is(err, limiter.ErrShed) {
		t.Fatalf("a after the group spent its budget: %v", err)
	}
	mustAcquire(t, l, "solo").Release() // another source is untouched

	c.Advance(time.Second)
	p := mustAcquire(t, l, "a")
	v := p.Observe(limiter.Outcome{Status: 429, Hint: hints.Hint{HasRetryAfter: true, RetryAfter: 30 * time.Second}, Attempt: 1})
	_, err := l.Acquire(context.Background(), "b", limiter.Request{Deadline: epoch.Add(10 * time.Second)})
	var shed *limiter.ShedError
	if !errors.As(err, &shed) || shed.Gate != limiter.GatePause || shed.Wait != v.Wait {
		t.Fatalf("b during a's throttle: %v", err)
	}
	if st, _ := l.State("solo"); !st.PausedUntil.IsZero() {
		t.Fatalf("solo paused by another group's throttle until %v", st.PausedUntil)
	}
	if err := l.Configure("c", limiter.Config{Group: "arcgis-online", Limit: 3, Window: time.Second}); !errors.Is(err, limiter.ErrGroupConflict) {
		t.Fatalf("conflicting member: %v", err)
	}
}

func TestRateWaitersAreFIFO(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 10, Window: time.Second, Burst: 5, Concurrency: 10}})
	mustAcquire(t, l, "s").Release()
	// A big request queued first must not be starved by small ones behind it.
	big := acquireAsync(context.Background(), c, l, "s", limiter.Request{Cost: 5}, 1)
	small := acquireAsync(context.Background(), c, l, "s", limiter.Request{Cost: 1}, 0)
	for {
		if st, _ := l.State("s"); st.Queued == 2 {
			break
		}
		runtime.Gosched()
	}
	// The small request would fit the bucket now; only the queue holds it.
	// Big may be re-arming its timer, woken by small's arrival: the clock
	// moves to the next timer once there is one.
	advanceToNextTimer(c)
	r := <-big
	if r.err != nil {
		t.Fatal(r.err)
	}
	select {
	case s := <-small:
		t.Fatalf("small admitted at %v, before big at %v", s.p.Admitted, r.p.Admitted)
	default:
	}
	advanceToNextTimer(c)
	if s := <-small; s.err != nil || !s.p.Admitted.After(r.p.Admitted) {
		t.Fatalf("small: %v at %v", s.err, s.p.Admitted)
	}
}
