package api_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	bolt "go.etcd.io/bbolt"
)

// start is where every test's fake clock begins.
var start = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// env is a running API on a real bbolt file, the real ledger and token
// store, and in-memory fakes of the packages still being built.
type env struct {
	t       testing.TB
	srv     *api.Server
	handler http.Handler // srv's, held to the contract (spec)
	spec    *specCheck
	url     string
	client  *http.Client
	clock   *clock.Fake
	db      *bolt.DB
	ledger  *ledger.Ledger
	tokens  *auth.Store
	sources *fakeSources
	runs    *fakeRuns
	packs   *fakePacks
	secret  map[auth.Role]string // a live token of each role
	revoked string               // the secret of a revoked auditor token
	runID   string               // a finished run with one delivered item, "a"
}

// envOption adjusts the server before it starts.
type envOption func(*env)

// generous is a budget no test of behaviour runs out of.
var generous = limiter.BudgetConfig{Limit: limiter.MaxLimit, Window: time.Second, Burst: limiter.MaxLimit}

func withTokenBudget(cfg limiter.BudgetConfig) envOption {
	return func(e *env) { e.srv.TokenBudget = mustBudget(e.t, e.clock, cfg) }
}

func withAuthBudget(cfg limiter.BudgetConfig) envOption {
	return func(e *env) { e.srv.AuthBudget = mustBudget(e.t, e.clock, cfg) }
}

func mustBudget(tb testing.TB, c clock.Clock, cfg limiter.BudgetConfig) *api.KeyedBudget {
	tb.Helper()
	b, err := api.NewKeyedBudget(c, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, db: db, clock: clock.NewFake(start), secret: map[auth.Role]string{}}
	e.ledger, err = ledger.Open(db, ledger.Options{KeyDir: dir, Clock: e.clock})
	if err != nil {
		t.Fatal(err)
	}
	e.tokens, err = auth.NewStore(db, e.ledger)
	if err != nil {
		t.Fatal(err)
	}
	e.tokens.Now = e.clock.Now
	e.sources = newFakeSources(e.ledger)
	e.runs = newFakeRuns(e.clock)

	s := api.NewServer()
	s.Tokens, s.Sources, s.Runs, s.Ledger = e.tokens, e.sources, e.runs, e.ledger
	s.Integrity, s.Reports = fakeIntegrity{e.ledger}, fakeReports{}
	e.packs = &fakePacks{}
	s.Packs = e.packs
	s.Timelines = reports.NewTimelines(e.ledger)
	s.Clock = e.clock
	s.Logger = discardLogger()
	s.MaxRunBodyBytes = 256 << 10
	e.srv = s
	withTokenBudget(generous)(e)
	withAuthBudget(generous)(e)
	for _, o := range opts {
		o(e)
	}

	ctx := context.Background()
	for _, role := range []auth.Role{auth.RoleAdmin, auth.RoleOperator, auth.RoleAuditor} {
		_, sec, err := e.tokens.Create(ctx, string(role)+"-test", role, "test setup")
		if err != nil {
			t.Fatal(err)
		}
		e.secret[role] = sec
	}
	rev, sec, err := e.tokens.Create(ctx, "revoked-test", auth.RoleAuditor, "test setup")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.tokens.Revoke(ctx, rev.ID, "test setup"); err != nil {
		t.Fatal(err)
	}
	e.revoked = sec
	if _, err := e.sources.PutSource(ctx, auditd.Source{ID: "county", BaseURL: "https://gis.example.gov/arcgis", Limit: 10, Window: auditd.Duration(time.Second), Headers: map[string]string{"X-Api-Key": "s3cret"}}, "test setup"); err != nil {
		t.Fatal(err)
	}
	e.runID = e.runs.add(auditd.RunSucceeded, []auditd.ItemView{
		{Item: auditd.Item{Key: "a", SourceID: "county", Method: "GET", Path: "/layer/0/query"}, Result: &auditd.ItemResult{Outcome: auditd.ItemSucceeded, PayloadHash: strings.Repeat("ab", 32), Bytes: 7, Attempts: 1}},
		{Item: auditd.Item{Key: "b", SourceID: "county", Method: "GET", Path: "/layer/1/query"}},
	})
	e.runs.mu.Lock()
	e.runs.runs[e.runID].state.Run.Award.FAIN = "F-1" // the award of GET /v1/evidence.xlsx?award=F-1
	e.runs.mu.Unlock()
	for i, typ := range []auditd.EventType{auditd.EventRunStarted, auditd.EventItemQueued, auditd.EventItemQueued, auditd.EventDispatch, auditd.EventResponse, auditd.EventPayloadStaged, auditd.EventItemFinished, auditd.EventRunFinished} {
		ev := auditd.Event{Type: typ, RunID: e.runID, SourceID: "county", ItemKey: "a", Status: 200 * min(i, 1)}
		ev.SetShared(1, "") // attempt 1, as the API shows it
		if _, err := e.ledger.Append(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}

	e.spec = newSpecCheck(t, s.Handler())
	e.handler = e.spec
	hs := httptest.NewServer(e.handler)
	e.url = hs.URL
	e.client = &http.Client{}
	t.Cleanup(func() {
		hs.Close()
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := e.ledger.Close(cctx); err != nil {
			t.Errorf("close ledger: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("close db: %v", err)
		}
	})
	return e
}

// response is what a test keeps of a response.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) problem(t testing.TB) api.Problem {
	t.Helper()
	var p api.Problem
	if ct := r.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d with Content-Type %q, want application/problem+json; body %s", r.status, ct, r.body)
	}
	if err := json.Unmarshal(r.body, &p); err != nil {
		t.Fatalf("problem: %v; body %s", err, r.body)
	}
	return p
}

