package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// concLatency is how long the upstreams below take over a request they
// admit; concRefuseIn, over one they refuse.
const (
	concLatency  = 300 * time.Millisecond
	concRefuseIn = 5 * time.Millisecond
)

// TestConcurrencyConvergence is TestConvergence for a server that refuses
// beyond N requests in flight, each taking 300 ms: N of 2, 4 and 8, with a
// 503 and Retry-After or a plain 429, a source registered with nothing but
// its ceiling (default concurrency, default options), and as many workers
// as the limiter lets go. From a cold start it reaches 90% of what the
// shape allows (N requests per 300 ms) within max(60 s, five windows of
// 300 ms) of its first request and holds it, with at most 2% refused after
// the first minute; the concurrency it learned is N, and what the snapshot
// and the ledger show.
func TestConcurrencyConvergence(t *testing.T) {
	if testing.Short() {
		t.Skip("sends tens of thousands of requests")
	}
	for _, n := range []int{2, 4, 8} {
		for _, ra := range []bool{true, false} {
			name := fmt.Sprintf("inflight%d/plain429", n)
			if ra {
				name = fmt.Sprintf("inflight%d/503retryafter", n)
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				up := &concUpstream{max: n, retryAfter: ra}
				p := newConcPacer(t, up, auditd.Source{})
				deadline, measure := time.Minute, 3*time.Minute
				p.runUntil(deadline + measure)

				allowed := float64(n) / concLatency.Seconds()
				after := p.between(deadline, deadline+measure)
				reached := p.reached(allowed)
				t.Logf("allowed %.3g/s, 90%% at %v; after the first minute: %s (%.0f%%); %s",
					allowed, reached, after, 100*after.rate()/allowed, p.state())
				if reached < 0 || reached > deadline {
					t.Errorf("90%% of %.3g/s reached at %v, want by %v", allowed, reached, deadline)
				}
				if after.rate() < 0.9*allowed {
					t.Errorf("throughput %.3g/s after the first minute, want at least 90%% of %.3g/s", after.rate(), allowed)
				}
				if share := after.refusedShare(); share > 0.02 {
					t.Errorf("refused %.1f%% after the first minute, want at most 2%%", 100*share)
				}
				st, err := p.reg.State("up")
				if err != nil {
					t.Fatal(err)
				}
				if st.Concurrency != n {
					t.Errorf("learned concurrency %d, want %d", st.Concurrency, n)
				}
				if got, _ := p.lim.Concurrency("up"); got != st.Concurrency {
					t.Errorf("the limiter has %d slots, the registry shows %d", got, st.Concurrency)
				}
				p.checkShown(allowed, after.rate())
				if p.peak > n+1 {
					t.Errorf("%d in flight at the server at most, want no more than one past %d", p.peak, n)
				}
				p.checkConcEvents()
				if t.Failed() || testing.Verbose() {
					t.Log(p.trace())
				}
			})
		}
	}
}

// TestConcurrencyOperatorCeiling: an operator's concurrency is a ceiling.
// A server that takes 8 in flight never sees more than the 3 configured,
// and learning keeps the source there; one that takes 2 cuts it to 2.
func TestConcurrencyOperatorCeiling(t *testing.T) {
	for _, tc := range []struct{ server, want int }{{8, 3}, {2, 2}} {
		t.Run(fmt.Sprintf("server%d", tc.server), func(t *testing.T) {
			up := &concUpstream{max: tc.server, retryAfter: true}
			p := newConcPacer(t, up, auditd.Source{Concurrency: 3})
			p.runUntil(2 * time.Minute)
			if p.peak > 3 {
				t.Fatalf("%d in flight at the server, want at most the 3 configured\n%s", p.peak, p.trace())
			}
			st, _ := p.reg.State("up")
			if st.Concurrency != tc.want {
				t.Fatalf("concurrency %d, want %d\n%s", st.Concurrency, tc.want, p.trace())
			}
			allowed := float64(tc.want) / concLatency.Seconds()
			p.checkShown(allowed, p.between(time.Minute, 2*time.Minute).rate())
		})
	}
}

