package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/auditd/auditd/limiter"
)

var legal = map[[2]limiter.BreakerState]bool{
	{limiter.BreakerClosed, limiter.BreakerOpen}:     true,
	{limiter.BreakerOpen, limiter.BreakerHalfOpen}:   true,
	{limiter.BreakerHalfOpen, limiter.BreakerClosed}: true,
	{limiter.BreakerHalfOpen, limiter.BreakerOpen}:   true,
}

func TestBreakerLifecycle(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100, BreakerThreshold: 2, BreakerCooldown: time.Minute}})
	fail := func() limiter.Verdict {
		return mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 500, Attempt: 1})
	}

	if v := fail(); len(v.Breaker) != 0 {
		t.Fatalf("one failure moved it: %+v", v.Breaker)
	}
	// A 429 neither counts nor resets.
	mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 429, Attempt: 1})
	l.Pause("s", time.Time{})
	c.Advance(time.Minute) // let the 429's pause pass
	v := fail()
	want := limiter.Transition{Source: "s", From: limiter.BreakerClosed, To: limiter.BreakerOpen, Failures: 2, Threshold: 2, Cooldown: time.Minute, At: c.Now()}
	if len(v.Breaker) != 1 || v.Breaker[0] != want {
		t.Fatalf("transitions = %+v, want %+v", v.Breaker, want)
	}
	// Open: shed at the breaker when the cooldown outlasts the deadline.
	_, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: c.Now().Add(time.Second)})
	var shed *limiter.ShedError
	if !errors.As(err, &shed) || shed.Gate != limiter.GateBreaker || shed.Wait != time.Minute {
		t.Fatalf("open breaker: %v", err)
	}
	c.Advance(time.Minute)
	probe := mustAcquire(t, l, "s")
	if !probe.Probe || len(probe.Breaker) != 1 || probe.Breaker[0].To != limiter.BreakerHalfOpen {
		t.Fatalf("after cooldown: probe=%v transitions=%+v", probe.Probe, probe.Breaker)
	}
	// One probe at a time (BreakerProbes default 1).
	if _, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: c.Now()}); !errors.As(err, &shed) || shed.Gate != limiter.GateBreaker {
		t.Fatalf("second probe: %v", err)
	}
	v = probe.Observe(limiter.Outcome{Status: 200, Attempt: 1})
	if !v.Probe || len(v.Breaker) != 1 || v.Breaker[0].From != limiter.BreakerHalfOpen || v.Breaker[0].To != limiter.BreakerClosed || v.Breaker[0].Failures != 0 {
		t.Fatalf("probe success: %+v", v)
	}
	if st, _ := l.State("s"); st.Breaker != limiter.BreakerClosed || st.Failures != 0 {
		t.Fatalf("state = %+v", st)
	}
}