func (r response) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("decode %T: %v; body %s", v, err, r.body)
	}
}

// request describes one call; the zero value is an unauthenticated GET.
type request struct {
	method string
	path   string
	secret string
	body   string
	ctype  string // default application/json when body is set
	header map[string]string
}

func (e *env) do(r request) response {
	e.t.Helper()
	if r.method == "" {
		r.method = http.MethodGet
	}
	var body io.Reader
	if r.body != "" {
		body = strings.NewReader(r.body)
	}
	req, err := http.NewRequest(r.method, e.url+r.path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if r.body != "" {
		ct := r.ctype
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if r.secret != "" {
		req.Header.Set("Authorization", "Bearer "+r.secret)
	}
	for k, v := range r.header {
		req.Header.Set(k, v)
	}
	resp, err := e.client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}
}

// head returns the ledger's newest sequence number.
func (e *env) head() uint64 {
	seq, _ := e.ledger.Head()
	return seq
}

// events returns every event after seq.
func (e *env) eventsAfter(seq uint64) []auditd.Event {
	e.t.Helper()
	var out []auditd.Event
	err := e.ledger.Scan(seq+1, 0, func(ev *auditd.Event) error {
		out = append(out, *ev)
		return nil
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

// specCheck wraps the API's handler in openapi.yaml: every request the
// contract refuses must be refused (a 4xx), and every response must be
// one the contract declares (status, headers, required fields, types,
// content type). Any test that sends a request through the test server
// fails on the first answer the contract does not describe.
type specCheck struct {
	t       reporter
	router  routers.Router
	next    http.Handler
	problem *openapi3.Schema
	// requests counts the requests checked, refused those the contract
	// refuses.
	requests, refused atomic.Int64
}

func loadSpec(t testing.TB) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.Spec())
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(loader.Context); err != nil {
		t.Fatalf("openapi.yaml is not valid: %v", err)
	}
	return doc
}

func newSpecCheck(t testing.TB, next http.Handler) *specCheck {
	doc := loadSpec(t)
	doc.Servers = nil // match any host: httptest picks the port
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &specCheck{t: t, router: r, next: next, problem: doc.Components.Schemas["Problem"].Value}
}

// reporter is where specCheck reports what does not hold: the test's
// *testing.T, or a property-based check's *rapid.T.
type reporter interface {
	Errorf(format string, args ...any)
}

// teeWriter passes a response through and keeps a copy of it.
type teeWriter struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (w *teeWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *teeWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	w.body.Write(b)
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController flush the stream underneath.
func (w *teeWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *specCheck) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	reqBody, err := io.ReadAll(req.Body)
	if err != nil {
		s.t.Errorf("%s %s: read the request body: %v", req.Method, req.URL.Path, err)
		return
	}
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	route, params, routeErr := s.router.FindRoute(s.matchable(req))
	s.requests.Add(1)
	var refused error // why the contract refuses the request, if it does
	if routeErr == nil {
		// The server decodes path parameters once; the router, matching
		// the escaped path, left them escaped.
		for k, v := range params {
			if u, err := url.PathUnescape(v); err == nil {
				params[k] = u
			}
		}
		check := req.Clone(req.Context())
		check.Body = io.NopCloser(bytes.NewReader(reqBody))
		refused = openapi3filter.ValidateRequest(req.Context(), &openapi3filter.RequestValidationInput{
			Request: check, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		})
	}
	w := &teeWriter{ResponseWriter: rw}
	s.next.ServeHTTP(w, req)
	status, body := cmp.Or(w.status, http.StatusOK), w.body.Bytes()

	if routeErr != nil {
		// Only a request the API has no route for may miss the spec.
		if status != http.StatusNotFound && status != http.StatusMethodNotAllowed {
			s.t.Errorf("%s %s: %d, but the spec has no such operation: %v", req.Method, req.URL.Path, status, routeErr)
		}
		return
	}
	if refused != nil {
		s.refused.Add(1)
	}
	if refused != nil && (status < 400 || status >= 500) {
		s.t.Errorf("%s %s: the contract refuses the request (%v), but the server answered %d", req.Method, req.URL.Path, refused, status)
	}
	header := rw.Header()
	ct := header.Get("Content-Type")
	jsonBody := strings.Contains(ct, "json") && !strings.Contains(ct, "ndjson")
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  status,
		Header:  header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: !jsonBody},
	}
	in.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		s.t.Errorf("%s %s: response %d does not match openapi.yaml: %v\nbody: %.500s", req.Method, req.URL.Path, status, err, body)
	}
	if header.Get(api.ProxyAnswerHeader) == api.ProxyAnswerAuditd {
		// The contract lets a proxied answer be anything; auditd's own
		// must be one of its problems.
		s.checkProblem(req, status, header, body)
	}
}

