package limiter_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// seedConfig is the batch-upload seed's client: a bucket refilled at 50
// records a second holding 200, under a ceiling of 120 records a second.
var seedConfig = limiter.BudgetConfig{Limit: 120, Window: time.Second, Rate: 50, Burst: 200}

// TestBudgetSeedWorkedExample walks the seed's worked example: a request
// of 150 records can never fit the window of 120 and is refused at once
// naming that bound; split in two, the first 75 is admitted (125 tokens
// left), the second is held by the window for less than a second and then
// admitted on the dot. Every record is admitted or told when.
func TestBudgetSeedWorkedExample(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, seedConfig)
	if got := b.Tokens(); got != 200 {
		t.Fatalf("a fresh bucket holds %v tokens, want its capacity 200 (not the window's 120)", got)
	}

	// 150 records: above the window's limit, no wait could admit them.
	_, err := b.Allow(150)
	var ce *limiter.CostError
	if !errors.As(err, &ce) || !errors.Is(err, limiter.ErrCostExceedsCapacity) || ce.Bound != 120 || ce.Window != time.Second {
		t.Fatalf("Allow(150) = %v, want a CostError naming the window's limit of 120 per 1s", err)
	}
	if want := "limiter: cost 150 exceeds the window's limit of 120 per 1s"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if b.Tokens() != 200 {
		t.Fatal("a refused cost was charged")
	}

	// The first 75: admitted, 125 tokens left.
	if d := allow(t, b, 75); !d.Admitted {
		t.Fatalf("first 75 refused: %+v", d)
	}
	if got := b.Tokens(); got != 125 {
		t.Fatalf("tokens after 75 = %v, want 125", got)
	}

	// The second 75, a quarter second later: the bucket has 137.5 tokens,
	// but the window would hold 150; it is deferred until the first 75
	// leave the window, 750ms on.
	c.Advance(250 * time.Millisecond)
	d := allow(t, b, 75)
	if d.Admitted || d.Gate != limiter.GateRate || d.RetryAfter != 750*time.Millisecond {
		t.Fatalf("second 75: %+v, want deferred 750ms by the window", d)
	}
	c.Advance(d.RetryAfter - time.Microsecond)
	if allow(t, b, 75).Admitted {
		t.Fatal("second 75 admitted a microsecond before its Retry-After")
	}
	c.Advance(time.Microsecond)
	if d := allow(t, b, 75); !d.Admitted {
		t.Fatalf("second 75 refused at its Retry-After: %+v", d)
	}
	// 125 tokens + 50 for the second elapsed - 75.
	if got := b.Tokens(); got != 100 {
		t.Fatalf("tokens after the second 75 = %v, want 100", got)
	}
}

// The bucket alone binds when it is slower than the window: after the
// burst, 50 records a second, however much room the window has.
func TestBudgetRateBelowWindow(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 1000, Window: time.Second, Rate: 50, Burst: 100})
	if d := allow(t, b, 100); !d.Admitted {
		t.Fatalf("the full bucket refused: %+v", d)
	}
	d := allow(t, b, 10)
	if d.Admitted || d.RetryAfter != 200*time.Millisecond {
		t.Fatalf("%+v, want 10 tokens at 50 a second: 200ms", d)
	}
	if _, err := b.Allow(101); !errors.Is(err, limiter.ErrCostExceedsCapacity) {
		t.Fatalf("Allow(101) = %v, want above the bucket's capacity", err)
	} else if want := "limiter: cost 101 exceeds the bucket's capacity (burst) of 100"; err.Error() != want {
		t.Fatalf("error %q, want %q", err, want)
	}
	if got := b.MaxCost(); got != 100 {
		t.Fatalf("MaxCost = %d, want 100", got)
	}
}

// A learned limit counts requests when the budget says the server does:
// ten requests of 10 records fill a learned 10 per second, though 100
// records are far below the ceiling.
func TestBudgetLearnedCountsRequests(t *testing.T) {
	for _, tt := range []struct {
		name     string
		requests bool
		want     int
	}{
		{"Requests", true, 10},
		{"Records", false, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := clock.NewFake(epoch)
			b := mustBudget(t, c, limiter.BudgetConfig{Limit: 1000, Window: time.Second, Burst: 1000, CountRequests: tt.requests})
			if err := b.SetLimit(10, time.Second); err != nil {
				t.Fatal(err)
			}
			n := 0
			for allow(t, b, 10).Admitted {
				n++
			}
			if n != tt.want {
				t.Fatalf("admitted %d requests of 10 at once, want %d", n, tt.want)
			}
		})
	}
}

