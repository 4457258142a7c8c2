package api_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/auditd/auditd"
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

// FuzzPathDecoding sends an item key and a source id, each percent-encoded
// as a client must, through the server's routing: the item route answers
// the key exactly as it was (decoded once, whatever it holds), and a source
// id is stored as itself or refused naming the id, never with a "/" in it.
func FuzzPathDecoding(f *testing.F) {
	for _, s := range append(slices.Clone(keysThatNeedEscaping), "..%2F..%2Fetc", "../../etc", "%252F", "a;b", "\u2028", "x%") {
		f.Add(s)
	}
	e := newEnv(f)
	run := e.runs.add(auditd.RunSucceeded, nil)
	h := e.srv.Handler()
	do := func(method, target, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, target, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+e.secret[auth.RoleAdmin])
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	f.Fuzz(func(t *testing.T, key string) {
		if key == "" || !utf8.ValidString(key) || len(key) > 200 {
			t.Skip()
		}
		e.runs.mu.Lock()
		e.runs.runs[run].items = []auditd.ItemView{{Item: auditd.Item{Key: key, SourceID: "county", Method: "GET", Path: "/q"}}}
		e.runs.mu.Unlock()
		rec := do("GET", "/v1/runs/"+run+"/items/"+url.PathEscape(key), "")
		var got auditd.ItemView
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &got) != nil || got.Key != key {
			t.Fatalf("item %q: %d %s", key, rec.Code, rec.Body)
		}

		rec = do("PUT", "/v1/sources/"+url.PathEscape(key), `{"base_url":"https://x.example"}`)
		switch {
		case rec.Code/100 == 2:
			var src struct {
				ID string `json:"id"`
			}
			if json.Unmarshal(rec.Body.Bytes(), &src) != nil || src.ID != key || strings.Contains(src.ID, "/") {
				t.Fatalf("source %q stored as %q", key, src.ID)
			}
		case rec.Code == http.StatusBadRequest:
			if !strings.Contains(rec.Body.String(), `"field":"id"`) {
				t.Fatalf("source %q refused without naming the id: %s", key, rec.Body)
			}
		default:
			t.Fatalf("source %q: %d %s", key, rec.Code, rec.Body)
		}
	})
}