// matchable is req as the router can match it: routed as the server
// routes it, on the escaped path (an escaped "/" inside one parameter),
// and the proxy's {path}, which holds further slashes, as one segment.
func (s *specCheck) matchable(req *http.Request) *http.Request {
	path := req.URL.EscapedPath()
	if rest, ok := strings.CutPrefix(path, "/proxy/"); ok {
		if src, p, ok := strings.Cut(rest, "/"); ok && strings.Contains(p, "/") {
			path = "/proxy/" + src + "/" + strings.ReplaceAll(p, "/", "%2F")
		}
	}
	if path == req.URL.Path {
		return req
	}
	match := req.Clone(req.Context())
	match.URL.Path = path
	return match
}

// checkProblem fails the test unless body is a Problem as the contract
// defines it, sent as application/problem+json.
func (s *specCheck) checkProblem(req *http.Request, status int, header http.Header, body []byte) {
	if ct := header.Get("Content-Type"); ct != "application/problem+json" {
		s.t.Errorf("%s %s: auditd's answer %d has Content-Type %q, want application/problem+json", req.Method, req.URL.Path, status, ct)
		return
	}
	if req.Method == http.MethodHead {
		return
	}
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		s.t.Errorf("%s %s: auditd's answer %d is not JSON: %v", req.Method, req.URL.Path, status, err)
		return
	}
	if err := s.problem.VisitJSON(v); err != nil {
		s.t.Errorf("%s %s: auditd's answer %d is not a Problem: %v\nbody: %.500s", req.Method, req.URL.Path, status, err, body)
	}
}

