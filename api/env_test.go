package api_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
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
	withFleet(&fakeFleet{})(e)    // a fleet of two nodes (fleet_test.go)
	s.FleetView = fakeFleetView{} // their shared budgets (fleet_sources_test.go)
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
