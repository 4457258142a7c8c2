package registry_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/registry"
)

// BenchmarkObserveNoChange measures the per-response path when nothing is
// learned: the case for almost every response. It must not touch bbolt nor
// allocate. The clock is a Fake that stands still: once slow start has
// reached the ceiling, nothing more is learned.
func BenchmarkObserveNoChange(b *testing.B) {
	for _, bc := range []struct {
		name string
		src  auditd.Source
		obs  registry.Observation
	}{
		{"Success", auditd.Source{ID: "a"}, registry.Observation{SourceID: "a", RunID: "r", Status: 200}},
		{"SuccessWithSameAdvertisement", auditd.Source{ID: "a"}, registry.Observation{SourceID: "a", RunID: "r", Status: 200,
			Hint: withQuota(left(40, 30*time.Second), 60, time.Minute)}},
		{"GroupMember", auditd.Source{ID: "a", Group: "gw"}, registry.Observation{SourceID: "a", RunID: "r", Status: 200}},
		{"ServerError", auditd.Source{ID: "a"}, registry.Observation{SourceID: "a", RunID: "r", Status: 500, Outcome: auditd.OutcomeServerError}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := newHarness(b, registry.Options{})
			h.put(b, bc.src)
			ctx := context.Background()
			// Learn what there is to learn first: the advertisement, and
			// slow start's rounds (on a clock that stands still each round
			// proves its pace) up to the ceiling.
			for range 1000 {
				if _, err := h.reg.Observe(ctx, bc.obs); err != nil {
					b.Fatal(err)
				}
			}
			events := len(h.led.all())
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				if _, err := h.reg.Observe(ctx, bc.obs); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			if n := len(h.led.all()); n != events {
				b.Fatalf("%d events appended on the no-change path", n-events)
			}
		})
	}

	// Many sources observed from all Ps: sources do not wait on each other.
	b.Run("ParallelSources", func(b *testing.B) {
		h := newHarness(b, registry.Options{})
		const n = 64
		for i := range n {
			h.put(b, auditd.Source{ID: "s" + strconv.Itoa(i)})
		}
		obs := make([]registry.Observation, n)
		for i := range obs {
			obs[i] = registry.Observation{SourceID: "s" + strconv.Itoa(i), RunID: "r", Status: 200}
		}
		ctx := context.Background()
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				if _, err := h.reg.Observe(ctx, obs[i%n]); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	})
}

// BenchmarkObserveChange measures a response that teaches something: one
// ledger append (in memory here) and one bbolt write. Throttles alternate
// with operator resets so every iteration changes the limit.
func BenchmarkObserveChange(b *testing.B) {
	h := newHarness(b, registry.Options{DefaultLimit: 1000, DefaultCeiling: 1000})
	h.put(b, auditd.Source{ID: "a"})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		h.clk.Advance(time.Minute)
		if _, err := h.reg.Observe(ctx, registry.Observation{SourceID: "a", Status: 429}); err != nil {
			b.Fatal(err)
		}
		if _, err := h.reg.SetLimit(ctx, "bench", "a", 1000, time.Minute); err != nil {
			b.Fatal(err)
		}
	}
}
