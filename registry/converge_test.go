package registry_test

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/sim"
)

// TestConvergence is the learning loop's contract, on the fake clock, with
// the registry's default options: for each shape in testdata/scenarios and
// hidden rates from 30 a minute to 20 a second, a source that starts cold at
// the conservative default reaches 90% of the hidden rate within 60 seconds
// of its first request or five windows of the hidden limit, whichever is
// longer (the deadline), and after that holds refusals at or under 2% while
// its throughput stays at 90% of the hidden rate or more.
//
// The pacer below is the fetch loop's path, one request at a time: limiter
// Acquire, a real HTTP request to the simulator, registry Refusal for a
// plain 503, limiter Observe, registry Observe, retune and pause.
func TestConvergence(t *testing.T) {
	if testing.Short() {
		t.Skip("sends tens of thousands of requests")
	}
	rates := []float64{0.5, 2, 5, 20} // per second: 30 a minute to 20 a second
	for _, tc := range []struct {
		file string
		// from is when the measure starts, for the shapes whose hidden rate
		// is the one after a change: the halving, and the end of the outage.
		from time.Duration
		// final is 1 when the hidden rate after from is the rate itself, else
		// that of the limit's last change.
		final float64
	}{
		{file: "leaky_bucket.yaml", final: 1},
		{file: "fixed_window.yaml", final: 1},
		{file: "sliding_window.yaml", final: 1},
		{file: "token_bucket.yaml", final: 1},
		{file: "halving.yaml", from: 30 * time.Second, final: 0.5},
		{file: "shared_gateway.yaml", final: 1},
		{file: "outage.yaml", from: 3*time.Minute + 30*time.Second, final: 1},
	} {
		for _, per := range rates {
			name := fmt.Sprintf("%s/%gps", strings.TrimSuffix(tc.file, ".yaml"), per)
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", tc.file))
				if err != nil {
					t.Fatal(err)
				}
				window, final := rescale(sc, per)
				hidden := per
				if tc.final != 1 {
					hidden = final
				}
				deadline := tc.from + max(time.Minute, 5*window)
				// At least three minutes, ten windows and 300 requests.
				measure := max(3*time.Minute, 10*window, time.Duration(300/hidden*float64(time.Second)))

				// The ceiling sits well above every hidden rate: what is
				// tested is learning, not the ceiling.
				p := newPacer(t, sc, 1800)
				p.runUntil(deadline + measure)

				after := p.between(deadline, deadline+measure)
				t.Logf("%s: hidden %.3g/s, deadline %v; after it: %s (%.0f%% of hidden); limits %s",
					t.Name(), hidden, deadline, after, 100*after.rate()/hidden, p.limits())
				// Reached by the deadline and held: the average from the
				// deadline on is at least 90% of the hidden rate (a
				// probe's refusal costs a cut and a recovery, so it sits a
				// little below), with at most 2% refused.
				if after.rate() < 0.9*hidden {
					t.Errorf("throughput %.3g/s after the deadline, want at least 90%% of %.3g/s", after.rate(), hidden)
				}
				if share := after.refusedShare(); share > 0.02 {
					t.Errorf("refused %.1f%% after the deadline, want at most 2%%", 100*share)
				}
				p.checkEvents(1800)
				if t.Failed() || testing.Verbose() {
					t.Log(p.trace())
				}
			})
		}
	}
}

// rescale sets every limit of sc (its upstreams' and its groups', and their
// changes) to per requests per second, keeping each shape, burst and share
// of its first rate, and returns the window of the first limit and the rate
// of its last change (per when it has none). A window holds at least one
// request.
func rescale(sc *sim.Scenario, per float64) (time.Duration, float64) {
	var first time.Duration
	final := per
	// shape returns requests per window for per, keeping window w when it
	// holds at least one request.
	shape := func(per float64, w time.Duration) (int, time.Duration) {
		if n := per * w.Seconds(); n >= 1 {
			return int(math.Round(n)), w
		}
		return 1, time.Duration(float64(time.Second) / per)
	}
	scale := func(l *sim.Limit) {
		if l == nil || l.Shape == sim.ShapeNone || l.Shape == "" {
			return
		}
		w := l.Window
		if w == 0 {
			w = sim.DefaultWindow
		}
		base := float64(l.Requests) / w.Seconds()
		for i := range l.Changes {
			c := &l.Changes[i]
			cw := w
			if c.Window != nil {
				cw = *c.Window
			}
			n, nw := shape(per*float64(c.Requests)/cw.Seconds()/base, cw)
			c.Requests, c.Window = n, &nw
			if first == 0 {
				final = float64(n) / nw.Seconds()
			}
		}
		l.Requests, l.Window = shape(per, w)
		if first == 0 {
			first = l.Window
		}
	}
	for i := range sc.Groups {
		scale(&sc.Groups[i].Limit)
	}
	for i := range sc.Upstreams {
		scale(sc.Upstreams[i].Limit)
	}
	return first, final
}

// pacer is a one-request-at-a-time fetch loop over every upstream of a
// scenario, taking them in turn.
type pacer struct {
	tb     testing.TB
	clk    *clock.Fake
	start  time.Time
	sim    *sim.Sim
	lim    *limiter.Limiter
	reg    *registry.Registry
	led    *memLedger
	client *http.Client
	ids    []string
	urls   map[string]string
	next   int
	log    []sent
}

// sent is one request the pacer sent and how it came back.
type sent struct {
	at     time.Duration // since the start
	id     string
	status int // 0: transport error
}

