package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd/api"

	"github.com/auditd/auditd/internal/etcdtest"
)

// slidingUpstream admits at most limit requests in any window and refuses
// the rest with a plain 429 (no Retry-After), logging each arrival.
type slidingUpstream struct {
	*httptest.Server
	answers
}

// answers logs an upstream's admitted and refused answers by when each
// request arrived.
type answers struct {
	mu      sync.Mutex
	ok, bad []time.Time
}

// add logs one answer.
func (a *answers) add(at time.Time, admitted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if admitted {
		a.ok = append(a.ok, at)
	} else {
		a.bad = append(a.bad, at)
	}
}

func startSlidingUpstream(t *testing.T, limit int, window time.Duration) *slidingUpstream {
	return startSlidingUpstreamWith(t, limit, window, nil)
}

// startSlidingUpstreamWith is startSlidingUpstream with header set on
// every answer (when not nil): a quota the server advertises.
func startSlidingUpstreamWith(t *testing.T, limit int, window time.Duration, header http.Header) *slidingUpstream {
	u := &slidingUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		u.mu.Lock()
		n := 0
		for i := len(u.ok) - 1; i >= 0 && now.Sub(u.ok[i]) < window; i-- {
			n++
		}
		admit := n < limit
		if admit {
			u.ok = append(u.ok, now)
		} else {
			u.bad = append(u.bad, now)
		}
		u.mu.Unlock()
		for k, v := range header {
			w.Header()[k] = v
		}
		if !admit {
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// counts returns the admitted and refused arrivals in [from, to).
func (a *answers) counts(from, to time.Time) (ok, bad int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	in := func(ts []time.Time) int {
		n := 0
		for _, at := range ts {
			if !at.Before(from) && at.Before(to) {
				n++
			}
		}
		return n
	}
	return in(a.ok), in(a.bad)
}

// TestFleetLearnsAnUntoldLimit: three nodes in front of an upstream whose
// limit (8 a second, a sliding window of 2 s, plain 429s) they are not
// told learn it together, as one limit (docs/FLEET.md, "One learner per
// key"): any node cuts it, the elected learner raises it from every node's
// outcomes, and every node reserves its slots at it. After the first
// minute the fleet is within 1.5x of an oracle told the limit (98% of it)
// and at most 2% of its requests are refused, though the learner is
// killed at 45 s: another node is elected and learns on.
func TestFleetLearnsAnUntoldLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("three auditd nodes for 90 s")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the other long fleet tests
	const token, limit, window = "fleet-admin-token-0123456789abcdef", 16, 2 * time.Second
	rate := float64(limit) / window.Seconds()
	up := startSlidingUpstream(t, limit, window)
	cluster := etcdtest.Start(t, 1)
	f := startFleetNodesWith(t, token, func(int) string {
		return fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    concurrency: 4\n", up.URL)
	}, func(int) []string { return []string{"--fleet-etcd", cluster.Endpoints()[0]} })
	nodes, runs := f.nodes, f.runs
	stop := make(chan struct{})
	start := time.Now()
	wait := fleetLoad(t, nodes, runs, token, 8, stop)
	for i := range 6 {
		if i == 3 {
			killLearner(t, nodes, token)
		}
		time.Sleep(15 * time.Second)
		now := time.Now()
		ok, bad := up.counts(now.Add(-15*time.Second), now)
		t.Logf("%v: the last 15 s %d admitted (%.2f/s of %g/s), %d refused", now.Sub(start).Round(time.Second), ok, float64(ok)/15, rate, bad)
	}
	close(stop)
	counts := wait()
	from, to := start.Add(time.Minute), time.Now()
	ok, bad := up.counts(from, to)
	got := float64(ok) / to.Sub(from).Seconds()
	share := float64(bad) / float64(max(1, ok+bad))
	t.Logf("after the first minute: %.2f/s admitted of %g/s (%.2fx the oracle's time), %.1f%% refused; clients %v", got, rate, 0.98*rate/got, 100*share, counts)
	if 0.98*rate/got > 1.5 {
		t.Errorf("after the first minute the fleet took %.2fx the oracle's time (%.2f/s admitted, %g/s allowed), want at most 1.5x", 0.98*rate/got, got, rate)
	}
	if share > 0.02 {
		t.Errorf("after the first minute %.1f%% of requests were refused (%d of %d), want at most 2%%", 100*share, bad, ok+bad)
	}
}

// killLearner finds the key's learner in the fleet's view and kills its
// node (SIGKILL).
func killLearner(t *testing.T, nodes []*child, token string) {
	t.Helper()
	var view api.FleetSources
	nodes[0].call(t, "GET", "/v1/fleet/sources", token, nil, &view)
	if len(view.Sources) != 1 || view.Sources[0].Learner == "" {
		t.Fatalf("no learner in the fleet's view: %+v", view)
	}
	who := view.Sources[0].Learner
	var n int
	if _, err := fmt.Sscanf(who, "node%d", &n); err != nil || n < 1 || n > len(nodes) {
		t.Fatalf("learner %q is none of the nodes", who)
	}
	if err := nodes[n-1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	nodes[n-1].cmd.Wait()
	t.Logf("killed the learner, %s, whose limit was %d per %v", who, view.Sources[0].Learned, time.Duration(view.Sources[0].LearnedWindow))
}

// TestFleetHoldsToAnAdvertisedQuota: the same upstream, advertising its
// quota (RateLimit-Policy: 16;w=2). The nodes are not told it, and do not
// pace a shared key at what each reads alone: the fleet's learned limit is
// held to the quota (a node that reads it cuts the limit to it), so after
// its first 10 s the fleet admits at least 90% of the quota, with at most
// 2% refused, and every node reserves at 16 per 2 s.
func TestFleetHoldsToAnAdvertisedQuota(t *testing.T) {
	if testing.Short() {
		t.Skip("three auditd nodes for 30 s")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the other long fleet tests
	const token, limit, window = "fleet-admin-token-0123456789abcdef", 16, 2 * time.Second
	rate := float64(limit) / window.Seconds()
	up := startSlidingUpstreamWith(t, limit, window, http.Header{"Ratelimit-Policy": {"16;w=2"}})
	cluster := etcdtest.Start(t, 1)
	f := startFleetNodesWith(t, token, func(int) string {
		return fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    concurrency: 4\n", up.URL)
	}, func(int) []string { return []string{"--fleet-etcd", cluster.Endpoints()[0]} })
	stop := make(chan struct{})
	start := time.Now()
	wait := fleetLoad(t, f.nodes, f.runs, token, 8, stop)
	time.Sleep(30 * time.Second)
	var view api.FleetSources
	f.nodes[0].call(t, "GET", "/v1/fleet/sources", token, nil, &view)
	close(stop)
	wait()
	from, to := start.Add(10*time.Second), time.Now()
	ok, bad := up.counts(from, to)
	got := float64(ok) / to.Sub(from).Seconds()
	share := float64(bad) / float64(max(1, ok+bad))
	t.Logf("after the first 10 s: %.2f/s admitted of %g/s, %.1f%% refused", got, rate, 100*share)
	if got < 0.9*rate || share > 0.02 {
		t.Errorf("after the first 10 s the fleet admitted %.2f/s of an advertised %g/s with %.1f%% refused, want at least 90%% and at most 2%%", got, rate, 100*share)
	}
	if len(view.Sources) != 1 || view.Sources[0].Learned*int(time.Duration(view.Sources[0].LearnedWindow)/time.Millisecond) != limit*int(window/time.Millisecond) {
		t.Errorf("the fleet's view %+v, want one key learned at the advertised %d per %v", view.Sources, limit, window)
	}
	if t.Failed() && len(view.Sources) == 1 {
		for _, n := range view.Sources[0].Nodes {
			t.Logf("%s over %v: %d slots reserved, %d used, %d wasted", n.Node, time.Duration(n.Span), n.Reserved, n.Used, n.Wasted)
		}
		logLearned(t, f, start, window)
	}
}
