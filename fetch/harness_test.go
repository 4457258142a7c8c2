package fetch_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"path/filepath"
	"runtime/metrics"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/sim"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// harness is a whole fetch loop on real parts (a bbolt file, the ledger,
// registry, limiter, staging) against the simulator's upstreams on httptest
// servers, all on one fake clock.
type harness struct {
	clk    *clock.Fake
	db     *bolt.DB
	ledger *ledger.Ledger
	reg    *registry.Registry
	lim    *limiter.Limiter
	stage  *staging.Store
	runs   *runs.Store
	loop   *fetch.Loop
	sim    *sim.Sim
	urls   map[string]string // upstream name -> base URL
	dir    string            // the data directory
	full   atomic.Bool       // the disk refuses the ledger's writes (ledger.Options.WriteFault)
	// fault, when set, is asked before each commit whether the disk
	// refuses it (after full).
	fault atomic.Pointer[func() error]
}

var epoch = time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC)

func newHarness(tb testing.TB, scenario string) *harness {
	tb.Helper()
	sc, err := sim.ParseScenario([]byte(scenario))
	if err != nil {
		tb.Fatal(err)
	}
	clk := clock.NewFake(epoch)
	s, err := sim.New(sc, clk)
	if err != nil {
		tb.Fatal(err)
	}
	h := &harness{clk: clk, sim: s, urls: map[string]string{}}
	for _, name := range s.Upstreams() {
		srv := httptest.NewServer(s.Handler(name))
		tb.Cleanup(srv.Close)
		h.urls[name] = srv.URL
	}
	h.open(tb, tb.TempDir())
	return h
}

// open opens the data directory dir and starts a loop on it.
func (h *harness) open(tb testing.TB, dir string) {
	tb.Helper()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	// These tests are about pacing, not durability (the crash test is):
	// skip fsync so commits do not dominate the run time.
	db.NoSync = true
	var loopp atomic.Pointer[fetch.Loop]
	led, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: h.clk,
		WriteFault: func() error {
			if h.full.Load() {
				return syscall.ENOSPC
			}
			if f := h.fault.Load(); f != nil {
				return (*f)()
			}
			return nil
		},
		OnStall: func(err error) {
			if l := loopp.Load(); l != nil {
				l.Stalled(err)
			}
		},
	})
	if err != nil {
		tb.Fatal(err)
	}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: h.clk, DefaultLimit: 10, DefaultWindow: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	stage, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		tb.Fatal(err)
	}
	store, err := runs.Open(db, runs.Options{Ledger: led, Payloads: stage, Pace: fetch.Pace(reg), Clock: h.clk, Stalled: led.Stalled})
	if err != nil {
		tb.Fatal(err)
	}
	lim := limiter.New(h.clk)
	loop, err := fetch.New(fetch.Config{
		Ledger: led, Runs: store, Registry: reg, Limiter: lim, Staging: stage,
		Clock: h.clk, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		tb.Fatal(err)
	}
	loopp.Store(loop)
	if err := loop.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	h.db, h.ledger, h.reg, h.lim, h.stage, h.runs, h.loop, h.dir = db, led, reg, lim, stage, store, loop, dir
	tb.Cleanup(func() { h.close(tb) })
}

func (h *harness) close(tb testing.TB) {
	if h.loop == nil {
		return
	}
	ctx := context.Background()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() { // let draining requests' timers fire
		defer close(stopped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			h.step()
		}
	}()
	err := h.loop.Close(ctx)
	close(stop)
	<-stopped // before anything, a reopen included, changes h
	if err != nil {
		tb.Errorf("close loop: %v", err)
	}
	if err := h.ledger.Close(ctx); err != nil {
		tb.Errorf("close ledger: %v", err)
	}
	h.db.Close()
	h.loop = nil
}

// source registers a source pointing at the named upstream.
func (h *harness) source(tb testing.TB, src auditd.Source, upstream string) {
	tb.Helper()
	src.BaseURL = h.urls[upstream]
	if _, err := h.loop.PutSource(context.Background(), "test", src); err != nil {
		tb.Fatalf("put source %s: %v", src.ID, err)
	}
}

