package registry_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/sim"
)

// BenchmarkRiseAtEveryPhase measures how soon a rise is found wherever it
// falls in the probe cycle. TestConvergence raises the limit two minutes
// in, one phase of the cycle; here the rise comes at every 5 s from 60 s
// to 240 s (37 runs on the fake clock, default options, the simulator's
// sliding window of rising.yaml), and each run goes on 3 minutes past it.
// Reported: the time from the rise to 90% of the new limit over a span
// of max(10 s, two windows) — its mean, median and largest (180 s: not
// within the 3 minutes) — the share of runs within the max(60 s,
// five windows), and the share of requests refused after the first
// minute. docs/bench/pacing.md.
func BenchmarkRiseAtEveryPhase(b *testing.B) {
	for _, from := range []float64{0.5, 2} {
		for _, factor := range []float64{2, 4, 8} {
			b.Run(fmt.Sprintf("from=%g/factor=%g", from, factor), func(b *testing.B) {
				var s phaseSweep
				for b.Loop() {
					s = sweepRisePhases(b, from, factor)
				}
				b.ReportMetric(s.mean, "lag-mean-s")
				b.ReportMetric(s.median, "lag-p50-s")
				b.ReportMetric(s.max, "lag-max-s")
				b.ReportMetric(100*s.within, "within-target-%")
				b.ReportMetric(100*s.refused, "refused-after-1m-%")
			})
		}
	}
}

// phaseSweep is what sweepRisePhases found over its runs.
type phaseSweep struct {
	mean, median, max float64 // seconds from the rise to 90% of the new limit
	within            float64 // share of runs within max(60 s, five windows)
	refused           float64 // share of requests refused after the first minute, all runs
}

func sweepRisePhases(tb testing.TB, from, factor float64) phaseSweep {
	const after = 3 * time.Minute
	var lags []float64
	var requests, refused, within int
	for at := time.Minute; at <= 4*time.Minute; at += 5 * time.Second {
		sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "rising.yaml"))
		if err != nil {
			tb.Fatal(err)
		}
		convergeCase{factor: factor}.reshape(sc)
		sc.Upstreams[0].Limit.Changes[0].After = at
		window, final := rescale(sc, from)
		p := newPacer(tb, sc, 1800)
		p.runUntil(at + after)
		lag := p.reached(at, final, window)
		if lag < 0 {
			lag = after
		}
		if lag <= max(time.Minute, 5*window) {
			within++
		}
		lags = append(lags, lag.Seconds())
		late := p.between(time.Minute, at+after)
		requests += late.requests
		refused += late.refused
	}
	slices.Sort(lags)
	sum := 0.0
	for _, l := range lags {
		sum += l
	}
	n := float64(len(lags))
	return phaseSweep{
		mean: sum / n, median: lags[len(lags)/2], max: lags[len(lags)-1],
		within: float64(within) / n, refused: float64(refused) / float64(max(1, requests)),
	}
}

// TestRiseFoundAtThePaceRefused: a sliding window of 4 per 2 s that rises
// fourfold three minutes in, a phase of the probe cycle where the probe
// after the rise goes to the pace the probe before it was refused at. That
// pace passing is a rise: slow start resumes after that one probe, not a
// second one, and the new limit is reached within a minute (it took 65 s
// when two clean probes were needed).
func TestRiseFoundAtThePaceRefused(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "rising.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	convergeCase{factor: 4}.reshape(sc)
	rise := 3 * time.Minute
	sc.Upstreams[0].Limit.Changes[0].After = rise
	window, final := rescale(sc, 2)
	p := newPacer(t, sc, 1800)
	p.runUntil(rise + 3*time.Minute)
	if lag := p.reached(rise, final, window); lag < 0 || lag > time.Minute {
		t.Fatalf("90%% of %.3g/s reached %v after the rise, want within a minute\n%s", final, lag, p.trace())
	}
	if late := p.between(time.Minute, rise+3*time.Minute); late.refusedShare() > 0.02 {
		t.Fatalf("%s after the first minute: over 2%% refused", late)
	}
}