func newPacer(tb testing.TB, sc *sim.Scenario, ceiling int) *pacer {
	tb.Helper()
	clk := clock.NewFake(epoch)
	s, err := sim.New(sc, clk)
	if err != nil {
		tb.Fatal(err)
	}
	p := &pacer{tb: tb, clk: clk, start: clk.Now(), sim: s, lim: limiter.New(clk), led: &memLedger{clock: clk},
		client: &http.Client{Timeout: 10 * time.Second}, urls: make(map[string]string)}
	p.lim.Jitter = func(n time.Duration) time.Duration { return n / 2 }
	p.reg, err = registry.Open(MustOpenDB(tb), registry.Options{Ledger: p.led, Clock: clk})
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
		cfg := limiter.ConfigFromSource(src)
		// As the fetch loop configures it: the own backoff starts at one
		// interval of the ceiling.
		cfg.BackoffBase = max(time.Minute/time.Duration(ceiling), 50*time.Millisecond)
		if err := p.lim.Configure(up.Name, cfg); err != nil {
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

// runUntil sends requests until the fake clock passes d after the start.
func (p *pacer) runUntil(d time.Duration) {
	p.tb.Helper()
	ctx := context.Background()
	stop := autoAdvance(p.clk)
	defer stop()
	for p.clk.Now().Sub(p.start) < d {
		id := p.ids[p.next%len(p.ids)]
		p.next++
		permit, err := p.lim.Acquire(ctx, id, limiter.Request{})
		if err != nil {
			p.tb.Fatalf("acquire %s: %v", id, err)
		}
		at := p.clk.Now()
		status, header := 0, http.Header(nil)
		resp, err := p.client.Get(p.urls[id])
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			status, header = resp.StatusCode, resp.Header
		}
		h := hints.Parse(header, p.clk.Now())
		obs := registry.Observation{RunID: "converge", SourceID: id, Status: status, Sent: at, Hint: h}
		refused := p.reg.Refusal(obs)

		// Remaining/Reset go to the registry, whose Decision.Pause waits
		// one interval of a known quota, as in the fetch loop.
		forLimiter := h
		forLimiter.HasRemaining, forLimiter.HasReset = false, false
		v := permit.Observe(limiter.Outcome{Status: status, Err: err, Hint: forLimiter, Attempt: 1, Refused: refused})
		switch v.Class {
		case limiter.ClassThrottled:
			obs.Outcome = auditd.OutcomeThrottled
		case limiter.ClassSuccess:
			obs.Outcome = auditd.OutcomeSuccess
		case limiter.ClassServer, limiter.ClassTransport:
			obs.Outcome = auditd.OutcomeServerError
		}
		d, err := p.reg.Observe(ctx, obs)
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
		p.log = append(p.log, sent{at: at.Sub(p.start), id: id, status: status})
	}
}

// tally counts what the pacer sent in a span of time.
type tally struct {
	requests, ok, refused int
	span                  time.Duration
}

func (t tally) rate() float64 { return float64(t.ok) / t.span.Seconds() }

func (t tally) refusedShare() float64 {
	if t.requests == 0 {
		return 0
	}
	return float64(t.refused) / float64(t.requests)
}

func (t tally) String() string {
	return fmt.Sprintf("%d requests, %d ok, %d refused over %v: %.3g/s", t.requests, t.ok, t.refused, t.span, t.rate())
}

// between counts the requests sent in [from, to).
func (p *pacer) between(from, to time.Duration) tally {
	t := tally{span: to - from}
	for _, s := range p.log {
		if s.at < from || s.at >= to {
			continue
		}
		t.requests++
		switch {
		case s.status == http.StatusTooManyRequests || s.status == http.StatusServiceUnavailable:
			t.refused++
		case s.status >= 200 && s.status < 300:
			t.ok++
		}
	}
	return t
}

// limits describes the registry's limits for each upstream.
func (p *pacer) limits() string {
	var b strings.Builder
	for _, id := range p.ids {
		s, err := p.reg.State(id)
		if err != nil {
			p.tb.Fatal(err)
		}
		fmt.Fprintf(&b, "%s %d/%v (%s, refused %d)", id, s.Limit, s.Window, s.Phase, s.ThrottledAt)
		if s.Group != "" {
			fmt.Fprintf(&b, " group %d/%v members %d", s.GroupLimit, s.GroupWindow, s.MembersLimit)
		}
		b.WriteString("; ")
	}
	return b.String()
}

// trace is the registry's changes and the request log in 5-second buckets.
func (p *pacer) trace() string {
	var b strings.Builder
	for _, e := range p.led.ofType(auditd.EventRegistryChanged) {
		fmt.Fprintf(&b, "  %8v %s %s %d/%v -> %d/%v %s\n", e.Time.Sub(p.start).Round(time.Millisecond), e.SourceID, e.Cause,
			e.OldLimit, e.OldWindow, e.NewLimit, e.NewWindow, e.Detail)
	}
	if n := len(p.log); n > 0 {
		end := p.log[n-1].at
		for from := time.Duration(0); from <= end; from += 5 * time.Second {
			fmt.Fprintf(&b, "  [%v, +5s) %s\n", from, p.between(from, from+5*time.Second))
		}
	}
	return b.String()
}

// checkEvents asserts what every registry change must be: on record, within
// the ceiling, and taught by something named.
func (p *pacer) checkEvents(ceiling int) {
	p.tb.Helper()
	changes := p.led.ofType(auditd.EventRegistryChanged)
	if len(changes) == 0 {
		p.tb.Fatal("the registry learned nothing")
	}
	for _, e := range changes {
		if float64(e.NewLimit)/e.NewWindow.Minutes() > float64(ceiling)+1e-9 {
			p.tb.Fatalf("change above the ceiling of %d/min: %+v", ceiling, e)
		}
		if e.Cause == "" {
			p.tb.Fatalf("change without a cause: %+v", e)
		}
	}
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