// TestRateRefusalsAreNotConcurrency: a token bucket of 5 a second whose
// requests take 300 ms refuses at whatever number in flight the pace
// brings; its refusals teach the pace, and the source keeps slots enough
// for it (the pace needs two in flight).
func TestRateRefusalsAreNotConcurrency(t *testing.T) {
	up := &concUpstream{max: 1 << 10, rate: 5}
	p := newConcPacer(t, up, auditd.Source{})
	p.runUntil(3 * time.Minute)
	after := p.between(time.Minute, 3*time.Minute)
	if after.rate() < 0.9*5 || after.refusedShare() > 0.02 {
		t.Fatalf("%s after the first minute, want 90%% of 5/s and at most 2%% refused\n%s", after, p.trace())
	}
	st, _ := p.reg.State("up")
	if st.Concurrency < 2 || st.Phase != registry.PhaseSteady {
		t.Fatalf("concurrency %d, phase %s: want two or more slots, and the pace learned from the refusals\n%s", st.Concurrency, st.Phase, p.trace())
	}
}

// concUpstream is a server on the fake clock that refuses a request
// arriving with max in flight already (503 with Retry-After: 1, or a plain
// 429), and, when rate is set, one that finds its token bucket (burst 1)
// empty.
type concUpstream struct {
	max        int
	retryAfter bool
	rate       float64 // per second; 0 for none
	inFlight   int
	tat        time.Time // the bucket's theoretical arrival time (GCRA)
}

// arrive answers a request arriving at now: its status and headers, and
// when the answer is back.
func (u *concUpstream) arrive(now time.Time) (int, http.Header, time.Duration) {
	refuse := func() (int, http.Header, time.Duration) {
		if u.retryAfter {
			return http.StatusServiceUnavailable, http.Header{"Retry-After": {"1"}}, concRefuseIn
		}
		return http.StatusTooManyRequests, http.Header{}, concRefuseIn
	}
	if u.inFlight >= u.max {
		return refuse()
	}
	if u.rate > 0 {
		iv := time.Duration(float64(time.Second) / u.rate)
		if u.tat.After(now) {
			return refuse()
		}
		u.tat = now.Add(iv)
	}
	u.inFlight++
	return http.StatusOK, http.Header{}, concLatency
}

// concPacer is the fetch loop's path for one source with as many workers as
// its slots let go, run as discrete events on the fake clock: each request
// is admitted by the limiter (shed at once rather than wait, so nothing
// blocks), answered by the upstream after its latency, and observed by the
// limiter and the registry with the number in flight it left with.
type concPacer struct {
	tb    testing.TB
	clk   *clock.Fake
	start time.Time
	up    *concUpstream
	lim   *limiter.Limiter
	reg   *registry.Registry
	led   *memLedger
	peak  int // the most in flight at the server
	log   []sent
	out   []concRequest // in flight, by when their answer is back
}

// concRequest is a request in flight.
type concRequest struct {
	permit *limiter.Permit
	sent   time.Time
	back   time.Time
	status int
	header http.Header
}

// concWorkers bounds the requests the pacer keeps in flight, as the fetch
// loop's workers do: above every concurrency learning may reach.
const concWorkers = registry.MaxConcurrency + 1

