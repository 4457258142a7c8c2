package sim_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

// TestLatencyRunsOnTheClock: a response with latency waits for the fake
// clock, not for real time, and its jitter is the same on every run.
func TestLatencyRunsOnTheClock(t *testing.T) {
	const doc = "seed: 3\nupstreams:\n  - name: u\n    latency: {fixed: 2s, jitter: 500ms}\n"
	delays := func() []time.Duration {
		f := mustServe(t, mustParse(t, doc))
		var got []time.Duration
		for i := range 5 {
			done := make(chan response, 1)
			go func() { done <- f.get("u", "") }()
			f.clk.WaitForTimers(1)
			next, _ := f.clk.Next()
			d := next.Sub(f.clk.Now())
			got = append(got, d)
			f.clk.Advance(d - time.Nanosecond)
			select {
			case <-done:
				t.Fatalf("request %d answered %s before its latency %s", i, d-time.Nanosecond, d)
			default:
			}
			f.clk.Advance(time.Nanosecond)
			if r := <-done; r.status != 200 {
				t.Fatalf("request %d: status %d", i, r.status)
			}
		}
		return got
	}
	first, second := delays(), delays()
	distinct := make(map[time.Duration]bool)
	for i, d := range first {
		if d < 2*time.Second || d >= 2500*time.Millisecond {
			t.Errorf("delay %d = %s, want within [2s, 2.5s)", i, d)
		}
		if second[i] != d {
			t.Errorf("delay %d: %s then %s on a rerun, want the same", i, d, second[i])
		}
		distinct[d] = true
	}
	if len(distinct) < 2 {
		t.Errorf("delays %v do not jitter", first)
	}
}

// TestCloseEndsLatencyWaits: Close drops a request stuck in its latency,
// and the stats say so.
func TestCloseEndsLatencyWaits(t *testing.T) {
	f := mustServe(t, mustParse(t, "upstreams:\n  - name: u\n    latency: {fixed: 10m}\n"))
	errc := make(chan error, 1)
	go func() {
		_, err := f.try(http.MethodGet, "u", "", "")
		errc <- err
	}()
	f.clk.WaitForTimers(1)
	if err := f.sim.Close(context.Background()); err != nil {
		t.Fatalf("close: %v", err)
	}
	if err := <-errc; err == nil {
		t.Error("request answered after Close, want a dropped connection")
	}
	if st := f.sim.Stats("u"); st.Received != 1 || st.Dropped != 1 || len(st.ByStatus) != 0 {
		t.Errorf("stats %+v, want 1 received, 1 dropped", st)
	}
}

// TestStartServesEachUpstreamOnItsOwnListener runs shared_gateway.yaml on
// real loopback listeners and the real clock.
func TestStartServesEachUpstreamOnItsOwnListener(t *testing.T) {
	s, err := sim.New(mustLoad(t, "shared_gateway.yaml"), clock.Real{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	urls, err := s.Start(ctx)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { s.Close(ctx) })
	hosts := make(map[string]bool)
	for _, name := range s.Upstreams() {
		u, err := url.Parse(urls[name])
		if err != nil || u.Scheme != "http" || u.Path != s.Path(name) {
			t.Fatalf("%s: base URL %q", name, urls[name])
		}
		hosts[u.Host] = true
		resp, err := http.Get(urls[name])
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || resp.Header.Get("Date") == "" {
			t.Errorf("%s: %d, Date %q", name, resp.StatusCode, resp.Header.Get("Date"))
		}
		if st := s.Stats(name); st.Received != 1 || st.ByStatus[200] != 1 {
			t.Errorf("%s: stats %+v", name, st)
		}
	}
	if len(hosts) != 2 {
		t.Errorf("hosts %v, want one host:port per upstream", hosts)
	}
	if _, err := s.Start(ctx); !errors.Is(err, sim.ErrStarted) {
		t.Errorf("second start: %v, want ErrStarted", err)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatalf("close: %v", err)
	}
	if _, err := http.Get(urls["north-county"]); err == nil {
		t.Error("served after Close")
	}
	if _, err := s.Start(ctx); !errors.Is(err, sim.ErrClosed) {
		t.Errorf("start after close: %v, want ErrClosed", err)
	}
}

func TestUnknownUpstreamPanics(t *testing.T) {
	f := mustServe(t, mustParse(t, "upstreams: [{name: a}]\n"))
	defer func() {
		if recover() == nil {
			t.Error("Stats of an unknown upstream did not panic")
		}
	}()
	f.sim.Stats("b")
}
