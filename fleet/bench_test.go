package fleet_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// BenchmarkTake is the cost of a local slot hand-out: Earliest and Take on
// slots already held, no etcd.
func BenchmarkTake(b *testing.B) {
	fc := clock.NewFake(t0)
	mb := newMemBackend(fc)
	// One slot a nanosecond, a block of 2^30 of them: never runs out here.
	s, err := fleet.NewSlots(mb, fc, fleet.Config{Key: "k", Rate: fleet.Rate{Limit: 1 << 30, Window: time.Second},
		Grace: time.Nanosecond, MaxSkew: time.Nanosecond, Block: time.Second, Lead: time.Nanosecond})
	if err != nil {
		b.Fatal(err)
	}
	s.Open()
	b.Cleanup(func() { _ = s.Close(context.Background()) })
	for {
		ch := s.Changed()
		if _, ok := s.Earliest(t0, 1); ok {
			break
		}
		<-ch
	}
	now := t0
	b.ReportAllocs()
	for b.Loop() {
		at, ok := s.Earliest(now, 1)
		if !ok {
			// Out of slots: the block grows by doubling; wait for the
			// next off the clock.
			b.StopTimer()
			for st := s.Stats(); st.Held == 0; st = s.Stats() {
				select {
				case <-s.Changed():
				case <-time.After(time.Millisecond):
				}
			}
			b.StartTimer()
			continue
		}
		if !s.Take(at, 1) {
			b.Fatalf("slot at %v refused", at)
		}
		now = at.Add(time.Nanosecond)
	}
}

// BenchmarkWritesAtFullPace runs one source at full pace (every slot taken
// as it comes) on 1 and 3 nodes against a real etcd and reports etcd writes
// (granted reservations) per second and per second of the rate, and the
// share of the limit handed out (util); the target is at most rate/10
// writes a second plus a constant. Where util falls short it says why:
// granted is the share of the run's slot times some node held (1 less the
// gaps between blocks), wasted/slot the share of held slots nobody took;
// even is how evenly the nodes, each at full demand, shared the slots.
func BenchmarkWritesAtFullPace(b *testing.B) {
	cluster := etcdtest.Start(b, 1)
	rate := fleet.Rate{Limit: 1000, Window: time.Second}
	// lag: serve's --fleet-lag, added to the skew guard as serve adds it.
	for _, c := range []struct {
		nodes int
		lag   time.Duration
	}{{1, 0}, {3, 0}, {3, 40 * time.Millisecond}} {
		nodes := c.nodes
		b.Run(fmt.Sprintf("nodes=%d/lag=%v", nodes, c.lag), func(b *testing.B) {
			// A fresh key per run: a key reused by -count would start
			// behind the blocks the last run's nodes still held.
			key := fmt.Sprintf("k%d-%v-%d-%d", nodes, c.lag, b.N, time.Now().UnixNano())
			var (
				mu      sync.Mutex
				granted []fleet.Block
			)
			record := func(e fleet.Event) {
				if e.Kind == fleet.EventReserved {
					mu.Lock()
					granted = append(granted, e.Block)
					mu.Unlock()
				}
			}
			var all []*fleet.Slots
			for range nodes {
				st := fleet.NewStore(etcdtest.NewClient(b, cluster.Endpoints()...), clock.Real{}, "")
				s, err := fleet.NewSlots(st, clock.Real{}, fleet.Config{Key: key, Rate: rate, MaxSkew: fleet.DefaultMaxSkew + c.lag, Notify: record})
				if err != nil {
					b.Fatal(err)
				}
				s.Open()
				b.Cleanup(func() { _ = s.Close(context.Background()) })
				all = append(all, s)
			}
			// b.N slots taken in all, each node taking its slots as they
			// come: every node's demand is the whole rate.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var taken atomic.Int64
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for _, s := range all {
				wg.Go(func() {
					for ctx.Err() == nil {
						if _, ok := take(ctx, s); ok && taken.Add(1) >= int64(b.N) {
							cancel()
						}
					}
				})
			}
			wg.Wait()
			end := time.Now()
			elapsed := end.Sub(start)
			var blocks, used, wasted int64
			least := int64(b.N)
			for _, s := range all {
				st := s.Stats()
				blocks, used, wasted = blocks+st.Blocks, used+st.Used, wasted+st.Wasted
				least = min(least, st.Used)
			}
			// The least any node used against an even split: 1 when the
			// nodes, every one at full demand, shared the rate evenly.
			b.ReportMetric(float64(least)*float64(nodes)/float64(used), "even")
			b.ReportMetric(float64(blocks)/elapsed.Seconds(), "writes/s")
			b.ReportMetric(float64(blocks)/float64(used), "writes/slot")
			b.ReportMetric(float64(used)/elapsed.Seconds(), "slots/s")
			b.ReportMetric(float64(wasted)/float64(used+wasted), "wasted/slot")
			mu.Lock()
			interval := fleet.Interval(rate, fleet.DefaultGrace, fleet.DefaultMaxSkew+c.lag)
			b.ReportMetric(float64(slotsWithin(granted, start, end))/float64(elapsed/interval), "granted")
			mu.Unlock()
			// Slots handed out as a share of the limit over the run, ramp
			// included; the skew guard caps it at Window/(Window+Grace+MaxSkew).
			b.ReportMetric(float64(used)/(elapsed.Seconds()*float64(rate.Limit)/rate.Window.Seconds()), "util")
		})
	}
}

// slotsWithin counts the slots of blocks whose times fall in [from, to).
func slotsWithin(blocks []fleet.Block, from, to time.Time) int {
	n := 0
	for _, b := range blocks {
		for i := range b.Count {
			if t := b.Slot(i); !t.Before(from) && t.Before(to) {
				n++
			}
		}
	}
	return n
}

// BenchmarkReserve is one reservation's etcd round trip: a compare-and-swap
// transaction on a one-member cluster, from a Store that knows the key's
// last revision.
func BenchmarkReserve(b *testing.B) {
	c := etcdtest.Start(b, 1)
	st := fleet.NewStore(etcdtest.NewClient(b, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	for b.Loop() {
		if _, err := st.Reserve(ctx, "k", fleet.Ask{From: time.Now(), Count: 1, Interval: time.Nanosecond}); err != nil {
			b.Fatal(err)
		}
	}
}
