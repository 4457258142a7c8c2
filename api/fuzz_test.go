package api_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/auditd/auditd/auth"
)

// FuzzRequestBodies posts arbitrary bodies to every route that reads one:
// whatever arrives, the answer is a success or a 4xx problem, never a 5xx,
// and a refused body writes nothing to the ledger.
func FuzzRequestBodies(f *testing.F) {
	for _, seed := range []string{
		oneItemRun, runOf(3), `{"name":`, `null`, `[]`, `{"name":"n","items":[{"key":"k","source":"county","path":"/","page_size":"x"}]}`,
		`{"base_url":"https://x.example","window":"-1s"}`, `{"name":"x","role":"root"}`, `{"items":["a"]}`, "\x00\xff", `{"a":1}{}`,
	} {
		for route := range 4 {
			f.Add(uint8(route), seed)
		}
	}
	e := newEnv(f)
	routes := []struct{ method, path string }{
		{"POST", "/v1/runs"},
		{"PUT", "/v1/sources/fuzzed"},
		{"POST", "/v1/tokens"},
		{"POST", "/v1/runs/" + e.runID + "/acknowledgements"},
	}
	h := e.srv.Handler()
	f.Fuzz(func(t *testing.T, route uint8, body string) {
		rt := routes[int(route)%len(routes)]
		req := httptest.NewRequest(rt.method, rt.path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+e.secret[auth.RoleAdmin])
		head := e.head()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch {
		case rec.Code >= 500:
			t.Fatalf("%s %s with %q: %d %s", rt.method, rt.path, body, rec.Code, rec.Body)
		case rec.Code >= 400:
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Fatalf("%d with Content-Type %q", rec.Code, ct)
			}
			if e.head() != head {
				t.Fatalf("refused body (%d) wrote to the ledger: %q", rec.Code, body)
			}
		case rec.Code != http.StatusOK && rec.Code != http.StatusCreated:
			t.Fatalf("unexpected status %d", rec.Code)
		}
	})
}
