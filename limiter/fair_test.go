package limiter_test

import (
	"context"
	"runtime"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// waitFor spins until cond holds.
func waitFor(cond func() bool) {
	for !cond() {
		runtime.Gosched()
	}
}

// Sixteen clients of a source with four slots, each holding its slot for
// the same time: every client is admitted when arrival order says, never
// later than twice its fair wait. The slots used to be raced for by every
// waiter at once, and a client could wait the whole deadline while later
// ones went.
func TestConcurrencySlotsGoInArrivalOrder(t *testing.T) {
	const clients, slots, hold = 16, 4, time.Second
	for round := range 20 {
		l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1 << 20, Window: time.Second, Burst: 1 << 20, Concurrency: slots}})
		start := c.Now()
		permits := make([]chan *limiter.Permit, clients)
		for i := range clients {
			permits[i] = make(chan *limiter.Permit, 1)
			go func() {
				p, err := l.Acquire(context.Background(), "s", limiter.Request{})
				if err != nil {
					t.Error(err)
				}
				permits[i] <- p
			}()
			// Client i arrives once i-1 is in: admitted or waiting.
			waitFor(func() bool { st, _ := l.State("s"); return st.InFlight+st.Waiting == i+1 })
		}
		got := make([]*limiter.Permit, clients)
		var in []*limiter.Permit    // holding a slot, oldest first
		collect := func(want int) { // the permits of those admitted, until want hold slots
			for len(in) < want {
				for j := range clients {
					if got[j] != nil {
						continue
					}
					select {
					case p := <-permits[j]:
						got[j] = p
						in = append(in, p)
					default:
					}
				}
				runtime.Gosched()
			}
		}
		collect(slots)
		for n := slots; n < clients; n++ {
			// One slot frees (the oldest) after the hold; one waiter takes it.
			c.Advance(hold)
			in[0].Observe(limiter.Outcome{Status: 200})
			in = in[1:]
			collect(slots)
		}
		admitted := make([]time.Duration, clients)
		for i, p := range got {
			admitted[i] = p.Admitted.Sub(start)
		}
		for i, got := range admitted {
			fair := time.Duration(max(0, i-slots+1)) * hold // one slot frees per hold, oldest first
			if got > 2*fair {
				t.Fatalf("round %d: client %d (of %d, %d slots) admitted after %v, its fair wait %v: %v", round, i, clients, slots, got, fair, admitted)
			}
		}
		for _, p := range in {
			p.Release()
		}
	}
}

// A request is shed at its deadline only when those ahead of it could not
// be admitted either: a later arrival never takes the slot it waited for.
func TestConcurrencyShedOnlyBehindTheQueue(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1 << 20, Window: time.Second, Burst: 1 << 20, Concurrency: 1}})
	held := mustAcquire(t, l, "s")
	ctx := context.Background()
	first := acquireAsync(ctx, c, l, "s", limiter.Request{Deadline: c.Now().Add(10 * time.Second)}, 1)
	waitFor(func() bool { st, _ := l.State("s"); return st.Waiting == 1 })
	second := acquireAsync(ctx, c, l, "s", limiter.Request{Deadline: c.Now().Add(20 * time.Second)}, 2)
	waitFor(func() bool { st, _ := l.State("s"); return st.Waiting == 2 })
	c.Advance(5 * time.Second)
	held.Release()
	r := <-first
	if r.err != nil {
		t.Fatalf("first in line: %v, want the freed slot", r.err)
	}
	c.Advance(10 * time.Second)
	r.p.Release()
	if r := <-second; r.err != nil {
		t.Fatalf("second in line: %v, want the next slot before its deadline", r.err)
	}
}

// BenchmarkAdmissionFairness measures the waiting-time distribution at a
// busy concurrency gate on the real clock: 16 clients, 4 slots, each
// holding a slot 100µs (a sleep: the machine's cores stay free for the gate). With arrival order the waits bunch around
// three holds; a race for the slot spreads them. Metrics: the waits' p50,
// p99 and max in µs and p99/p50.
//
//	go test -run='^$' -bench=AdmissionFairness -count=6 ./limiter/
func BenchmarkAdmissionFairness(b *testing.B) {
	const clients, slots = 16, 4
	l := limiter.New(clock.Real{})
	if err := l.Configure("s", limiter.Config{Limit: limiter.MaxLimit, Window: time.Second, Burst: limiter.MaxLimit, Concurrency: slots}); err != nil {
		b.Fatal(err)
	}
	var mu sync.Mutex
	waits := make([]time.Duration, 0, b.N)
	var wg sync.WaitGroup
	per := (b.N + clients - 1) / clients
	b.ResetTimer()
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			own := make([]time.Duration, 0, per)
			for range per {
				t0 := time.Now()
				p, err := l.Acquire(context.Background(), "s", limiter.Request{})
				if err != nil {
					b.Error(err)
					return
				}
				own = append(own, time.Since(t0))
				time.Sleep(100 * time.Microsecond)
				p.Release()
			}
			mu.Lock()
			waits = append(waits, own...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	sort.Slice(waits, func(i, j int) bool { return waits[i] < waits[j] })
	q := func(f float64) float64 { return float64(waits[int(f*float64(len(waits)-1))]) / 1e3 }
	b.ReportMetric(q(0.5), "us-p50-wait")
	b.ReportMetric(q(0.99), "us-p99-wait")
	b.ReportMetric(float64(slices.Max(waits))/1e3, "us-max-wait")
	if p50 := q(0.5); p50 > 0 {
		b.ReportMetric(q(0.99)/p50, "p99/p50")
	}
}