// TestBreakerTransitionsLegal drives random outcomes, waits and deadlines
// through one source and checks, against a model, that every reported
// transition is legal and continues from the state before it, that only
// 5xx and transport failures move the breaker, that nothing is admitted while
// it is open and only probes while it is half-open, within the probe limit.
func TestBreakerTransitionsLegal(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		threshold := rapid.IntRange(1, 4).Draw(rt, "threshold")
		probes := rapid.IntRange(1, 3).Draw(rt, "probes")
		l, c := newLimiter(rt, map[string]limiter.Config{"s": {
			Limit: 1 << 20, Window: time.Second, Burst: 1 << 20, Concurrency: 8,
			BreakerThreshold: threshold, BreakerCooldown: time.Second, BreakerProbes: probes,
		}})
		state := limiter.BreakerClosed
		var held []*limiter.Permit
		apply := func(ts []limiter.Transition, cause string) {
			for _, tr := range ts {
				if !legal[[2]limiter.BreakerState{tr.From, tr.To}] || tr.From != state {
					rt.Fatalf("%s: illegal %s→%s from model state %s", cause, tr.From, tr.To, state)
				}
				if tr.From == limiter.BreakerClosed && tr.Failures < threshold {
					rt.Fatalf("opened at %d failures, threshold %d", tr.Failures, threshold)
				}
				state = tr.To
			}
		}
		steps := rapid.IntRange(1, 60).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 2).Draw(rt, "action") {
			case 0:
				p, err := l.Acquire(context.Background(), "s", limiter.Request{Deadline: c.Now()})
				apply(p.Breaker, "acquire")
				if err != nil {
					continue
				}
				if state == limiter.BreakerOpen || p.Probe != (state == limiter.BreakerHalfOpen) {
					rt.Fatalf("admitted (probe=%v) with breaker %s", p.Probe, state)
				}
				if p.Probe {
					n := 0
					for _, h := range held {
						if h.Probe {
							n++
						}
					}
					if n >= probes {
						rt.Fatalf("probe %d admitted, limit %d", n+1, probes)
					}
				}
				held = append(held, p)
			case 1:
				if len(held) == 0 {
					continue
				}
				i := rapid.IntRange(0, len(held)-1).Draw(rt, "permit")
				p := held[i]
				held = append(held[:i], held[i+1:]...)
				status := rapid.SampledFrom([]int{200, 204, 404, 429, 500, 503, 0}).Draw(rt, "status")
				v := p.Observe(limiter.Outcome{Status: status, Attempt: 1})
				if status == 429 && len(v.Breaker) != 0 {
					rt.Fatalf("a 429 moved the breaker: %+v", v.Breaker)
				}
				apply(v.Breaker, "observe")
				l.Pause("s", time.Time{})
			case 2:
				c.Advance(time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(rt, "advance")))
			}
			if st, _ := l.State("s"); st.Breaker != state {
				rt.Fatalf("limiter says %s, transitions say %s", st.Breaker, state)
			}
		}
	})
}

// A failed probe doubles the cooldown, up to BreakerBackoff times the first;
// closing starts over. A request waiting at the open breaker that asked to
// stop at a reopen learns the source is still down when another's probe
// fails.
func TestBreakerCooldownBacksOff(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100,
		BreakerThreshold: 1, BreakerCooldown: 10 * time.Second, BreakerBackoff: 4}})
	observe := func(p *limiter.Permit, status int) time.Duration {
		t.Helper()
		v := p.Observe(limiter.Outcome{Status: status, Attempt: 1})
		for _, tr := range v.Breaker {
			if tr.To == limiter.BreakerOpen {
				return tr.Cooldown
			}
		}
		return 0
	}
	if d := observe(mustAcquire(t, l, "s"), 502); d != 10*time.Second {
		t.Fatalf("first cooldown %v, want 10s", d)
	}

	// Two wait at the open breaker; past the cooldown one of them is the
	// probe, and it fails: the other is told the source is still down.
	ctx := context.Background()
	a := acquireAsync(ctx, c, l, "s", limiter.Request{StopAtReopen: true}, 0)
	b := acquireAsync(ctx, c, l, "s", limiter.Request{StopAtReopen: true}, 0)
	c.WaitForTimers(2)
	c.Advance(10 * time.Second)
	var probe result
	var rest <-chan result
	select {
	case probe = <-a:
		rest = b
	case probe = <-b:
		rest = a
	}
	if probe.err != nil || !probe.p.Probe {
		t.Fatalf("first through: %+v, %v; want a probe", probe.p, probe.err)
	}
	got := []time.Duration{observe(probe.p, 502)}
	if r := <-rest; !errors.Is(r.err, limiter.ErrStillDown) {
		t.Fatalf("the other waiter got %v, want ErrStillDown", r.err)
	}
	for range 3 {
		c.Advance(got[len(got)-1])
		got = append(got, observe(mustAcquire(t, l, "s"), 502))
	}
	if want := []time.Duration{20 * time.Second, 40 * time.Second, 40 * time.Second, 40 * time.Second}; !equalDurations(got, want) {
		t.Fatalf("cooldowns after failed probes = %v, want %v", got, want)
	}
	// A probe that succeeds closes it; the next opening starts over.
	c.Advance(40 * time.Second)
	observe(mustAcquire(t, l, "s"), 200)
	if d := observe(mustAcquire(t, l, "s"), 502); d != 10*time.Second {
		t.Fatalf("cooldown after closing %v, want 10s again", d)
	}
}

