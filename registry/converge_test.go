package registry_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/sim"
)

// TestConvergence runs a small pacing loop against the simulator's hidden
// limits, the way the fetch loop will: limiter Acquire on a clock.Fake shared
// with the simulator, a real HTTP GET to its httptest server, hints.Parse,
// registry Observe, limiter retune. After a learning phase, the measured
// phase must see under 5% refusals and at least 85% of the hidden rate.
//
// The registry runs with a 10-second learning window (3 requests per 10s to
// start, the default's 18 a minute) instead of the default minute, so that a
// probe needs ~100 requests at 10 r/s rather than ~600 and the test stays at
// a few thousand requests per scenario.
func TestConvergence(t *testing.T) {
	if testing.Short() {
		t.Skip("sends thousands of requests")
	}
	for _, tc := range []struct {
		file string
		// ceiling is each source's configured Limit per minute.
		ceiling int
		// preset, when set, is a limit per 10s the operator set before the
		// run: the halving scenario needs a registry that already knows
		// 10 r/s when the server halves its quota at 30s.
		preset int
		// hidden is the server's sustained rate during the measured phase,
		// in requests per second.
		hidden         float64
		learn, measure int
	}{
		{file: "leaky_bucket.yaml", ceiling: 1200, hidden: 10, learn: 2500, measure: 2500},
		{file: "fixed_window.yaml", ceiling: 600, hidden: 1, learn: 300, measure: 900},
		{file: "sliding_window.yaml", ceiling: 600, hidden: 3, learn: 1000, measure: 1500},
		{file: "halving.yaml", ceiling: 1200, preset: 100, hidden: 5, learn: 1500, measure: 1500},
		{file: "shared_gateway.yaml", ceiling: 600, hidden: 4, learn: 1500, measure: 1500},
	} {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			p := newPacer(t, sc, tc.ceiling)
			if tc.preset > 0 {
				for _, id := range p.ids {
					if _, err := p.reg.SetLimit(context.Background(), "ops", id, tc.preset, 10*time.Second); err != nil {
						t.Fatal(err)
					}
					p.retune(id)
				}
			}

			learned := p.run(tc.learn)
			got := p.run(tc.measure)
			rate := float64(got.ok) / got.elapsed.Seconds()
			refused := float64(got.refused) / float64(got.requests)
			lim, _ := p.reg.Limits(p.ids[0])
			t.Logf("%s: learning: %d requests, %d refused, %v; measured: %d requests, %d refused (%.1f%%), %.2f/s of %.2f/s hidden (%.0f%%) over %v; limits %+v",
				tc.file, learned.requests, learned.refused, learned.elapsed.Round(time.Second), got.requests, got.refused, 100*refused,
				rate, tc.hidden, 100*rate/tc.hidden, got.elapsed.Round(time.Second), lim)
			if refused >= 0.05 {
				t.Errorf("refused %.1f%% of measured requests, want under 5%%", 100*refused)
			}
			if rate < 0.85*tc.hidden {
				t.Errorf("throughput %.2f/s, want at least 85%% of the hidden %.2f/s", rate, tc.hidden)
			}
			// Every change the registry made is in the ledger, and none
			// passed a ceiling.
			changes := p.led.ofType(auditd.EventRegistryChanged)
			if len(changes) == 0 {
				t.Fatal("the registry learned nothing")
			}
			for _, e := range changes {
				if float64(e.NewLimit)/e.NewWindow.Minutes() > float64(tc.ceiling)+1e-9 {
					t.Fatalf("change above the ceiling of %d/min: %+v", tc.ceiling, e)
				}
			}
		})
	}
}

// pacer is a one-request-at-a-time fetch loop over every upstream of a
// scenario, taking them in turn.
type pacer struct {
	tb     testing.TB
	clk    *clock.Fake
	sim    *sim.Sim
	lim    *limiter.Limiter
	reg    *registry.Registry
	led    *memLedger
	client *http.Client
	ids    []string
	urls   map[string]string
	next   int
}