// fakeSources keeps sources in memory and records source.changed as the
// registry's contract says.
type fakeSources struct {
	ledger auditd.Appender
	mu     sync.Mutex
	byID   map[string]api.SourceState
}

func newFakeSources(l auditd.Appender) *fakeSources {
	return &fakeSources{ledger: l, byID: map[string]api.SourceState{}}
}

func (f *fakeSources) PutSource(ctx context.Context, src auditd.Source, principal string) (bool, error) {
	// The registry's own check, so the API's tests refuse what the
	// service refuses.
	if err := registry.CheckSource(src); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, existed := f.byID[src.ID]
	if _, err := f.ledger.Append(ctx, auditd.Event{Type: auditd.EventSourceChanged, SourceID: src.ID, Principal: principal, Detail: `{"id":"` + src.ID + `"}`}); err != nil {
		return false, err
	}
	f.byID[src.ID] = api.SourceState{Config: src, Learned: api.Learned{Limit: src.Limit, Window: src.Window.D(), Cause: "config"}}
	return !existed, nil
}

func (f *fakeSources) Source(_ context.Context, id string) (api.SourceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.byID[id]
	if !ok {
		return st, auditd.Errorf(auditd.ENOTFOUND, "Source %q not found.", id)
	}
	return st, nil
}

func (f *fakeSources) Sources(context.Context) ([]api.SourceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.SourceState
	for _, st := range f.byID {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Config.ID < out[j].Config.ID })
	return out, nil
}

func (f *fakeSources) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byID)
}

// fakeRuns keeps runs in memory.
type fakeRuns struct {
	clock *clock.Fake
	mu    sync.Mutex
	seq   int
	runs  map[string]*fakeRun
	order []string
	idem  map[string]string
}

type fakeRun struct {
	state auditd.RunView
	items []auditd.ItemView
	acked map[string]bool
	req   auditd.NewRun // what it was created from
}

// sameRequest is whether a and b ask for the same run, whoever asks: what
// the real store fingerprints for an idempotency key.
func sameRequest(a, b auditd.NewRun) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Award, b.Award) && reflect.DeepEqual(a.Items, b.Items) &&
		a.Deadline.Equal(b.Deadline) && a.Replay == b.Replay
}

// replayed is the run key made, or ECONFLICT when it made it from another
// request than nr.
func (f *fakeRuns) replayed(id string, nr auditd.NewRun) (auditd.RunView, error) {
	r := f.runs[id]
	if !sameRequest(r.req, nr) {
		return auditd.RunView{}, auditd.Errorf(auditd.ECONFLICT, "The idempotency key was first used for run %s, submitted with other contents.", id)
	}
	return r.state, nil
}

func newFakeRuns(c *clock.Fake) *fakeRuns {
	return &fakeRuns{clock: c, runs: map[string]*fakeRun{}, idem: map[string]string{}}
}

func (f *fakeRuns) add(status auditd.RunStatus, items []auditd.ItemView) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(auditd.Run{Name: "fixture", Status: status}, items)
}

func (f *fakeRuns) addLocked(r auditd.Run, items []auditd.ItemView) string {
	f.seq++
	r.ID = fmt.Sprintf("01J%023d", f.seq)
	r.CreatedAt = f.clock.Now()
	r.ItemCount = len(items)
	r.ConfigHash, r.CodeVersion, r.HeadAtStart = "cfg", "test", strings.Repeat("0", 64)
	f.runs[r.ID] = &fakeRun{state: auditd.RunView{Run: r, Counts: auditd.Counts{Items: len(items), Pending: len(items)}}, items: items, acked: map[string]bool{}}
	f.order = append(f.order, r.ID)
	return r.ID
}

func (f *fakeRuns) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs)
}