func equalDurations(a, b []time.Duration) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A request with a fallback is not held at a breaker that is down: inside
// the cooldown, or while the probe is out, it hears so at once; past the
// cooldown it moves the breaker to half-open and is the probe, whose
// success closes it. Without its Acquire the breaker would stay open.
func TestBreakerFallbackStillProbes(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100, BreakerThreshold: 1}})
	ctx := context.Background()
	fallback := limiter.Request{Fallback: true}
	v := mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 502, Attempt: 1})
	if len(v.Breaker) != 1 || v.Breaker[0].Cooldown != limiter.DefaultBreakerCooldown {
		t.Fatalf("opening: %+v, want a cooldown of %v", v.Breaker, limiter.DefaultBreakerCooldown)
	}
	var down *limiter.DownError
	if _, err := l.Acquire(ctx, "s", fallback); !errors.As(err, &down) || down.State != limiter.BreakerOpen || down.Wait != limiter.DefaultBreakerCooldown {
		t.Fatalf("inside the cooldown: %v, want DownError(open, %v)", err, limiter.DefaultBreakerCooldown)
	}
	c.Advance(limiter.DefaultBreakerCooldown)
	probe, err := l.Acquire(ctx, "s", fallback)
	if err != nil || !probe.Probe || len(probe.Breaker) != 1 || probe.Breaker[0].To != limiter.BreakerHalfOpen {
		t.Fatalf("past the cooldown: %+v, %v; want the probe, having moved the breaker to half_open", probe, err)
	}
	if _, err := l.Acquire(ctx, "s", fallback); !errors.As(err, &down) || down.State != limiter.BreakerHalfOpen {
		t.Fatalf("while the probe is out: %v, want DownError(half_open)", err)
	}
	if v := probe.Observe(limiter.Outcome{Status: 200, Attempt: 1}); len(v.Breaker) != 1 || v.Breaker[0].To != limiter.BreakerClosed {
		t.Fatalf("probe success: %+v, want closed", v.Breaker)
	}
	p, err := l.Acquire(ctx, "s", fallback)
	if err != nil || p.Probe {
		t.Fatalf("closed: %+v, %v", p, err)
	}
	p.Release()
}

// A request with a fallback waiting out its own backoff hears at once that
// the breaker opened meanwhile: it does not retry a source known to be down.
func TestBreakerFallbackLeavesBackoff(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100, BreakerThreshold: 1}})
	ctx := context.Background()
	ch := acquireAsync(ctx, c, l, "s", limiter.Request{Fallback: true, NotBefore: c.Now().Add(8 * time.Second)}, 1)
	mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 503, Attempt: 1})
	r := <-ch
	if !errors.Is(r.err, limiter.ErrSourceDown) {
		t.Fatalf("backing off when the breaker opened: %v, want ErrSourceDown without the clock moving", r.err)
	}
}

