package api_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// keysThatNeedEscaping are item keys a run accepts that a path segment
// cannot carry as written.
var keysThatNeedEscaping = []string{"county/2026/parcels.json", "a/b/", "100%", "a b", "q?x=1", "#frag", "caf\u00e9", "%2F", "..", "a%20b", "+plus"}

// TestItemRoutesTakeAnyKey: every key a run accepted, "/" included, is
// read back through /items/{key} and /items/{key}/payload when sent
// percent-encoded, decoded once (so "%2F" as a key is itself, not "/").
func TestItemRoutesTakeAnyKey(t *testing.T) {
	e := newEnv(t)
	var items []auditd.ItemView
	for _, k := range keysThatNeedEscaping {
		items = append(items, auditd.ItemView{Item: auditd.Item{Key: k, SourceID: "county", Method: "GET", Path: "/q"},
			Result: &auditd.ItemResult{Outcome: auditd.ItemSucceeded, PayloadHash: strings.Repeat("cd", 32), Bytes: 7, Attempts: 1}})
	}
	run := e.runs.add(auditd.RunSucceeded, items)
	aud := e.secret[auth.RoleAuditor]
	for _, k := range keysThatNeedEscaping {
		t.Run(k, func(t *testing.T) {
			base := "/v1/runs/" + run + "/items/" + url.PathEscape(k)
			r := e.do(request{path: base, secret: aud})
			if r.status != http.StatusOK {
				t.Fatalf("GET item %q: %d %s", k, r.status, r.body)
			}
			var got auditd.ItemView
			if err := json.Unmarshal(r.body, &got); err != nil || got.Key != k {
				t.Fatalf("GET item %q: key %q, %v", k, got.Key, err)
			}
			if r := e.do(request{path: base + "/payload", secret: aud}); r.status != http.StatusOK || string(r.body) != "payload" {
				t.Fatalf("GET payload of %q: %d %s", k, r.status, r.body)
			}
		})
	}
	// A key sent with its "/" unescaped is another route's path, not the
	// item: the contract asks for keys percent-encoded.
	if r := e.do(request{path: "/v1/runs/" + run + "/items/a/b/c", secret: aud}); r.status != http.StatusNotFound {
		t.Errorf("unescaped key: %d, want 404", r.status)
	}
}

// TestConcurrentPutsCreateOnce: of many concurrent PUTs of one new source
// id, exactly one answers 201.
func TestConcurrentPutsCreateOnce(t *testing.T) {
	e := newEnv(t)
	const n = 16
	codes := make(chan int, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			r := e.do(request{method: "PUT", path: "/v1/sources/racer", secret: e.secret[auth.RoleAdmin], body: `{"base_url":"https://racer.example"}`})
			codes <- r.status
		})
	}
	wg.Wait()
	close(codes)
	created := 0
	for c := range codes {
		switch c {
		case http.StatusCreated:
			created++
		case http.StatusOK:
		default:
			t.Errorf("PUT answered %d", c)
		}
	}
	if created != 1 {
		t.Errorf("%d PUTs answered 201, want exactly 1", created)
	}
}