func (f *fakeRuns) CreateRun(_ context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := f.idem[nr.IdempotencyKey]; ok && nr.IdempotencyKey != "" {
		st, err := f.replayed(id, nr)
		return st, false, err
	}
	// As the fetch loop does: credentials in paths are redacted before
	// the run is stored and fingerprinted.
	nr.Items = slices.Clone(nr.Items)
	items := make([]auditd.ItemView, len(nr.Items))
	for i := range nr.Items {
		nr.Items[i].Path = redact.New(nil).URL(nr.Items[i].Path)
		items[i] = auditd.ItemView{Item: nr.Items[i]}
	}
	id := f.addLocked(auditd.Run{Name: nr.Name, Award: nr.Award, Status: auditd.RunRunning, InitiatedBy: nr.Principal, Deadline: nr.Deadline, Replay: nr.Replay,
		Mode: nr.Mode, IdleTimeout: auditd.Duration(nr.IdleTimeout), Open: nr.Open}, items)
	f.runs[id].req = nr
	if nr.IdempotencyKey != "" {
		f.idem[nr.IdempotencyKey] = id
	}
	return f.runs[id].state, true, nil
}

func (f *fakeRuns) RunByIdempotencyKey(_ context.Context, nr auditd.NewRun) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := f.idem[nr.IdempotencyKey]; ok {
		return f.replayed(id, nr)
	}
	return auditd.RunView{}, auditd.Errorf(auditd.ENOTFOUND, "no run with that key")
}

func (f *fakeRuns) get(id string) (*fakeRun, error) {
	r, ok := f.runs[id]
	if !ok {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "Run %q not found.", id)
	}
	return r, nil
}

func (f *fakeRuns) Run(_ context.Context, id string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	return r.state, nil
}

func (f *fakeRuns) Runs(_ context.Context, flt auditd.RunFilter) ([]auditd.RunView, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []auditd.RunView
	skipping := flt.After != ""
	for i := len(f.order) - 1; i >= 0; i-- {
		r := f.runs[f.order[i]]
		if skipping {
			skipping = r.state.Run.ID != flt.After
			continue
		}
		if flt.Status != "" && r.state.Run.Status != flt.Status {
			continue
		}
		if flt.FAIN != "" && r.state.Run.Award.FAIN != flt.FAIN {
			continue
		}
		if len(out) == flt.Limit {
			return out, out[len(out)-1].Run.ID, nil
		}
		out = append(out, r.state)
	}
	return out, "", nil
}

func (f *fakeRuns) CancelRun(_ context.Context, id, _ string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if r.state.Run.Status.Terminal() {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s is %s.", id, r.state.Run.Status)
	}
	r.state.Run.Status = auditd.RunCancelled
	return r.state, nil
}

// AddRunItems adds a page to an open run, as the fetch loop does: a key
// the run has is refused, naming it.
func (f *fakeRuns) AddRunItems(_ context.Context, id string, items []auditd.Item) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if !r.state.Run.Open {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s takes no more items.", id)
	}
	for i, it := range items {
		for _, have := range r.items {
			if have.Key == it.Key {
				return auditd.RunView{}, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d].key", i), Message: "repeated"}
			}
		}
	}
	for _, it := range items {
		r.items = append(r.items, auditd.ItemView{Item: it})
	}
	r.state.Run.ItemCount = len(r.items)
	return r.state, nil
}

func (f *fakeRuns) FinishRun(_ context.Context, id, _ string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if r.state.Run.Open {
		r.state.Run.Open = false
		return r.state, nil
	}
	if r.state.Run.Mode != auditd.RunProxy || r.state.Run.Status.Terminal() {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s is not a running proxy-mode run.", id)
	}
	r.state.Run.Status = auditd.RunSucceeded
	return r.state, nil
}

func (f *fakeRuns) Acknowledge(_ context.Context, runID string, keys []string, _ string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return 0, err
	}
	for i, k := range keys {
		ok := false
		for _, it := range r.items {
			ok = ok || (it.Item.Key == k && it.Result != nil && it.Result.PayloadHash != "")
		}
		if !ok {
			return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: "not a delivered item"}
		}
	}
	n := 0
	for _, k := range keys {
		if !r.acked[k] {
			r.acked[k] = true
			n++
		}
	}
	return n, nil
}