// DownAfter ends requests at an open breaker once that many probes failed
// in a row, without a wait; past the cooldown one is the probe all the same.
func TestBreakerDownAfterFailedProbes(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100,
		BreakerThreshold: 1, BreakerCooldown: time.Second, BreakerBackoff: 4}})
	ctx := context.Background()
	req := limiter.Request{DownAfter: 2}
	mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 502, Attempt: 1})
	var cooldowns []time.Duration
	for range 2 {
		st, _ := l.State("s")
		if st.Breaker != limiter.BreakerOpen {
			t.Fatalf("state %+v", st)
		}
		c.Set(c.Now().Add(time.Hour)) // past any cooldown
		p, err := l.Acquire(ctx, "s", req)
		if err != nil || !p.Probe {
			t.Fatalf("past the cooldown: %+v, %v; want a probe", p, err)
		}
		v := p.Observe(limiter.Outcome{Status: 502, Attempt: 1})
		cooldowns = append(cooldowns, v.Breaker[0].Cooldown)
	}
	if want := []time.Duration{2 * time.Second, 4 * time.Second}; !equalDurations(cooldowns, want) {
		t.Fatalf("cooldowns %v, want %v", cooldowns, want)
	}
	var down *limiter.DownError
	if _, err := l.Acquire(ctx, "s", req); !errors.As(err, &down) || down.Reopens != 2 || down.Wait != 4*time.Second {
		t.Fatalf("after 2 failed probes: %v, want DownError with 2 reopens and 4s to wait", err)
	}
	// One failed probe fewer than DownAfter waits (and sheds at its deadline).
	var shed *limiter.ShedError
	if _, err := l.Acquire(ctx, "s", limiter.Request{DownAfter: 3, Deadline: c.Now().Add(time.Second)}); !errors.As(err, &shed) {
		t.Fatalf("DownAfter 3: %v, want a shed at the breaker", err)
	}
	c.Advance(4 * time.Second)
	if p, err := l.Acquire(ctx, "s", req); err != nil || !p.Probe {
		t.Fatalf("past the cooldown: %+v, %v; want a probe", p, err)
	}
}

// DownFor ends requests at an open breaker once it has been open that long
// since it first opened, however few or many probes failed meanwhile: the
// probes of short cooldowns come often, and an outage is bounded by its
// length. Before that a request waits (here, to its deadline); a success
// closes the breaker and starts the count again.
func TestBreakerDownForItsLength(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1000, Window: time.Second, Burst: 100,
		BreakerThreshold: 1, BreakerCooldown: 2 * time.Second, BreakerBackoff: 16}})
	ctx := context.Background()
	opened := c.Now()
	mustAcquire(t, l, "s").Observe(limiter.Outcome{Status: 502, Attempt: 1})
	fail := func() { // the next probe, failed
		t.Helper()
		next, _ := l.State("s")
		c.Set(next.BreakerUntil)
		p, err := l.Acquire(ctx, "s", limiter.Request{})
		if err != nil || !p.Probe {
			t.Fatalf("at the cooldown's end: %+v, %v; want a probe", p, err)
		}
		p.Observe(limiter.Outcome{Status: 502, Attempt: 1})
	}
	for range 6 { // cooldowns 2+4+8+16+32+32 s: 94 s open
		fail()
	}
	var shed *limiter.ShedError
	req := limiter.Request{DownFor: 2 * time.Minute, Deadline: c.Now().Add(time.Second)}
	if _, err := l.Acquire(ctx, "s", req); !errors.As(err, &shed) {
		t.Fatalf("open %v of DownFor 2m, 6 probes failed: %v, want a wait (shed at its deadline)", c.Now().Sub(opened), err)
	}
	for c.Now().Sub(opened) < 2*time.Minute {
		fail()
	}
	var down *limiter.DownError
	req.Deadline = c.Now().Add(time.Second)
	if _, err := l.Acquire(ctx, "s", req); !errors.As(err, &down) || !down.Since.Equal(opened) {
		t.Fatalf("open %v: %v, want DownError since %v", c.Now().Sub(opened), err, opened)
	}
	next, _ := l.State("s")
	c.Set(next.BreakerUntil)
	p, err := l.Acquire(ctx, "s", limiter.Request{})
	if err != nil || !p.Probe {
		t.Fatalf("past the cooldown: %+v, %v; want a probe", p, err)
	}
	p.Observe(limiter.Outcome{Status: 200, Attempt: 1})
	req.Deadline = c.Now().Add(time.Second)
	if p, err := l.Acquire(ctx, "s", req); err != nil {
		t.Fatalf("closed again: %v, want admitted", err)
	} else {
		p.Release()
	}
}