func newConcPacer(tb testing.TB, up *concUpstream, src auditd.Source) *concPacer {
	tb.Helper()
	clk := clock.NewFake(epoch)
	p := &concPacer{tb: tb, clk: clk, start: clk.Now(), up: up, lim: limiter.New(clk), led: &memLedger{clock: clk}}
	p.lim.Jitter = func(n time.Duration) time.Duration { return n / 2 }
	var err error
	p.reg, err = registry.Open(MustOpenDB(tb), registry.Options{Ledger: p.led, Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	// The ceiling, 60 a second, sits above every rate the server allows:
	// what is tested is learning.
	src.ID, src.BaseURL, src.Limit, src.Window = "up", "http://upstream.test", 3600, auditd.Duration(time.Minute)
	if err := p.reg.PutSource(context.Background(), "test", src); err != nil {
		tb.Fatal(err)
	}
	cfg := limiter.ConfigFromSource(src)
	cfg.BackoffBase = 50 * time.Millisecond // as the fetch loop sets it for this ceiling
	if err := p.lim.Configure("up", cfg); err != nil {
		tb.Fatal(err)
	}
	st, err := p.reg.State("up")
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.lim.SetLimit("up", st.Limit, st.Window); err != nil {
		tb.Fatal(err)
	}
	if err := p.lim.SetConcurrency("up", st.Concurrency); err != nil {
		tb.Fatal(err)
	}
	return p
}

// runUntil sends requests until the fake clock passes d after the start.
func (p *concPacer) runUntil(d time.Duration) {
	p.tb.Helper()
	for now := p.clk.Now(); now.Sub(p.start) < d; now = p.clk.Now() {
		for len(p.out) > 0 && !p.out[0].back.After(now) {
			r := p.out[0]
			p.out = p.out[1:]
			p.settle(r)
		}
		next := now.Add(time.Second) // nothing else to wait for: look again
		if len(p.out) > 0 {
			next = p.out[0].back
		}
		for len(p.out) < concWorkers {
			permit, err := p.lim.Acquire(context.Background(), "up", limiter.Request{Deadline: now})
			var shed *limiter.ShedError
			if errors.As(err, &shed) {
				if shed.Wait > 0 && now.Add(shed.Wait).Before(next) {
					next = now.Add(shed.Wait)
				}
				break
			}
			if err != nil {
				p.tb.Fatalf("acquire: %v", err)
			}
			status, header, took := p.up.arrive(now)
			p.peak = max(p.peak, p.up.inFlight)
			r := concRequest{permit: permit, sent: now, back: now.Add(took), status: status, header: header}
			i, _ := slices.BinarySearchFunc(p.out, r.back, func(x concRequest, t time.Time) int { return x.back.Compare(t) })
			p.out = slices.Insert(p.out, i, r)
			if r.back.Before(next) {
				next = r.back
			}
		}
		p.clk.Set(next)
	}
}

// settle observes a request whose answer is back, as the fetch loop does.
func (p *concPacer) settle(r concRequest) {
	p.tb.Helper()
	ctx := context.Background()
	now := p.clk.Now()
	if r.status == http.StatusOK {
		p.up.inFlight--
	}
	h := hints.Parse(r.header, now)
	obs := registry.Observation{RunID: "conc", SourceID: "up", Status: r.status, Sent: r.sent, Hint: h, InFlight: r.permit.InFlight}
	v := r.permit.Observe(limiter.Outcome{Status: r.status, Hint: h, Attempt: 1, Refused: p.reg.Refusal(obs)})
	switch v.Class {
	case limiter.ClassThrottled:
		obs.Outcome = auditd.OutcomeThrottled
	case limiter.ClassSuccess:
		obs.Outcome = auditd.OutcomeSuccess
	default:
		obs.Outcome = auditd.OutcomeServerError
	}
	d, err := p.reg.Observe(ctx, obs)
	if err != nil {
		p.tb.Fatalf("observe: %v", err)
	}
	if d.Retune {
		limit, window := d.Pace()
		if err := p.lim.SetLimit("up", limit, window); err != nil {
			p.tb.Fatal(err)
		}
	}
	if d.ConcurrencyChanged {
		if err := p.lim.SetConcurrency("up", d.Concurrency); err != nil {
			p.tb.Fatal(err)
		}
	}
	if d.Pause > 0 {
		if _, err := p.lim.Pause("up", now.Add(d.Pause)); err != nil {
			p.tb.Fatal(err)
		}
	}
	p.log = append(p.log, sent{at: r.sent.Sub(p.start), id: "up", status: r.status})
}

// between counts the requests sent in [from, to).
func (p *concPacer) between(from, to time.Duration) tally {
	t := tally{span: to - from}
	for _, s := range p.log {
		if s.at < from || s.at >= to {
			continue
		}
		t.requests++
		switch s.status {
		case http.StatusOK:
			t.ok++
		default:
			t.refused++
		}
	}
	return t
}

// reached is when the successes first came at 90% of allowed or more over
// ten seconds; -1 when never.
func (p *concPacer) reached(allowed float64) time.Duration {
	if n := len(p.log); n > 0 {
		for t := time.Duration(0); t+10*time.Second <= p.log[n-1].at; t += time.Second {
			if p.between(t, t+10*time.Second).rate() >= 0.9*allowed {
				return t
			}
		}
	}
	return -1
}

func (p *concPacer) state() string {
	st, err := p.reg.State("up")
	if err != nil {
		p.tb.Fatal(err)
	}
	return fmt.Sprintf("pace %d/%v (%s), concurrency %d, %d in flight at most", st.Limit, st.Window, st.Phase, st.Concurrency, p.peak)
}

// trace is the registry's changes and the request log in 5-second buckets.
func (p *concPacer) trace() string {
	var b strings.Builder
	for _, e := range p.led.ofType(auditd.EventRegistryChanged) {
		fmt.Fprintf(&b, "  %8v %s %d/%v -> %d/%v %s\n", e.Time.Sub(p.start).Round(time.Millisecond), e.Cause,
			e.OldLimit, e.OldWindow, e.NewLimit, e.NewWindow, e.Detail)
	}
	if n := len(p.log); n > 0 {
		for from := time.Duration(0); from <= p.log[n-1].at; from += 5 * time.Second {
			fmt.Fprintf(&b, "  [%v, +5s) %s\n", from, p.between(from, from+5*time.Second))
		}
	}
	return b.String()
}

// checkConcEvents asserts that each concurrency change is on record with
// the slots before and after it, moves no rate, and that the last says
// what the registry holds.
// checkShown fails the test unless the pace the registry shows for the
// source (what the API, metrics and snapshots show) is what it is sent at,
// within 20% of what its slots allow, and no more than 20% past the
// throughput sent: the slots, not a pace shown and not acted on, hold it.
func (p *concPacer) checkShown(allowed, sent float64) {
	p.tb.Helper()
	lim, err := p.reg.Limits("up")
	if err != nil {
		p.tb.Fatal(err)
	}
	l, w := lim.Pace()
	shown := float64(l) / w.Seconds()
	if shown < 0.8*allowed || shown > 1.2*allowed || shown > 1.2*sent {
		p.tb.Errorf("pace shown %d/%v (%.3g/s): want within 20%% of the %.3g/s the slots allow, and of the %.3g/s sent", l, w, shown, allowed, sent)
	}
}

func (p *concPacer) checkConcEvents() {
	p.tb.Helper()
	last := limiter.DefaultConcurrency
	for _, e := range p.led.ofType(auditd.EventRegistryChanged) {
		if e.Cause != registry.CauseConcurrency {
			continue
		}
		var det struct {
			Old int `json:"old_concurrency"`
			New int `json:"concurrency"`
		}
		if err := json.Unmarshal([]byte(e.Detail), &det); err != nil {
			p.tb.Fatal(err)
		}
		if det.Old != last || det.New < 1 || det.New == det.Old || e.OldLimit != e.NewLimit || e.OldWindow != e.NewWindow {
			p.tb.Fatalf("concurrency change %+v after %d slots: want the slots moved from the last, and the rate left alone", e, last)
		}
		last = det.New
	}
	if st, _ := p.reg.State("up"); st.Concurrency != last {
		p.tb.Fatalf("the ledger's last concurrency is %d, the registry holds %d", last, st.Concurrency)
	}
}

// TestConcurrencyRefusalNeedsRecentSuccess: refusals with more in flight
// than a success a moment ago cut the slots; the same refusals after a
// minute with no success (a server down for maintenance answering 503 and
// Retry-After to everything) leave the slots alone and go to the pace.
func TestConcurrencyRefusalNeedsRecentSuccess(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.led.clock = h.clk
	clk, led, reg := h.clk, h.led, h.reg
	ctx := context.Background()
	h.put(t, auditd.Source{ID: "s", BaseURL: "http://s.test"})
	observe := func(status, inFlight int) registry.Decision {
		t.Helper()
		obs := registry.Observation{SourceID: "s", Status: status, InFlight: inFlight}
		if status == http.StatusServiceUnavailable {
			obs.Hint = hints.Hint{HasRetryAfter: true, RetryAfter: time.Second, RetryAfterRaw: "1"}
		}
		d, err := reg.Observe(ctx, obs)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	observe(http.StatusOK, 2)
	clk.Advance(2 * time.Minute) // the success is old news
	if d := observe(http.StatusServiceUnavailable, 3); d.ConcurrencyChanged || d.Concurrency != limiter.DefaultConcurrency {
		t.Fatalf("a refusal two minutes after the last success moved the slots: %+v", d)
	}
	observe(http.StatusOK, 2)
	d := observe(http.StatusServiceUnavailable, 3)
	if !d.ConcurrencyChanged || d.Concurrency != 2 {
		t.Fatalf("a refusal with 3 in flight just after a success with 2: %+v, want the slots cut to 2", d)
	}
	// The first refusal was the pace's (a throttle); the second, the
	// slots' alone.
	causes := map[string]int{}
	for _, e := range led.ofType(auditd.EventRegistryChanged) {
		causes[e.Cause]++
	}
	if causes[registry.CauseThrottle] != 1 || causes[registry.CauseConcurrency] != 1 {
		t.Fatalf("changes by cause %v, want one throttle and one concurrency", causes)
	}
}

// TestConcurrencyProbeRefusal: the client's count in flight holds answers
// the server has already counted out, so a request sent with one more than
// the server takes may succeed. Such a success does not make the refusal of
// a later probe of that many the pace's: the probe is cut back, and the
// pace is left alone.
func TestConcurrencyProbeRefusal(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.led.clock = h.clk
	clk, led, reg := h.clk, h.led, h.reg
	ctx := context.Background()
	h.put(t, auditd.Source{ID: "s", BaseURL: "http://s.test"})
	observe := func(status, inFlight int) registry.Decision {
		t.Helper()
		d, err := reg.Observe(ctx, registry.Observation{SourceID: "s", Status: status, InFlight: inFlight})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	observe(http.StatusOK, 2)
	if d := observe(http.StatusTooManyRequests, 3); d.Concurrency != 2 {
		t.Fatalf("a refusal with 3 in flight after a success with 2: %+v, want the slots cut to 2", d)
	}
	observe(http.StatusOK, 3) // sent before the cut, counted 3 by the client
	clk.Advance(31 * time.Second)
	probed := false
	for range 4 { // a round at full use, after the hold
		if d := observe(http.StatusOK, 2); d.ConcurrencyChanged {
			if probed = d.Concurrency == 3; !probed {
				t.Fatalf("a round at full use after the hold: %+v, want a probe of 3 slots", d)
			}
			break
		}
	}
	if !probed {
		t.Fatal("no probe of 3 slots after the hold")
	}
	if d := observe(http.StatusTooManyRequests, 3); !d.ConcurrencyChanged || d.Concurrency != 2 {
		t.Fatalf("the probe refused with 3 in flight: %+v, want the slots back at 2", d)
	}
	for _, e := range led.ofType(auditd.EventRegistryChanged) {
		if e.Cause == registry.CauseThrottle {
			t.Errorf("a throttle change (%d/%v -> %d/%v): the refusals were the slots', not the pace's", e.OldLimit, e.OldWindow, e.NewLimit, e.NewWindow)
		}
	}
}
