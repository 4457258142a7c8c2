package api_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// TestExportsAreLedgerEvents: every export appends one export.downloaded
// event, and every read of a reconciliation's JSON one report.viewed,
// naming the token and the ledger head before it.
func TestExportsAreLedgerEvents(t *testing.T) {
	e := newEnv(t)
	aud := e.secret[auth.RoleAuditor]
	tok, err := e.tokens.Authenticate(aud)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, path, ctype, what string
		typ                     auditd.EventType
	}{
		{"ReconciliationJSON", "/v1/runs/" + e.runID + "/reconciliation", "application/json", `"what":"reconciliation"`, auditd.EventViewed},
		{"ReconciliationCSV", "/v1/runs/" + e.runID + "/reconciliation?format=csv", "text/csv; charset=utf-8", `"format":"csv"`, auditd.EventExport},
		{"ReconciliationXLSX", "/v1/runs/" + e.runID + "/reconciliation?format=xlsx", api.MIMEXLSX, `"format":"xlsx"`, auditd.EventExport},
		{"RunEvidence", "/v1/runs/" + e.runID + "/evidence.xlsx", api.MIMEXLSX, `"what":"evidence"`, auditd.EventExport},
		{"AwardEvidence", "/v1/evidence.xlsx?award=F-1&from=2026-01-01", api.MIMEXLSX, `"award":"F-1"`, auditd.EventExport},
		{"RunPack", "/v1/runs/" + e.runID + "/evidence-pack.zip", api.MIMEZIP, `"what":"evidence-pack"`, auditd.EventExport},
		{"AwardPack", "/v1/evidence-pack.zip?award=F-1&from=2026-01-01", api.MIMEZIP, `"award":"F-1"`, auditd.EventExport},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			head := e.head()
			r := e.do(request{path: tc.path, secret: aud})
			if r.status != http.StatusOK || r.header.Get("Content-Type") != tc.ctype {
				t.Fatalf("%d %q, want 200 %q", r.status, r.header.Get("Content-Type"), tc.ctype)
			}
			evs := e.eventsAfter(head)
			if len(evs) != 1 {
				t.Fatalf("%d events, want 1 %s", len(evs), tc.typ)
			}
			ev := evs[0]
			if ev.Type != tc.typ || ev.Principal != tok.Principal() || !strings.Contains(ev.Detail, tc.what) || ev.Head == "" {
				t.Errorf("event %s principal %q detail %s head %q", ev.Type, ev.Principal, ev.Detail, ev.Head)
			}
		})
	}
}

// TestTokenLifecycle: create shows the secret once, the secret works, list
// never shows it, revoke stops it, and each change is a ledger event naming
// the admin who made it.
func TestTokenLifecycle(t *testing.T) {
	e := newEnv(t)
	admin := e.secret[auth.RoleAdmin]
	adminTok, err := e.tokens.Authenticate(admin)
	if err != nil {
		t.Fatal(err)
	}
	head := e.head()
	r := e.do(request{method: "POST", path: "/v1/tokens", secret: admin, body: `{"name":"ci-pipeline","role":"operator"}`})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var created struct {
		ID, Secret string
		Role       auth.Role
	}
	r.decode(t, &created)
	if !strings.HasPrefix(created.Secret, auth.SecretPrefix) || created.Role != auth.RoleOperator {
		t.Fatalf("created %+v", created)
	}
	if r := e.do(request{path: "/v1/runs", secret: created.Secret}); r.status != http.StatusOK {
		t.Fatalf("new token: %d", r.status)
	}
	r = e.do(request{path: "/v1/tokens", secret: admin})
	if bytes.Contains(r.body, []byte(created.Secret)) || bytes.Contains(r.body, []byte(`"secret"`)) || bytes.Contains(r.body, []byte(`"hash"`)) {
		t.Fatalf("token list leaks a secret or hash: %s", r.body)
	}
	if r := e.do(request{method: "DELETE", path: "/v1/tokens/" + created.ID, secret: admin}); r.status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.status, r.body)
	}
	if r := e.do(request{path: "/v1/runs", secret: created.Secret}); r.status != http.StatusUnauthorized {
		t.Fatalf("revoked token: %d, want 401", r.status)
	}
	// Revoking again changes nothing and records nothing.
	if r := e.do(request{method: "DELETE", path: "/v1/tokens/" + created.ID, secret: admin}); r.status != http.StatusNoContent {
		t.Fatalf("second revoke: %d", r.status)
	}
	evs := e.eventsAfter(head)
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2 token.changed", len(evs))
	}
	for i, action := range []string{`"action":"created"`, `"action":"revoked"`} {
		ev := evs[i]
		if ev.Type != auditd.EventTokenChanged || ev.Principal != adminTok.Principal() || !strings.Contains(ev.Detail, action) || strings.Contains(ev.Detail, created.Secret) {
			t.Errorf("event %d: %s principal %q detail %s", i, ev.Type, ev.Principal, ev.Detail)
		}
	}
}

