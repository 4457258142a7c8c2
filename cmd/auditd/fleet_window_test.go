package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/sim"
)

// windowUpstream is a simulator's fixed window (sim.ShapeFixedWindow) with
// a plain 429 and no headers, logging each answer by when it arrived.
type windowUpstream struct {
	*httptest.Server
	start  time.Time // the first window's start: the simulator's time zero
	window time.Duration
	answers
}

// statusWriter keeps the status a handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func startWindowUpstream(t *testing.T, limit int, window time.Duration) *windowUpstream {
	sc, err := sim.ParseScenario(fmt.Appendf(nil, "upstreams:\n  - name: u\n    limit: {shape: %s, requests: %d, window: %v}\n    reject: {retry_after: %s}\n",
		sim.ShapeFixedWindow, limit, window, sim.RetryAfterNone))
	if err != nil {
		t.Fatal(err)
	}
	u := &windowUpstream{window: window, start: time.Now()}
	s, err := sim.New(sc, clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	h := s.Handler("u")
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		h.ServeHTTP(sw, r)
		u.add(at, sw.status != http.StatusTooManyRequests)
	}))
	t.Cleanup(u.Close)
	return u
}

// windowCounts returns the admitted and refused answers of the upstream's
// window k.
func (u *windowUpstream) windowCounts(k int) (ok, bad int) {
	from := u.start.Add(time.Duration(k) * u.window)
	return u.counts(from, from.Add(u.window))
}

// TestFleetUsesAFixedWindow: three nodes in front of an upstream that
// admits 30 requests in each fixed window of 5 s and refuses the rest with
// a plain 429 (no Retry-After, no headers), whatever the pace, until the
// window's boundary. The nodes are not told it. A refusal episode that
// ends at a boundary is a spent window (docs/FLEET.md, "Fixed windows"):
// the fleet's limit becomes the quota over the window and is not cut for
// it, so after the first minute (issue 26's bound for learning a fixed
// window: max(60 s, five windows)) the fleet uses at least 90% of the
// quota of the eight windows that follow, with at most 2% of its requests
// refused, and has learned the quota over the window. One window may use
// less: a refusal late in the window before pauses the key for a backoff
// (limiter.Config's BackoffBase) that may run past the boundary. So does
// the window after each of the learner's probes, about every 35 s: its
// refusal spends the window, and the next admits 22 to 24 of 30. Eight
// windows hold about one probe, as a long run does; four held one or
// none, 90% or 96% of the quota.
//
// On a calm machine the fleet learns the window in its first four windows:
// the first mark cuts nothing, the second sets the limit, and the window
// after it is paced at the new limit once the blocks held at the old one
// are spent. Starved of CPU (CI runs packages side by side), the nodes
// waste a fifth of their slots, windows go unspent, and the marks that
// measure the window come further apart.
func TestFleetUsesAFixedWindow(t *testing.T) {
	if testing.Short() {
		t.Skip("three auditd nodes for 100 s")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the other long fleet tests
	const token, limit, window, windows = "fleet-admin-token-0123456789abcdef", 30, 5 * time.Second, 20
	const warm = 12 // windows: the first minute
	up := startWindowUpstream(t, limit, window)
	cluster := etcdtest.Start(t, 1)
	f := startFleetNodesWith(t, token, func(int) string {
		return fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    concurrency: 4\n", up.URL)
	}, func(int) []string { return []string{"--fleet-etcd", cluster.Endpoints()[0]} })
	// Load from a window's start, so that every window counted is whole.
	first := int(time.Since(up.start)/window) + 1
	time.Sleep(time.Until(up.start.Add(time.Duration(first) * window)))
	stop := make(chan struct{})
	wait := fleetLoad(t, f.nodes, f.runs, token, 8, stop)
	time.Sleep(time.Until(up.start.Add(time.Duration(first+windows) * window)))
	var view api.FleetSources
	f.nodes[0].call(t, "GET", "/v1/fleet/sources", token, nil, &view)
	close(stop)
	counts := wait()
	if len(view.Sources) != 1 {
		t.Fatalf("the fleet's view has %d keys, want 1", len(view.Sources))
	}
	learned := fleet.Rate{Limit: view.Sources[0].Learned, Window: time.Duration(view.Sources[0].LearnedWindow)}
	t.Logf("the fleet learned %d per %v (%.2f/s of %.2f/s)", learned.Limit, learned.Window, learned.PerSecond(), float64(limit)/window.Seconds())
	var ok, bad int
	for k := range windows {
		o, b := up.windowCounts(first + k)
		t.Logf("window %d: %d admitted of %d, %d refused", k, o, limit, b)
		if k < warm {
			continue
		}
		ok, bad = ok+o, bad+b
	}
	share := float64(bad) / float64(max(1, ok+bad))
	t.Logf("after the first %d windows: %d admitted, %.1f%% refused; clients %v", warm, ok, 100*share, counts)
	if quota := (windows - warm) * limit; ok < quota*9/10 {
		t.Errorf("after the first %d windows the fleet used %d of their quota of %d, want at least 90%%", warm, ok, quota)
	}
	// Issue 26 asks what is shown learned to be within 20% of what the
	// server allows. Below, 10% is the rule's own margin; above, the
	// learner's probes go up to a sixth past the rate last refused while
	// the fleet is answered at 85% of it (fleet.Raise), and on a starved
	// machine, its slots partly wasted, no window is spent to send them
	// back until the fleet sends at them.
	if q := float64(limit) / window.Seconds(); learned.PerSecond() < 0.9*q || learned.PerSecond() > q*7/6+0.01 {
		t.Errorf("the fleet learned %.2f/s, want the quota over the window, %.2f/s, within 10%% below and a sixth above", learned.PerSecond(), q)
	}
	if share > 0.02 {
		t.Errorf("after the first %d windows %.1f%% of requests were refused (%d of %d), want at most 2%%", warm, 100*share, bad, ok+bad)
	}
	if t.Failed() {
		for _, n := range view.Sources[0].Nodes {
			t.Logf("%s over %v: %d slots reserved, %d used, %d wasted", n.Node, time.Duration(n.Span), n.Reserved, n.Used, n.Wasted)
		}
		logLearned(t, f, up.start.Add(time.Duration(first)*window), window)
	}
}

// logLearned stops node 1 and logs the learned limits its ledger applied,
// each at the window it was applied in, counted from the load's first
// (start): what a failed run learned from, and when.
func logLearned(t *testing.T, f *fleetNodes, start time.Time, window time.Duration) {
	stopGracefully(t, f.nodes[0])
	events, _ := fleetEvents(t, f.datas[0])
	for _, e := range events {
		if e.Type != auditd.EventFleetLearned {
			continue
		}
		_, cause := e.Shared()
		at := e.Time.Sub(start)
		t.Logf("window %d +%.2fs: %s %s", int(at/window), (at % window).Seconds(), cause, e.Detail)
	}
}
