package limiter_test

import (
	"context"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// Admit decisions side by side: impl=xrate is golang.org/x/time/rate's
// Allow, impl=budget is Budget.Allow (token bucket plus sliding-window
// ceiling), on the real clock, with identical rates. Compare with
//
//	go test -run='^$' -bench=Admit -benchmem -count=6 ./limiter/ > bench.txt
//	go tool benchstat -col /impl bench.txt
//
// "admitting" never refuses (the rate exceeds what a core can ask for);
// "refusing" refuses about 99% (1e5/s asked of far more); "parallel"
// runs 64 goroutines per core's worth against one limiter.
func BenchmarkAdmit(b *testing.B) {
	for _, shape := range []struct {
		name   string
		limit  int
		window time.Duration
		burst  int
	}{
		{"admitting", 1_000_000, time.Millisecond, 1_000_000},
		{"refusing", 100_000, time.Second, 100},
	} {
		r := rate.Limit(float64(shape.limit) / shape.window.Seconds())
		b.Run("shape="+shape.name+"/impl=xrate", func(b *testing.B) {
			lim := rate.NewLimiter(r, shape.burst)
			b.ReportAllocs()
			for b.Loop() {
				lim.Allow()
			}
		})
		b.Run("shape="+shape.name+"/impl=budget", func(b *testing.B) {
			bud := mustBudget(b, clock.Real{}, limiter.BudgetConfig{Limit: shape.limit, Window: shape.window, Burst: shape.burst})
			b.ReportAllocs()
			for b.Loop() {
				bud.Allow(1)
			}
		})
		b.Run("shape="+shape.name+"-parallel64/impl=xrate", func(b *testing.B) {
			lim := rate.NewLimiter(r, shape.burst)
			b.ReportAllocs()
			b.SetParallelism(64)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lim.Allow()
				}
			})
		})
		b.Run("shape="+shape.name+"-parallel64/impl=budget", func(b *testing.B) {
			bud := mustBudget(b, clock.Real{}, limiter.BudgetConfig{Limit: shape.limit, Window: shape.window, Burst: shape.burst})
			b.ReportAllocs()
			b.SetParallelism(64)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					bud.Allow(1)
				}
			})
		})
	}
}

// BenchmarkAcquire is the fetch loop's full path for an admitted request:
// lookup, breaker, slot, pause, rate, Sent at the dispatch record, then
// Observe of a 200.
func BenchmarkAcquire(b *testing.B) {
	l := limiter.New(clock.Real{})
	if err := l.Configure("s", limiter.Config{Limit: 1_000_000, Window: time.Millisecond, Burst: 1_000_000, Concurrency: 1 << 20}); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		p, err := l.Acquire(ctx, "s", limiter.Request{})
		if err != nil {
			b.Fatal(err)
		}
		p.Sent(time.Now()) // as the fetch loop does once the dispatch is durable
		p.Observe(limiter.Outcome{Status: 200, Attempt: 1})
	}
}

// BenchmarkSetLimit is the registry's retune of a source at run time.
func BenchmarkSetLimit(b *testing.B) {
	l := limiter.New(clock.Real{})
	if err := l.Configure("s", limiter.Config{Limit: 600, Window: time.Minute, Burst: 10}); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		if err := l.SetLimit("s", 100+i%400, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
