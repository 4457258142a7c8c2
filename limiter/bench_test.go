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

// BenchmarkAdmitCost is admission charged by the record: costs of 1 to 200
// in a fixed cycle. impl=xrate is x/time/rate's ReserveN (taking the time
// itself, as Budget does), impl=budget is Budget.Allow, with the same rate
// and capacity; the budget's ceiling counts besides. "admitting" (10^9 a
// second, the fastest a nanosecond clock paces, with as large a bucket)
// admits about everything a core can ask; "refusing" (50 a second holding
// 200 under 120 a second, the seed's) refuses almost every request, where
// xrate's AllowN stands in for ReserveN, which would queue them all.
// Compare with
//
//	go test -run='^$' -bench=AdmitCost -benchmem -count=6 ./limiter/ > cost.txt
//	go tool benchstat -col /impl cost.txt
func BenchmarkAdmitCost(b *testing.B) {
	var costs [200]int
	for i := range costs {
		costs[i] = 1 + i*37%200
	}
	for _, shape := range []struct {
		name   string
		cfg    limiter.BudgetConfig
		refuse bool
	}{
		{"admitting", limiter.BudgetConfig{Limit: limiter.MaxLimit, Window: time.Millisecond, Rate: 1e9, Burst: limiter.MaxLimit}, false},
		{"refusing", limiter.BudgetConfig{Limit: 200, Window: time.Second, Rate: 50, Burst: 200}, true},
	} {
		b.Run("shape="+shape.name+"/impl=xrate", func(b *testing.B) {
			lim := rate.NewLimiter(rate.Limit(shape.cfg.Rate), shape.cfg.Burst)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if shape.refuse {
					lim.AllowN(time.Now(), costs[i%len(costs)])
				} else {
					lim.ReserveN(time.Now(), costs[i%len(costs)])
				}
				i++
			}
		})
		b.Run("shape="+shape.name+"/impl=budget", func(b *testing.B) {
			bud := mustBudget(b, clock.Real{}, shape.cfg)
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := bud.Allow(costs[i%len(costs)]); err != nil {
					b.Fatal(err)
				}
				i++
			}
		})
	}
}
