package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
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
		at, _ := s.Earliest(now, 1)
		if !s.Take(at, 1) {
			b.Fatal("take refused")
		}
		now = at.Add(time.Nanosecond)
	}
}

// BenchmarkWritesAtFullPace runs one source at full pace (every slot taken
// as it comes) on 1 and 3 nodes against a real etcd and reports etcd writes
// (granted reservations) per second and per second of the rate; the target
// is at most rate/10 plus a constant.
func BenchmarkWritesAtFullPace(b *testing.B) {
	for _, nodes := range []int{1, 3} {
		b.Run(map[int]string{1: "nodes=1", 3: "nodes=3"}[nodes], func(b *testing.B) {
			c := startCluster(b, 1)
			rate := fleet.Rate{Limit: 1000, Window: time.Second}
			var all []*fleet.Slots
			for range nodes {
				st := fleet.NewStore(newClient(b, c.endpoints()...), clock.Real{}, "")
				s, err := fleet.NewSlots(st, clock.Real{}, fleet.Config{Key: "k", Rate: rate})
				if err != nil {
					b.Fatal(err)
				}
				s.Open()
				b.Cleanup(func() { _ = s.Close(context.Background()) })
				all = append(all, s)
			}
			// b.N slots taken across the nodes, round robin: each node's
			// demand is a third of the rate's.
			ctx := context.Background()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				for {
					if _, ok := take(ctx, all[i%nodes]); ok {
						break
					}
				}
			}
			elapsed := time.Since(start)
			var blocks, used int64
			for _, s := range all {
				st := s.Stats()
				blocks, used = blocks+st.Blocks, used+st.Used
			}
			writes := float64(blocks) / elapsed.Seconds()
			b.ReportMetric(writes, "writes/s")
			b.ReportMetric(float64(blocks)/float64(used), "writes/slot")
			b.ReportMetric(float64(used)/elapsed.Seconds(), "slots/s")
		})
	}
}
