package fetch_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// proxyEnv is the whole service in one process on the real clock, as
// cmd/auditd wires it for the proxy route: the API in front of the fetch
// loop, over a real bbolt file.
type proxyEnv struct {
	t      testing.TB
	db     *bolt.DB
	ledger *ledger.Ledger
	reg    *registry.Registry
	stage  *staging.Store
	store  *runs.Store
	loop   *fetch.Loop
	lim    *limiter.Limiter
	srv    *httptest.Server
	token  string // an operator's
	admin  string
	logs   *bytes.Buffer
}

// proxyEnvOptions adjust a proxyEnv.
type proxyEnvOptions struct {
	maxAttempts  int
	noSync       bool // fsync off: for tests of behaviour, not of durability
	startLimit   int  // the registry's start limit per second; default 1000
	compactEvery int  // the loop's CompactEvery; default its default
	client       *http.Client
	// full, when set, is a disk that refuses the ledger's writes while it
	// holds true (ledger.Options.WriteFault).
	full *atomic.Bool
}

func newProxyEnv(tb testing.TB, o proxyEnvOptions) *proxyEnv {
	tb.Helper()
	return newProxyEnvWith(tb, o, 0)
}

// newProxyEnvWith is newProxyEnv with the loop's staging cap (0: default).
func newProxyEnvWith(tb testing.TB, o proxyEnvOptions, maxBody int64) *proxyEnv {
	tb.Helper()
	dir := tb.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	db.NoSync = o.noSync
	e := &proxyEnv{t: tb, db: db, logs: &bytes.Buffer{}}
	clk := clock.Real{}
	lopts := ledger.Options{KeyDir: dir, Clock: clk}
	if o.full != nil {
		lopts.WriteFault = func() error {
			if o.full.Load() {
				return syscall.ENOSPC
			}
			return nil
		}
	}
	if e.ledger, err = ledger.Open(db, lopts); err != nil {
		tb.Fatal(err)
	}
	if o.startLimit == 0 {
		o.startLimit = 1000
	}
	if e.reg, err = registry.Open(db, registry.Options{Ledger: e.ledger, Clock: clk, DefaultLimit: o.startLimit, DefaultWindow: time.Second}); err != nil {
		tb.Fatal(err)
	}
	if e.stage, err = staging.Open(db, filepath.Join(dir, "payloads")); err != nil {
		tb.Fatal(err)
	}
	if e.store, err = runs.Open(db, runs.Options{Ledger: e.ledger, Payloads: e.stage, Clock: clk}); err != nil {
		tb.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(e.logs, nil))
	e.lim = limiter.New(clk)
	if e.loop, err = fetch.New(fetch.Config{Ledger: e.ledger, Runs: e.store, Registry: e.reg, Limiter: e.lim,
		Staging: e.stage, Clock: clk, Logger: log, MaxAttempts: o.maxAttempts, Client: o.client, MaxBodyBytes: maxBody,
		CompactEvery: o.compactEvery}); err != nil {
		tb.Fatal(err)
	}
	if err := e.loop.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tokens, err := auth.NewStore(db, e.ledger)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if _, e.token, err = tokens.Create(ctx, "pipeline", auth.RoleOperator, "test"); err != nil {
		tb.Fatal(err)
	}
	if _, e.admin, err = tokens.Create(ctx, "admin", auth.RoleAdmin, "test"); err != nil {
		tb.Fatal(err)
	}
	s := api.NewServer()
	s.Tokens, s.Ledger, s.Logger = tokens, e.ledger, log
	s.Runs = proxyRunsAPI{e.store, e.loop}
	s.Sources = proxySourcesAPI{e.reg, e.loop}
	reps := reports.NewService(e.ledger, e.store)
	reps.Payloads = e.stage
	s.Reports = reps
	s.Proxy = e.loop
	s.TokenBudget, _ = api.NewKeyedBudget(clk, limiter.BudgetConfig{Limit: limiter.MaxLimit, Window: time.Second, Burst: limiter.MaxLimit})
	e.srv = httptest.NewServer(s.Handler())
	tb.Cleanup(e.close)
	return e
}

func (e *proxyEnv) close() {
	e.srv.Close()
	if err := e.loop.Close(context.Background()); err != nil {
		e.t.Errorf("close loop: %v", err)
	}
	if err := e.ledger.Close(context.Background()); err != nil {
		e.t.Errorf("close ledger: %v", err)
	}
	e.db.Close()
}

// proxyRunsAPI is cmd/auditd's runsAPI.
type proxyRunsAPI struct {
	*runs.Store
	loop *fetch.Loop
}

