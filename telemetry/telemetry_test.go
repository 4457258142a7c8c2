package telemetry_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/telemetry"
)

type fakeRegistry struct{}

func (fakeRegistry) ListSources() []auditd.Source {
	return []auditd.Source{{ID: "county", Group: "gw"}}
}
func (fakeRegistry) PeekState(string) (registry.State, error) {
	return registry.State{Limit: 30, Window: time.Minute, CeilingLimit: 10, CeilingWindow: time.Second,
		Group: "gw", GroupLimit: 4, GroupWindow: time.Second}, nil
}

type fakeLimiter struct{ paused time.Time }

func (f fakeLimiter) State(string) (limiter.State, error) {
	return limiter.State{Breaker: limiter.BreakerOpen, InFlight: 2, Queued: 3, PausedUntil: f.paused}, nil
}

type fakeRuns struct{}

func (fakeRuns) Run(context.Context, string) (auditd.RunView, error) {
	return auditd.RunView{Run: auditd.Run{Status: auditd.RunPartial}, Counts: auditd.Counts{Items: 2, Succeeded: 1, Failed: 1}}, nil
}
func (fakeRuns) Reconciled(context.Context, string) (bool, []string, error) {
	return false, []string{"R1"}, nil
}

// Each event moves its series, the gauges read the gates at a scrape, and
// the log has one line per lifecycle event and none per dispatch.
func TestCommitted(t *testing.T) {
	var logs syncBuffer
	tel := telemetry.New()
	tel.Log = slog.New(slog.NewTextHandler(&logs, nil))
	now := time.Date(2026, 3, 2, 9, 0, 1, 0, time.UTC)
	tel.Now = func() time.Time { return now }
	reg := prometheus.NewRegistry()
	reg.MustRegister(tel.Collectors()...)
	tel.Wire(fakeRegistry{}, fakeLimiter{paused: time.Now().Add(time.Hour)}, fakeRuns{})

	at := now.Add(-10 * time.Millisecond)
	ev := func(e auditd.Event) *auditd.Event { e.SourceID, e.RunID, e.Time = "county", "run-1", at; return &e }
	events := []*auditd.Event{
		ev(auditd.Event{Type: auditd.EventRunStarted, Detail: `{"name":"morning","items":2}`}),
		ev(auditd.Event{Type: auditd.EventDispatch, Attempt: 1}),
		ev(auditd.Event{Type: auditd.EventThrottle, Status: 429, RetryAfterRaw: "2", Wait: 2 * time.Second}),
		ev(auditd.Event{Type: auditd.EventWait, Gate: "pause", Actual: 2 * time.Second}),
		ev(auditd.Event{Type: auditd.EventDispatch, Attempt: 2}),
		ev(auditd.Event{Type: auditd.EventResponse, Status: 200}),
		ev(auditd.Event{Type: auditd.EventRegistryChanged, OldLimit: 60, OldWindow: time.Minute, NewLimit: 30, NewWindow: time.Minute, Cause: "throttle"}),
		ev(auditd.Event{Type: auditd.EventBreaker, From: "closed", To: "open", Failures: 5, Threshold: 5}),
		ev(auditd.Event{Type: auditd.EventShed, Gate: "breaker"}),
		ev(auditd.Event{Type: auditd.EventItemFinished, Outcome: auditd.ItemSucceeded}),
		ev(auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(auditd.RunPartial)}),
	}
	tel.Committed(events, 3*time.Millisecond)

	for _, c := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{tel.Collectors()[0].(*prometheus.CounterVec).WithLabelValues("county"), 2},
		{tel.Collectors()[1].(*prometheus.CounterVec).WithLabelValues("county"), 1},
	} {
		if got := testutil.ToFloat64(c.c); got != c.want {
			t.Errorf("got %v, want %v", got, c.want)
		}
	}
	want := `
# HELP auditd_throttles_total Refusals for rate (429, 503 with Retry-After, a plain 503 taken for one), by status.
# TYPE auditd_throttles_total counter
auditd_throttles_total{source="county",status="429"} 1
# HELP auditd_breaker_state A source's circuit breaker: 0 closed, 1 half-open, 2 open.
# TYPE auditd_breaker_state gauge
auditd_breaker_state{source="county"} 2
# HELP auditd_learned_limit_per_second The pace a source's learned limit allows, in requests per second.
# TYPE auditd_learned_limit_per_second gauge
auditd_learned_limit_per_second{source="county"} 0.5
# HELP auditd_group_learned_limit_per_second The pace a gateway group's learned limit allows, in requests per second.
# TYPE auditd_group_learned_limit_per_second gauge
auditd_group_learned_limit_per_second{group="gw"} 4
# HELP auditd_in_flight_requests Requests to a source sent and not yet answered.
# TYPE auditd_in_flight_requests gauge
auditd_in_flight_requests{source="county"} 2
# HELP auditd_runs_finished_total Runs finished, by status.
# TYPE auditd_runs_finished_total counter
auditd_runs_finished_total{status="partial"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "auditd_throttles_total", "auditd_breaker_state",
		"auditd_learned_limit_per_second", "auditd_group_learned_limit_per_second", "auditd_in_flight_requests", "auditd_runs_finished_total"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(reg, "auditd_ledger_append_seconds"); n != 1 {
		t.Errorf("append latency series %d", n)
	}
	for _, c := range tel.Collectors() {
		problems, err := testutil.CollectAndLint(c)
		if err != nil || len(problems) > 0 {
			t.Errorf("lint: %v %+v", err, problems)
		}
	}

	// The finished run's line comes from a goroutine of its own.
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), `msg="run finished"`) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	out := logs.String()
	for _, line := range []string{`msg="run started" run=run-1 name=morning items=2`, `msg=refused source=county`,
		`msg="learned limit changed" source=county cause=throttle from_per_second=1 to_per_second=0.5`,
		`level=WARN msg="breaker open" source=county`, `level=WARN msg=shed source=county`,
		`msg="run finished" run=run-1 status=partial items=2 succeeded=1`, `balanced=false failing=[R1]`} {
		if !strings.Contains(out, line) {
			t.Errorf("log lacks %q:\n%s", line, out)
		}
	}
	if strings.Contains(out, "msg=dispatch") {
		t.Errorf("a line per dispatch:\n%s", out)
	}
}

// A gateway member's change and its group's are two registry.changed
// events with the same numbers: their lines say which is which.
func TestLearnedLineNamesItsScope(t *testing.T) {
	var logs syncBuffer
	tel := telemetry.New()
	tel.Log = slog.New(slog.NewTextHandler(&logs, nil))
	var events []*auditd.Event
	for _, scope := range []string{"source", "group"} {
		events = append(events, &auditd.Event{Type: auditd.EventRegistryChanged, SourceID: "north", Group: "regional",
			OldLimit: 15, OldWindow: time.Minute, NewLimit: 20, NewWindow: 10 * time.Second, Cause: "header",
			Detail: `{"scope":"` + scope + `","phase":"steady"}`})
	}
	tel.Committed(events, time.Millisecond)
	for _, scope := range []string{"source", "group"} {
		if want := `source=north cause=header from_per_second=0.25 to_per_second=2 group=regional scope=` + scope; !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// A concurrency change leaves the pace alone: its line says the requests
// in flight it moved between.
func TestLearnedLineNamesConcurrency(t *testing.T) {
	var logs syncBuffer
	tel := telemetry.New()
	tel.Log = slog.New(slog.NewTextHandler(&logs, nil))
	tel.Committed([]*auditd.Event{{Type: auditd.EventRegistryChanged, SourceID: "north",
		OldLimit: 60, OldWindow: time.Minute, NewLimit: 60, NewWindow: time.Minute, Cause: registry.CauseConcurrency,
		Detail: `{"scope":"source","status":503,"old_concurrency":4,"concurrency":2}`}}, time.Millisecond)
	if want := `source=north cause=concurrency from_per_second=1 to_per_second=1 from_in_flight=4 to_in_flight=2`; !strings.Contains(logs.String(), want) {
		t.Errorf("log lacks %q:\n%s", want, logs.String())
	}
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A stall counts once however often the ledger reports it, and the gauge
// says how long it has lasted until a commit succeeds again.
func TestStalled(t *testing.T) {
	tel := telemetry.New()
	reg := prometheus.NewRegistry()
	reg.MustRegister(tel.Collectors()...)
	stalled := func() float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "auditd_ledger_stalled_seconds" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		t.Fatal("no auditd_ledger_stalled_seconds")
		return 0
	}
	if v := stalled(); v != 0 {
		t.Fatalf("stalled %v before any stall", v)
	}
	full := errors.New("no space left on device")
	tel.Stalled(full)
	tel.Stalled(full)
	if v := stalled(); v <= 0 {
		t.Errorf("stalled %v during a stall", v)
	}
	tel.Stalled(nil)
	if v := stalled(); v != 0 {
		t.Errorf("stalled %v after commits succeed again", v)
	}
	tel.Stalled(full)
	want := `