func (f *fakeRuns) Items(_ context.Context, runID, after string, limit int) ([]auditd.ItemView, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return nil, "", err
	}
	i := 0
	if after != "" {
		for i = 0; i < len(r.items) && r.items[i].Item.Key != after; i++ {
		}
		if i == len(r.items) {
			return nil, "", &auditd.Error{Code: auditd.EINVALID, Field: "cursor", Message: "cursor names no item of this run"}
		}
		i++
	}
	out := r.items[i:]
	if len(out) > limit {
		return out[:limit], out[limit-1].Item.Key, nil
	}
	return out, "", nil
}

func (f *fakeRuns) Item(_ context.Context, runID, key string) (auditd.ItemView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return auditd.ItemView{}, err
	}
	for _, it := range r.items {
		if it.Item.Key == key {
			return it, nil
		}
	}
	return auditd.ItemView{}, auditd.Errorf(auditd.ENOTFOUND, "Item %q not found.", key)
}

func (f *fakeRuns) Payload(ctx context.Context, runID, key string) (io.ReadCloser, error) {
	it, err := f.Item(ctx, runID, key)
	if err != nil {
		return nil, err
	}
	if it.Result == nil || it.Result.PayloadHash == "" {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "no payload")
	}
	return io.NopCloser(strings.NewReader("payload")), nil
}

// fakeIntegrity answers from the real ledger's head.
type fakeIntegrity struct{ l *ledger.Ledger }

func (f fakeIntegrity) Verify(context.Context) (api.Verification, error) {
	seq, hash := f.l.Head()
	return api.Verification{OK: true, Events: seq, HeadSeq: seq, HeadHash: fmt.Sprintf("%x", hash)}, nil
}

func (f fakeIntegrity) Prove(_ context.Context, seq uint64) (api.Proof, error) {
	head, _ := f.l.Head()
	if seq > head {
		return api.Proof{}, auditd.Errorf(auditd.ENOTFOUND, "No event %d.", seq)
	}
	return api.Proof{Seq: seq, LeafHash: "bGVhZg==", TreeSize: head, RootHash: "cm9vdA==", Hashes: []string{}, Checkpoint: "note"}, nil
}

// fakeReports writes small stand-ins for the real documents.
type fakeReports struct{}

func (fakeReports) WriteReconciliation(_ context.Context, w io.Writer, runID, format string) error {
	var err error
	switch format {
	case "json":
		_, err = fmt.Fprintf(w, `{"run_id":%[1]q,"run":{"id":%[1]q,"status":"succeeded","first_seq":1,"last_seq":9},"balanced":true,"counts":{"queued":2},`+
			`"checks":[{"id":"R1","scope":"total","description":"items queued = finished + pending","status":"pass","expected":2,"actual":2,"difference":0,"pass":true}],`+
			`"sources":[],"control":[]}`, runID)
	case "csv":
		_, err = io.WriteString(w, "id,scope,expected,actual,difference,pass\nR1,total,2,2,0,true\n")
	default:
		_, err = io.WriteString(w, "PK\x03\x04 fake workbook")
	}
	return err
}

func (fakeReports) WriteRunEvidence(_ context.Context, w io.Writer, _ string) error {
	_, err := io.WriteString(w, "PK\x03\x04 fake workbook")
	return err
}

func (fakeReports) WriteAwardEvidence(_ context.Context, w io.Writer, _ auditd.RunFilter) error {
	_, err := io.WriteString(w, "PK\x03\x04 fake workbook")
	return err
}

// fakePacks writes a stand-in for a pack and keeps what it was asked for.
type fakePacks struct {
	mu    sync.Mutex
	calls []packCall
}

type packCall struct {
	runIDs  []string
	filters string
}

func (f *fakePacks) WritePack(_ context.Context, w io.Writer, runIDs []string, filters string) error {
	f.mu.Lock()
	f.calls = append(f.calls, packCall{slices.Clone(runIDs), filters})
	f.mu.Unlock()
	_, err := io.WriteString(w, "PK\x03\x04 fake pack")
	return err
}

func (f *fakePacks) last() (packCall, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return packCall{}, 0
	}
	return f.calls[len(f.calls)-1], len(f.calls)
}