// drive moves the fake clock to the next pending timer whenever the loop
// has gone quiet, until done reports true or steps steps were taken.
// Pacing is all on the fake clock: a run that waits minutes of upstream time
// finishes in milliseconds.
func (h *harness) drive(done func() bool, steps int) bool {
	for range steps {
		if done() {
			return true
		}
		h.step()
	}
	return done()
}

// step waits until the loop has gone quiet, then fires the earliest timer.
// Quiet means nothing moved for a while (no event appended, no request
// arriving upstream, no timer added) and no goroutine of the process is
// ready to run but for this one. Advancing earlier would let fake time run
// ahead of work still in progress: a worker that a timer woke, not yet
// scheduled on a busy machine, would be admitted at one fake time and
// stamped or heard upstream at a later one. Stillness alone is not enough
// when other test packages share the CPU (go test ./... runs them side by
// side): a runnable goroutine can wait there for longer than the stillness
// takes. A goroutine that never blocks would keep the process from idling:
// after idleWait, stillness alone does.
func (h *harness) step() {
	type state struct {
		head     uint64
		pending  int
		received int
	}
	look := func() state {
		seq, _ := h.ledger.Head()
		n := 0
		for _, up := range h.sim.Upstreams() {
			n += h.sim.Stats(up).Received
		}
		return state{seq, h.clk.Pending(), n}
	}
	sched := []metrics.Sample{
		{Name: "/sched/goroutines/runnable:goroutines"},
		{Name: "/sched/goroutines/running:goroutines"},
		{Name: "/sched/goroutines/not-in-go:goroutines"},
	}
	idle := func() bool {
		metrics.Read(sched)
		for _, m := range sched {
			if m.Value.Kind() != metrics.KindUint64 {
				return true // a runtime without these metrics: stillness alone
			}
		}
		return sched[0].Value.Uint64() == 0 && sched[1].Value.Uint64() <= 1 && sched[2].Value.Uint64() == 0
	}
	const idleWait = 2 * time.Second
	last, still, since := look(), 0, time.Now()
	for still < 10 || !idle() && time.Since(since) < idleWait {
		time.Sleep(100 * time.Microsecond)
		if now := look(); now == last {
			still++
		} else {
			last, still, since = now, 0, time.Now()
		}
	}
	if next, ok := h.clk.Next(); ok {
		h.clk.Set(next)
	}
}

// finish drives the clock until run id reaches a terminal status.
func (h *harness) finish(tb testing.TB, id string) auditd.RunView {
	tb.Helper()
	var v auditd.RunView
	ok := h.drive(func() bool {
		var err error
		v, err = h.runs.Run(context.Background(), id)
		if err != nil {
			tb.Fatal(err)
		}
		return v.Status.Terminal()
	}, 200_000)
	if !ok {
		tb.Fatalf("run %s did not finish: %+v", id, v.Counts)
	}
	return v
}

// events returns every event of run id.
func (h *harness) events(tb testing.TB, id string) []auditd.Event {
	tb.Helper()
	var out []auditd.Event
	if err := h.ledger.ScanRun(id, 0, func(e *auditd.Event) error {
		out = append(out, *e)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return out
}

func count(events []auditd.Event, typ auditd.EventType, source string) int {
	n := 0
	for _, e := range events {
		if e.Type == typ && (source == "" || e.SourceID == source) {
			n++
		}
	}
	return n
}

// reconcile recounts run id from the ledger with the reports package and
// fails the test unless every applicable identity holds: the events the
// loop wrote are exactly what docs/EVENTS.md promises.
func (h *harness) reconcile(tb testing.TB, id string) {
	tb.Helper()
	r := reports.NewReconciler(h.ledger)
	var buf []byte
	r.Hash = func(prev [32]byte, e *auditd.Event) (sum [32]byte) {
		sum, buf = ledger.HashEvent(buf, prev, e)
		return sum
	}
	r.Payloads = h.stage
	rep, err := r.Reconcile(context.Background(), id, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if !rep.Balanced {
		for _, c := range rep.Checks {
			if c.Status == "fail" {
				tb.Errorf("%s %s: expected %d, actual %d, offending %v %s", c.ID, c.Description, c.Expected, c.Actual, c.Offending, c.Note)
			}
		}
		for _, s := range rep.Sources {
			for _, c := range s.Checks {
				if c.Status == "fail" {
					tb.Errorf("source %s: %s offending %v", s.SourceID, c.ID, c.Offending)
				}
			}
		}
	}
}