func (a proxyRunsAPI) CreateRun(ctx context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	return a.loop.Submit(ctx, nr)
}

func (a proxyRunsAPI) CancelRun(ctx context.Context, id, _ string) (auditd.RunView, error) {
	return a.loop.Cancel(ctx, id)
}

func (a proxyRunsAPI) FinishRun(ctx context.Context, id, principal string) (auditd.RunView, error) {
	return a.loop.Finish(ctx, id, principal)
}

func (a proxyRunsAPI) AddRunItems(ctx context.Context, id string, items []auditd.Item) (auditd.RunView, error) {
	return a.loop.AddItems(ctx, id, items)
}

func (a proxyRunsAPI) AddRunItemsStream(ctx context.Context, id string, next func() ([]auditd.Item, error)) (auditd.RunView, error) {
	return a.loop.AddItemsStream(ctx, id, next)
}

// proxySourcesAPI is as much of cmd/auditd's sourcesAPI as these tests
// need: putting a source, and whether one exists.
type proxySourcesAPI struct {
	reg  *registry.Registry
	loop *fetch.Loop
}

func (a proxySourcesAPI) PutSource(ctx context.Context, src auditd.Source, principal string) (bool, error) {
	return a.loop.PutSource(ctx, principal, src)
}

func (a proxySourcesAPI) Source(_ context.Context, id string) (api.SourceState, error) {
	src, err := a.reg.GetSource(id)
	return api.SourceState{Config: src}, err
}

func (a proxySourcesAPI) Sources(context.Context) ([]api.SourceState, error) { return nil, nil }

// source registers a source.
func (e *proxyEnv) source(src auditd.Source) {
	e.t.Helper()
	if _, err := e.loop.PutSource(context.Background(), "test", src); err != nil {
		e.t.Fatal(err)
	}
}

// call sends an API request with the operator's token and decodes a JSON
// answer into out.
func (e *proxyEnv) call(method, path, body string, out any) int {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			e.t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// proxyRun creates a proxy-mode run and returns its id.
func (e *proxyEnv) proxyRun(extra string) string {
	e.t.Helper()
	var run auditd.RunView
	if st := e.call("POST", "/v1/runs", `{"name":"proxied","mode":"proxy"`+extra+`}`, &run); st != 201 {
		e.t.Fatalf("create proxy run: %d", st)
	}
	return run.ID
}

// finish finishes run id and returns it.
func (e *proxyEnv) finish(id string) auditd.RunView {
	e.t.Helper()
	var run auditd.RunView
	if st := e.call("POST", "/v1/runs/"+id+"/finish", "", &run); st != 200 {
		e.t.Fatalf("finish run %s: %d", id, st)
	}
	return run
}

// proxied is a response of the proxy route.
type proxiedResp struct {
	status int
	header http.Header
	body   []byte
}

// get sends a request through the proxy as a pipeline would.
func (e *proxyEnv) send(method, runID, path string, body []byte, header map[string]string) proxiedResp {
	e.t.Helper()
	req, _ := http.NewRequest(method, e.srv.URL+path, bytes.NewReader(body))
	if body == nil {
		req.Body = nil
	}
	req.Header.Set("Proxy-Authorization", "Bearer "+e.token)
	if runID != "" {
		req.Header.Set("Auditd-Run", runID)
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return proxiedResp{resp.StatusCode, resp.Header, b}
}

func (e *proxyEnv) events(id string) []auditd.Event {
	e.t.Helper()
	var out []auditd.Event
	if err := e.ledger.ScanRun(id, 0, func(ev *auditd.Event) error {
		out = append(out, *ev)
		return nil
	}); err != nil {
		e.t.Fatal(err)
	}
	return out
}

// reconcile fails the test unless run id reconciles.
func (e *proxyEnv) reconcile(id string) *reports.Report {
	e.t.Helper()
	r := reports.NewReconciler(e.ledger)
	var buf []byte
	r.Hash = func(prev [32]byte, ev *auditd.Event) (sum [32]byte) {
		sum, buf = ledger.HashEvent(buf, prev, ev)
		return sum
	}
	r.Payloads = e.stage
	rep, err := r.Reconcile(context.Background(), id, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if !rep.Balanced {
		for _, c := range rep.Checks {
			if c.Status == "fail" {
				e.t.Errorf("%s %s: expected %d, actual %d, offending %v %s", c.ID, c.Description, c.Expected, c.Actual, c.Offending, c.Note)
			}
		}
	}
	return rep
}

func bufioReader(r io.Reader) *bufio.Reader { return bufio.NewReader(r) }