func newPacer(tb testing.TB, sc *sim.Scenario, ceiling int) *pacer {
	tb.Helper()
	clk := clock.NewFake(epoch)
	s, err := sim.New(sc, clk)
	if err != nil {
		tb.Fatal(err)
	}
	p := &pacer{tb: tb, clk: clk, sim: s, lim: limiter.New(clk), led: &memLedger{},
		client: &http.Client{}, urls: make(map[string]string)}
	p.lim.Jitter = func(n time.Duration) time.Duration { return n / 2 }
	p.reg, err = registry.Open(MustOpenDB(tb), registry.Options{
		Ledger: p.led, Clock: clk, DefaultLimit: 3, DefaultWindow: 10 * time.Second,
	})
	if err != nil {
		tb.Fatal(err)
	}
	for _, up := range sc.Upstreams {
		srv := httptest.NewServer(s.Handler(up.Name))
		tb.Cleanup(srv.Close)
		p.urls[up.Name] = srv.URL + s.Path(up.Name)
		p.ids = append(p.ids, up.Name)

		src := auditd.Source{ID: up.Name, BaseURL: srv.URL, Group: up.Group,
			Limit: ceiling, Window: auditd.Duration(time.Minute)}
		if err := p.reg.PutSource(context.Background(), "test", src); err != nil {
			tb.Fatal(err)
		}
		if err := p.lim.Configure(up.Name, limiter.ConfigFromSource(src)); err != nil {
			tb.Fatal(err)
		}
		p.retune(up.Name)
	}
	tb.Cleanup(func() { s.Close(context.Background()) })
	tb.Cleanup(p.client.CloseIdleConnections)
	return p
}

// retune hands the registry's pace for id to the limiter.
func (p *pacer) retune(id string) {
	p.tb.Helper()
	l, err := p.reg.Limits(id)
	if err != nil {
		p.tb.Fatal(err)
	}
	limit, window := l.Pace()
	if err := p.lim.SetLimit(id, limit, window); err != nil {
		p.tb.Fatal(err)
	}
}

type tally struct {
	requests, ok, refused int
	elapsed               time.Duration
}

// run sends n requests and counts what came back.
func (p *pacer) run(n int) tally {
	p.tb.Helper()
	ctx := context.Background()
	stop := autoAdvance(p.clk)
	defer stop()

	var t tally
	start := p.clk.Now()
	for range n {
		id := p.ids[p.next%len(p.ids)]
		p.next++
		permit, err := p.lim.Acquire(ctx, id, limiter.Request{})
		if err != nil {
			p.tb.Fatalf("acquire %s: %v", id, err)
		}
		sent := p.clk.Now()
		resp, err := p.client.Get(p.urls[id])
		if err != nil {
			p.tb.Fatalf("get %s: %v", id, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		h := hints.Parse(resp.Header, p.clk.Now())

		// Remaining/Reset go to the registry, whose Decision.Pause waits
		// one interval of a known quota; the limiter's Constrain pauses
		// until Reset, which for a sliding window is the whole log's
		// expiry (see the report).
		forLimiter := h
		forLimiter.HasRemaining, forLimiter.HasReset = false, false
		permit.Observe(limiter.Outcome{Status: resp.StatusCode, Hint: forLimiter, Attempt: 1})

		d, err := p.reg.Observe(ctx, registry.Observation{RunID: "converge", SourceID: id, Status: resp.StatusCode, Sent: sent, Hint: h})
		if err != nil {
			p.tb.Fatalf("observe: %v", err)
		}
		if d.Retune {
			limit, window := d.Pace()
			if err := p.lim.SetLimit(id, limit, window); err != nil {
				p.tb.Fatal(err)
			}
		}
		if d.Pause > 0 {
			if _, err := p.lim.Pause(id, p.clk.Now().Add(d.Pause)); err != nil {
				p.tb.Fatal(err)
			}
		}

		t.requests++
		switch {
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable:
			t.refused++
		case resp.StatusCode < 300:
			t.ok++
		default:
			p.tb.Fatalf("unexpected status %d from %s", resp.StatusCode, id)
		}
	}
	t.elapsed = p.clk.Now().Sub(start)
	return t
}

// autoAdvance moves clk to each timer's deadline as soon as one is pending,
// so Acquire's waits end at once while time stands still during a request.
// The returned stop ends the goroutine and waits for it.
func autoAdvance(clk *clock.Fake) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		for {
			clk.WaitForTimers(1)
			select {
			case <-done:
				return
			default:
			}
			if next, ok := clk.Next(); ok {
				clk.Set(next)
			}
		}
	}()
	return func() {
		close(done)
		wake := clk.NewTimer(time.Hour) // wakes WaitForTimers
		<-exited
		wake.Stop()
	}
}

func (t tally) String() string {
	return fmt.Sprintf("%d requests, %d ok, %d refused in %v", t.requests, t.ok, t.refused, t.elapsed)
}
