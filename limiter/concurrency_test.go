package limiter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/auditd/auditd/limiter"
)

// A source's slots move with SetConcurrency: a rise admits a request that
// waits at the concurrency gate at once, a cut admits nobody new until
// fewer are in flight, and each permit says how many were in flight with
// it.
func TestSetConcurrencyMovesTheSlots(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1 << 20, Window: time.Second, Burst: 1 << 20, Concurrency: 2}})
	a, b := mustAcquire(t, l, "s"), mustAcquire(t, l, "s")
	if a.InFlight != 1 || b.InFlight != 2 {
		t.Fatalf("in flight %d and %d, want 1 and 2", a.InFlight, b.InFlight)
	}
	ch := make(chan result, 1)
	go func() {
		p, err := l.Acquire(context.Background(), "s", limiter.Request{})
		ch <- result{p, err}
	}()
	waitFor(func() bool { st, _ := l.State("s"); return st.Waiting == 1 })
	select {
	case r := <-ch:
		t.Fatalf("admitted past two slots: %+v", r)
	default:
	}
	if err := l.SetConcurrency("s", 3); err != nil {
		t.Fatal(err)
	}
	r := <-ch // a rise wakes the waiter: without the wake-up this blocks
	if r.err != nil || r.p.InFlight != 3 {
		t.Fatalf("after the rise: %v, in flight %d, want admitted third", r.err, r.p.InFlight)
	}
	if n, _ := l.Concurrency("s"); n != 3 {
		t.Fatalf("Concurrency %d, want 3", n)
	}

	// A cut to one: three in flight finish, and only then is one admitted.
	if err := l.SetConcurrency("s", 1); err != nil {
		t.Fatal(err)
	}
	go func() {
		p, err := l.Acquire(context.Background(), "s", limiter.Request{})
		ch <- result{p, err}
	}()
	waitFor(func() bool { st, _ := l.State("s"); return st.Waiting == 1 })
	for _, p := range []*limiter.Permit{a, b} {
		p.Release()
		select {
		case r := <-ch:
			t.Fatalf("admitted with %d in flight and one slot: %+v", r.p.InFlight, r)
		default:
		}
	}
	r.p.Release()
	if r = <-ch; r.err != nil || r.p.InFlight != 1 {
		t.Fatalf("after the cut: %v, in flight %d, want alone", r.err, r.p.InFlight)
	}

	// Zero goes back to the configured slots; Configure keeps a learned one.
	if err := l.SetConcurrency("s", 0); err != nil {
		t.Fatal(err)
	}
	if n, _ := l.Concurrency("s"); n != 2 {
		t.Fatalf("Concurrency %d after 0, want the configured 2", n)
	}
	if err := l.SetConcurrency("s", 5); err != nil {
		t.Fatal(err)
	}
	if err := l.Configure("s", limiter.Config{Limit: 10, Window: time.Second, Concurrency: 2}); err != nil {
		t.Fatal(err)
	}
	if n, _ := l.Concurrency("s"); n != 5 {
		t.Fatalf("Concurrency %d after Configure, want the learned 5", n)
	}
}

func TestSetConcurrencyRefusesNonsense(t *testing.T) {
	l, _ := newLimiter(t, map[string]limiter.Config{"s": {}})
	if err := l.SetConcurrency("s", -1); !errors.Is(err, limiter.ErrInvalidConfig) {
		t.Fatalf("SetConcurrency(-1): %v, want ErrInvalidConfig", err)
	}
	if err := l.SetConcurrency("nope", 3); !errors.Is(err, limiter.ErrUnknownSource) {
		t.Fatalf("SetConcurrency of an unknown source: %v, want ErrUnknownSource", err)
	}
	if n, _ := l.Concurrency("s"); n != limiter.DefaultConcurrency {
		t.Fatalf("Concurrency %d, want the default %d", n, limiter.DefaultConcurrency)
	}
}

// A permit's InFlight counts the requests admitted and not yet observed,
// not those that hold a slot while they wait at the rate gate: those have
// not reached the server.
func TestInFlightCountsOnlyAdmitted(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1, Window: time.Second, Burst: 1, Concurrency: 4}})
	a := mustAcquire(t, l, "s")
	b := acquireAsync(context.Background(), c, l, "s", limiter.Request{}, 1) // waits a second at the rate gate
	d := acquireAsync(context.Background(), c, l, "s", limiter.Request{}, 0) // queues behind it
	waitFor(func() bool { st, _ := l.State("s"); return st.InFlight == 3 && st.Queued == 2 })
	a.Observe(limiter.Outcome{Status: 200})
	// The observation wakes the waiters, which re-arm their timers: the
	// clock moves to the next one once it is armed (advanceToNextTimer).
	advanceToNextTimer(c)
	rb := <-b
	if rb.err != nil || rb.p.InFlight != 1 {
		t.Fatalf("second request: %v, in flight %d, want 1 (the first was observed, the third waits)", rb.err, rb.p.InFlight)
	}
	advanceToNextTimer(c)
	if rd := <-d; rd.err != nil || rd.p.InFlight != 2 {
		t.Fatalf("third request: %v, in flight %d, want 2", rd.err, rd.p.InFlight)
	}
}