// TestLastAdminCannotBeRevoked keeps the service administrable.
func TestLastAdminCannotBeRevoked(t *testing.T) {
	e := newEnv(t)
	admin := e.secret[auth.RoleAdmin]
	tok, err := e.tokens.Authenticate(admin)
	if err != nil {
		t.Fatal(err)
	}
	head := e.head()
	if r := e.do(request{method: "DELETE", path: "/v1/tokens/" + tok.ID, secret: admin}); r.status != http.StatusConflict {
		t.Fatalf("%d, want 409", r.status)
	}
	if e.head() != head {
		t.Error("a refused revoke wrote to the ledger")
	}
}

// TestEvents pages a run's events with filters, and streams them as NDJSON.
func TestEvents(t *testing.T) {
	e := newEnv(t)
	aud := e.secret[auth.RoleAuditor]
	base := "/v1/runs/" + e.runID + "/events"

	var seen []uint64
	path := base + "?limit=3"
	for pages := 0; path != ""; pages++ {
		if pages > 10 {
			t.Fatal("pagination does not end")
		}
		var page struct {
			Events []struct {
				Seq  uint64
				Type auditd.EventType
				Hash string
			}
			NextCursor string `json:"next_cursor"`
		}
		e.do(request{path: path, secret: aud}).decode(t, &page)
		for _, ev := range page.Events {
			seen = append(seen, ev.Seq)
		}
		path = ""
		if page.NextCursor != "" {
			path = base + "?limit=3&cursor=" + page.NextCursor
		}
	}
	if len(seen) != 8 {
		t.Fatalf("paged %d events, want the fixture's 8: %v", len(seen), seen)
	}
	for i := 1; i < len(seen); i++ {
		if seen[i] <= seen[i-1] {
			t.Fatalf("events out of order or repeated: %v", seen)
		}
	}

	var filtered struct {
		Events []struct{ Type auditd.EventType }
	}
	e.do(request{path: base + "?type=item.queued&type=dispatch", secret: aud}).decode(t, &filtered)
	if len(filtered.Events) != 3 {
		t.Errorf("type filter: %d events, want 2 item.queued and 1 dispatch", len(filtered.Events))
	}

	r := e.do(request{path: base + "?source=county", secret: aud, header: map[string]string{"Accept": "application/x-ndjson"}})
	if r.status != http.StatusOK || r.header.Get("Content-Type") != api.MIMENDJSON {
		t.Fatalf("stream: %d %q", r.status, r.header.Get("Content-Type"))
	}
	sc := bufio.NewScanner(bytes.NewReader(r.body))
	lines := 0
	for sc.Scan() {
		var ev struct {
			Seq  uint64
			Hash string
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil || ev.Seq == 0 || len(ev.Hash) != 64 {
			t.Fatalf("line %d: %q (%v)", lines, sc.Text(), err)
		}
		lines++
	}
	if lines != 8 {
		t.Errorf("stream: %d lines, want 8", lines)
	}
}

// TestSourcesRedactHeaders: header values are credentials; no response
// shows them.
func TestSourcesRedactHeaders(t *testing.T) {
	e := newEnv(t)
	admin := e.secret[auth.RoleAdmin]
	r := e.do(request{method: "PUT", path: "/v1/sources/city", secret: admin, body: `{"base_url":"https://city.example.gov","headers":{"Authorization":"Bearer upstream-secret"},"limit":10,"window":"1m"}`})
	if r.status != http.StatusCreated || r.header.Get("Location") != "/v1/sources/city" {
		t.Fatalf("create: %d %q %s", r.status, r.header.Get("Location"), r.body)
	}
	for _, path := range []string{"/v1/sources/city", "/v1/sources"} {
		r := e.do(request{path: path, secret: e.secret[auth.RoleAuditor]})
		if r.status != http.StatusOK || bytes.Contains(r.body, []byte("upstream-secret")) || bytes.Contains(r.body, []byte("s3cret")) || !bytes.Contains(r.body, []byte("[redacted]")) {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
	if r := e.do(request{method: "PUT", path: "/v1/sources/city", secret: admin, body: `{"id":"city","base_url":"https://city.example.gov"}`}); r.status != http.StatusOK {
		t.Errorf("replace: %d, want 200", r.status)
	}
	// A source stored before base URLs were checked is still shown without
	// its credentials.
	e.sources.mu.Lock()
	e.sources.byID["old"] = api.SourceState{Config: auditd.Source{ID: "old", BaseURL: "http://u:OLDPW@old.example/?sq=OLDSQ", SecretQuery: []string{"sq"}}}
	e.sources.mu.Unlock()
	for _, path := range []string{"/v1/sources/old", "/v1/sources"} {
		r := e.do(request{path: path, secret: e.secret[auth.RoleAuditor]})
		if r.status != http.StatusOK || bytes.Contains(r.body, []byte("OLDPW")) || bytes.Contains(r.body, []byte("OLDSQ")) {
			t.Errorf("GET %s: %d %s", path, r.status, r.body)
		}
	}
}

// TestSourceProxyRewriteURLs: a source's proxy.rewrite_urls is taken over
// the API and shown back, as the contract declares it.
func TestSourceProxyRewriteURLs(t *testing.T) {
	e := newEnv(t)
	admin := e.secret[auth.RoleAdmin]
	r := e.do(request{method: "PUT", path: "/v1/sources/wfs", secret: admin, body: `{"base_url":"https://gis.example.gov","proxy":{"serve_stale":true,"rewrite_urls":false}}`})
	if r.status != http.StatusCreated {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	r = e.do(request{path: "/v1/sources/wfs", secret: e.secret[auth.RoleAuditor]})
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`"rewrite_urls":false`)) {
		t.Fatalf("GET: %d %s, want proxy.rewrite_urls false", r.status, r.body)
	}
}

// TestUIFallback: paths the API does not claim go to the UI handler; /v1
// paths never do.
func TestUIFallback(t *testing.T) {
	e := newEnv(t)
	e.srv.UI = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ui:" + r.URL.Path)) })
	rec := httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 200 || rec.Body.String() != "ui:/" {
		t.Errorf("GET /: %d %q", rec.Code, rec.Body)
	}
	rec = httptest.NewRecorder()
	e.srv.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/v1/unknown", nil))
	if rec.Code != 404 || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("GET /v1/unknown: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
}

// TestOpenShutdown serves on a real listener with the configured timeouts
// and shuts down gracefully.
func TestOpenShutdown(t *testing.T) {
	s := api.NewServer()
	s.Addr = "127.0.0.1:0"
	s.Logger = discardLogger()
	if err := s.Open(); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(s.URL() + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("healthz: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if _, err := http.Get(s.URL() + "/healthz"); err == nil {
		t.Fatal("still serving after Shutdown")
	}
}

// TestMetrics: the API's own registry, in Prometheus text format.
func TestMetrics(t *testing.T) {
	e := newEnv(t)
	e.do(request{path: "/v1/runs", secret: e.secret[auth.RoleAuditor]})
	r := e.do(request{path: "/metrics"})
	if r.status != http.StatusOK || !bytes.Contains(r.body, []byte(`auditd_api_requests_total{method="GET",route="/v1/runs",status="200"} 1`)) {
		t.Fatalf("metrics: %d\n%s", r.status, r.body)
	}
}
