package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// ciUpstream answers {"path": ...} for every request, and 404 for the
// paths in gone: an item whose path is gone fails, or is served from its
// last good copy when it has one.
type ciUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	gone map[string]bool
}

func newCIUpstream(t *testing.T) *ciUpstream {
	u := &ciUpstream{gone: map[string]bool{}}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		gone := u.gone[r.URL.RequestURI()]
		u.mu.Unlock()
		if gone {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, `{"path":%q}`, r.URL.RequestURI())
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *ciUpstream) remove(paths ...string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, p := range paths {
		u.gone[p] = true
	}
}

// ciServe starts auditd serve on a new data directory with one source,
// county, pointing at up.
func ciServe(t *testing.T, up *ciUpstream, token string) (*child, string) {
	t.Helper()
	dir := t.TempDir()
	config := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("sources:\n  - id: county\n    base_url: %s\n    limit: 100\n    window: 1s\n    concurrency: 4\n    max_attempts: 1\n", up.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	return startServe(t, data, config, token), data
}

// ciRun submits a run of the given paths (item i is "<name>-i") and waits
// for its end.
func (c *child) ciRun(t *testing.T, token, name string, paths ...string) auditd.RunView {
	t.Helper()
	var items []map[string]any
	for i, p := range paths {
		items = append(items, map[string]any{"key": fmt.Sprintf("%s-%d", name, i), "source": "county", "path": p})
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := c.call(t, "POST", "/v1/runs", token, map[string]any{"name": name, "items": items}, &created); code != http.StatusCreated {
		t.Fatalf("create run %s: %d\n%s", name, code, c.logs)
	}
	var v auditd.RunView
	c.awaitRun(t, created.ID, token, 60*time.Second, &v)
	return v
}

// TestReconcileExitCodesFromRealRuns: auditd reconcile's exit status is
// what a CI step needs, for runs of the real fetch loop against an
// upstream, read from the running server and offline alike: 0 for a run
// that succeeded and balances; 1 for a partial run unless --allow-partial;
// a run served from last good copies succeeds, and its table, JSON and
// items say which run fetched each copy and how old it was; --max-stale
// fails it when a copy is older than the bound.
func TestReconcileExitCodesFromRealRuns(t *testing.T) {
	const token = "ci-test-admin-token-0123456789ab"
	up := newCIUpstream(t)
	srv, data := ciServe(t, up, token)

	good := srv.ciRun(t, token, "good", "/q?n=0", "/q?n=1", "/q?n=2")
	if good.Status != auditd.RunSucceeded {
		t.Fatalf("good run ended %s: %+v", good.Status, good.Counts)
	}
	up.remove("/missing")
	partial := srv.ciRun(t, token, "partial", "/q?n=3", "/missing")
	if partial.Status != auditd.RunPartial || partial.Counts.Failed != 1 {
		t.Fatalf("partial run ended %s: %+v", partial.Status, partial.Counts)
	}
	// The good run's copies are all that is left of these two paths.
	up.remove("/q?n=0", "/q?n=1")
	cached := srv.ciRun(t, token, "cached", "/q?n=0", "/q?n=1")
	if cached.Status != auditd.RunSucceeded || cached.Counts.Cached != 2 {
		t.Fatalf("cached run ended %s: %+v", cached.Status, cached.Counts)
	}

	// The items API says where each copy came from.
	var item auditd.ItemView
	if code := srv.call(t, "GET", "/v1/runs/"+cached.ID+"/items/cached-0", token, nil, &item); code != http.StatusOK {
		t.Fatalf("get item: %d", code)
	}
	if c := item.Result; c == nil || c.Outcome != auditd.ItemCached || c.Cached == nil || c.Cached.OriginRun != good.ID ||
		c.Cached.FetchedAt.IsZero() || c.Cached.FetchedAt.After(time.Now()) {
		t.Fatalf("item cached-0: %+v, want a copy fetched by run %s", c, good.ID)
	}

	cases := []struct {
		name   string
		run    string
		flags  []string
		code   int
		stdout []string
		stderr string
	}{
		{"Succeeded", good.ID, nil, 0, []string{"BALANCED", "status succeeded"}, ""},
		{"Partial", partial.ID, nil, 1, []string{"BALANCED", "status partial"}, "is partial, not succeeded (--allow-partial accepts it)"},
		{"PartialAllowed", partial.ID, []string{"--allow-partial"}, 0, []string{"BALANCED"}, ""},
		{"Cached", cached.ID, nil, 0, []string{"BALANCED", "served from cache: 2", good.ID}, ""},
		{"CachedWithinBound", cached.ID, []string{"--max-stale", "1h"}, 0, []string{"served from cache: 2"}, ""},
		{"Stale", cached.ID, []string{"--max-stale", "1ns"}, 1, []string{"BALANCED"}, "older than --max-stale 1ns"},
	}
	check := func(t *testing.T, from []string) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				args := append(append([]string{"reconcile", "--run", tc.run}, from...), tc.flags...)
				code, out, errOut := runCmd(t, args...)
				if code != tc.code {
					t.Fatalf("exit %d, want %d\n%s%s", code, tc.code, out, errOut)
				}
				for _, want := range tc.stdout {
					if !strings.Contains(out, want) {
						t.Errorf("stdout lacks %q:\n%s", want, out)
					}
				}
				if tc.stderr != "" && !strings.Contains(errOut, tc.stderr) {
					t.Errorf("stderr lacks %q:\n%s", tc.stderr, errOut)
				} else if tc.stderr == "" && errOut != "" {
					t.Errorf("stderr: %s", errOut)
				}
			})
		}
		t.Run("CachedJSON", func(t *testing.T) {
			code, out, errOut := runCmd(t, append([]string{"reconcile", "--run", cached.ID, "--format", "json"}, from...)...)
			if code != 0 {
				t.Fatalf("exit %d\n%s", code, errOut)
			}
			rep := decodeReport(t, out)
			if len(rep.Cached) != 2 {
				t.Fatalf("%d cached items in the JSON, want 2", len(rep.Cached))
			}
			for _, c := range rep.Cached {
				// The age is taken as the copy is chosen, just before its
				// cache.served is stamped.
				if at := c.FetchedAt.Add(c.Age.D()); c.OriginRun != good.ID || !c.AgeKnown() || c.Age <= 0 ||
					at.After(c.ServedAt) || at.Before(c.ServedAt.Add(-time.Second)) {
					t.Errorf("cached item %+v: want a copy of run %s whose age runs from its fetch to its serving", c, good.ID)
				}
			}
		})
	}
	t.Run("Server", func(t *testing.T) { check(t, []string{"--server", srv.url, "--token", token}) })

	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.cmd.Wait(); err != nil {
		t.Fatalf("graceful shutdown: %v\n%s", err, srv.logs)
	}
	t.Run("Offline", func(t *testing.T) { check(t, []string{"--data", data}) })
}