// Acquire refuses a cost that can never fit at once, naming the bound,
// rather than waiting for a slot that never comes.
func TestAcquireCostNeverFits(t *testing.T) {
	c := clock.NewFake(epoch)
	l := limiter.New(c)
	if err := l.Configure("s", limiter.Config{Limit: 120, Window: time.Second, Rate: 50, Burst: 200}); err != nil {
		t.Fatal(err)
	}
	p, err := l.Acquire(context.Background(), "s", limiter.Request{Cost: 150})
	var ce *limiter.CostError
	if !errors.As(err, &ce) || ce.Bound != 120 {
		t.Fatalf("Acquire(150) = %v, want a CostError with bound 120", err)
	}
	if !p.Admitted.IsZero() {
		t.Fatal("admitted")
	}
	p, err = l.Acquire(context.Background(), "s", limiter.Request{Cost: 75})
	if err != nil || p.Cost != 75 {
		t.Fatalf("Acquire(75) = %+v, %v", p, err)
	}
	p.Release()
}

func TestBudgetPropertyRateAndBurst(t *testing.T) {
	n := 200_000
	if testing.Short() {
		n = 20_000
	}
	simulate(t, 2, n, seedConfig)
}

func TestNewBudgetRejectsRate(t *testing.T) {
	for _, r := range []float64{-1, 2e9, 1e-9} {
		if _, err := limiter.NewBudget(clock.NewFake(epoch), limiter.BudgetConfig{Limit: 1, Window: time.Second, Rate: r}); !errors.Is(err, limiter.ErrInvalidConfig) {
			t.Errorf("rate %v: err = %v", r, err)
		}
	}
}

// A refunded permit gives its cost back to the window and the bucket: the
// upstream refused it, and the retry is charged instead of it, so the
// retry of 75 goes at once where it would otherwise wait for the window.
func TestPermitRefund(t *testing.T) {
	c := clock.NewFake(epoch)
	l := limiter.New(c)
	l.Jitter = func(time.Duration) time.Duration { return 0 }
	if err := l.Configure("s", limiter.Config{Limit: 120, Window: time.Second, Rate: 50, Burst: 200}); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	p, err := l.Acquire(ctx, "s", limiter.Request{Cost: 75})
	if err != nil {
		t.Fatal(err)
	}
	p.Sent(c.Now())
	p.Observe(limiter.Outcome{Status: 429, Attempt: 1})
	b, _ := l.Budget("s")
	if d, _ := b.Delay(75); d != time.Second {
		t.Fatalf("before the refund the retry waits %v, want the window's 1s", d)
	}
	p.Refund()
	p.Refund() // once only
	if got := b.Tokens(); got != 200 {
		t.Fatalf("tokens after the refund %v, want 200", got)
	}
	// The 429 paused the source (its own backoff, under the window's 1s);
	// past that, the whole window is free again.
	pause := b.PausedUntil().Sub(c.Now())
	if d, _ := b.Delay(120); pause != 500*time.Millisecond || d != pause {
		t.Fatalf("after the refund 120 waits %v, want only the pause's %v: the window is empty again", d, pause)
	}
}

// TestBudgetPropertyLearnedRequests drives random costs through a budget
// whose learned limit counts requests: on every step no window holds more
// than the ceiling's units or the learned limit's requests, and a refused
// request is admitted exactly at its RetryAfter.
func TestBudgetPropertyLearnedRequests(t *testing.T) {
	n := 100_000
	if testing.Short() {
		n = 10_000
	}
	r := rand.New(rand.NewPCG(3, 4))
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 1000, Window: time.Second, Rate: 800, Burst: 400, CountRequests: true})
	if err := b.SetLimit(20, time.Second); err != nil {
		t.Fatal(err)
	}
	type adm struct {
		at   time.Time
		cost int
	}
	var log []adm
	for i := range n {
		cost := 1 + r.IntN(400)
		d := allow(t, b, cost)
		if !d.Admitted {
			c.Advance(d.RetryAfter - time.Nanosecond)
			if allow(t, b, cost).Admitted {
				t.Fatalf("step %d: admitted before its RetryAfter", i)
			}
			c.Advance(time.Nanosecond)
			if d := allow(t, b, cost); !d.Admitted {
				t.Fatalf("step %d: refused at its RetryAfter: %+v", i, d)
			}
		}
		now := c.Now()
		log = append(log, adm{now, cost})
		for len(log) > 0 && !log[0].at.After(now.Add(-time.Second)) {
			log = log[1:]
		}
		units := 0
		for _, a := range log {
			units += a.cost
		}
		if len(log) > 20 || units > 1000 {
			t.Fatalf("step %d: %d requests, %d units in the window, want at most 20 and 1000", i, len(log), units)
		}
		if r.IntN(2) == 0 {
			c.Advance(time.Duration(r.Int64N(int64(100 * time.Millisecond))))
		}
	}
}