# HELP auditd_ledger_stalls_total Times the ledger's commits started to fail (a full disk, say); dispatching pauses until they succeed.
# TYPE auditd_ledger_stalls_total counter
auditd_ledger_stalls_total 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "auditd_ledger_stalls_total"); err != nil {
		t.Error(err)
	}
}

// endingRuns is a store that has a run's end only after a few reads, as
// the loop stores it a moment after run.finished is durable.
type endingRuns struct {
	mu          sync.Mutex
	reads       int
	verdictRead bool // Reconciled was called while the run was running
}

func (r *endingRuns) Run(context.Context, string) (auditd.RunView, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reads++
	v := auditd.RunView{Run: auditd.Run{Status: auditd.RunRunning}, Counts: auditd.Counts{Items: 2, Succeeded: 1}}
	if r.reads > 3 {
		v.Status, v.Counts.Succeeded = auditd.RunSucceeded, 2
	}
	return v, nil
}

func (r *endingRuns) Reconciled(context.Context, string) (bool, []string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.verdictRead = r.reads <= 3
	return true, nil, nil
}

// The finished run's line waits for the store to have the run's end: its
// counts are the last, and its verdict is asked of a finished run, which
// the reports service keeps, rather than of a running one it would
// recount again for the next request.
func TestRunFinishedLineWaitsForTheEnd(t *testing.T) {
	var logs syncBuffer
	runs := &endingRuns{}
	telemetry.LogFinished(slog.New(slog.NewTextHandler(&logs, nil)), runs, "run-1", "succeeded")
	if runs.verdictRead {
		t.Error("the verdict was asked while the store had the run running")
	}
	if out := logs.String(); !strings.Contains(out, "succeeded=2") {
		t.Errorf("the line does not have the run's last counts:\n%s", out)
	}
}
