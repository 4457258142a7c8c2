package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"github.com/auditd/auditd/reports/reportstest"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
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
			// The run's id in lower case, as pasted: a ULID reads the same.
			code, out, errOut := runCmd(t, append([]string{"reconcile", "--run", strings.ToLower(cached.ID), "--format", "json"}, from...)...)
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
	t.Run("FleetParts", func(t *testing.T) {
		// The same two runs' reconciliations as two nodes' parts of a
		// fleet run: --max-stale and --list-cached hold on every part.
		part := func(node, run string) reports.FleetPart {
			_, out, _ := runCmd(t, "reconcile", "--run", run, "--format", "json", "--server", srv.url, "--token", token)
			rep := decodeReport(t, out)
			return reports.FleetPart{Node: node, Report: rep, Logged: rep.Run.LastSeq}
		}
		rep := reports.CombineFleet("fleet-run", []reports.FleetPart{part("a", good.ID), part("b", cached.ID)})
		if !rep.Balanced {
			t.Fatalf("the two parts do not balance: %v", rep.Failed())
		}
		if v := fleetVerdicts(rep, fleetReconcileFlags{maxStale: time.Hour, maxStaleText: "1h"}); len(v) != 0 {
			t.Errorf("--max-stale 1h: %q, want no verdict", v)
		}
		v := fleetVerdicts(rep, fleetReconcileFlags{maxStale: time.Nanosecond, maxStaleText: "1ns"})
		if len(v) != 1 || !strings.Contains(v[0], "2 items were served on node b from copies older than --max-stale 1ns") {
			t.Errorf("--max-stale 1ns: %q, want node b's two items named", v)
		}
		for _, list := range []bool{false, true} {
			var table strings.Builder
			if err := writeFleetTable(&table, rep, list, nil); err != nil {
				t.Fatal(err)
			}
			listed := strings.Contains(table.String(), "cached-1")
			if !strings.Contains(table.String(), "node b:\nserved from cache: 2 items") || listed != list {
				t.Errorf("--list-cached %t: the table does not sum up node b's cached items, or lists them %t:\n%s", list, listed, table.String())
			}
		}
		// The table says what each check holds to and why it exits, as
		// one node's does.
		var table strings.Builder
		if err := writeFleetTable(&table, rep, false, nil); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"in the parts of 2 of 2 nodes\nBALANCED", "WHAT IT HOLDS TO", checkMeanings[reports.F1], checkMeanings[reports.R1], "exit 0: balanced, and every part succeeded"} {
			if !strings.Contains(table.String(), want) {
				t.Errorf("the fleet table lacks %q:\n%s", want, table.String())
			}
		}
		// A node whose part did not come fails F1, whatever the flags: the
		// verdict names the node and offers no flag.
		missing := reports.CombineFleet("fleet-run", []reports.FleetPart{part("a", good.ID), {Node: "c", Error: "node c: connection refused"}})
		v = fleetVerdicts(missing, fleetReconcileFlags{allowPartial: true})
		if len(v) != 2 || !strings.Contains(v[0], "F1 failed") || v[1] != "fleet run fleet-run: no part came from c" {
			t.Errorf("a part missing: %q, want F1 failed and node c named", v)
		}
		table.Reset()
		if err := writeFleetTable(&table, missing, false, v); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"in the parts of 1 of 2 nodes\nNOT BALANCED: failed F1", "exit 1:\n", "  fleet run fleet-run: no part came from c"} {
			if !strings.Contains(table.String(), want) {
				t.Errorf("the fleet table of a part missing lacks %q:\n%s", want, table.String())
			}
		}
	})

	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.cmd.Wait(); err != nil {
		t.Fatalf("graceful shutdown: %v\n%s", err, srv.logs)
	}
	t.Run("Offline", func(t *testing.T) { check(t, []string{"--data", data}) })
	t.Run("ExportInLowerCase", func(t *testing.T) {
		// The run's id in lower case, as pasted: a ULID reads the same,
		// and the workbook is named with its capitals.
		out := t.TempDir()
		if code, stdout, stderr := runCmd(t, "export", "--data", data, "--run", strings.ToLower(good.ID), "--out", out); code != 0 {
			t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "evidence-"+good.ID+".xlsx")); err != nil {
			t.Error(err)
		}
	})
}

// get reads path from the server whole.
func (c *child) get(t *testing.T, path, token string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest("GET", c.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp.StatusCode, b
}

// Acknowledgements are idempotent per item under concurrency: goroutines
// acknowledging the same items at once through the API record exactly one
// item.acknowledged per item, the responses' counts add up to the items,
// and R10 holds.
func TestConcurrentAcknowledgementsRecordOnce(t *testing.T) {
	const token = "ack-test-admin-token-0123456789ab"
	up := newCIUpstream(t)
	srv, _ := ciServe(t, up, token)
	v := srv.ciRun(t, token, "acks", "/q?a=0", "/q?a=1", "/q?a=2")
	if v.Status != auditd.RunSucceeded {
		t.Fatalf("run ended %s", v.Status)
	}
	keys := []string{"acks-0", "acks-1", "acks-2"}
	const workers = 12
	var wg sync.WaitGroup
	counts := make([]int, workers)
	codes := make([]int, workers)
	start := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			// Every worker acknowledges acks-0; the others in turn.
			body := map[string]any{"items": []string{keys[0], keys[1+w%2]}}
			if w%3 == 0 {
				body["items"] = keys
			}
			var out struct {
				Acknowledged int `json:"acknowledged"`
			}
			codes[w] = srv.call(t, "POST", "/v1/runs/"+v.ID+"/acknowledgements", token, body, &out)
			counts[w] = out.Acknowledged
		}()
	}
	close(start)
	wg.Wait()
	total := 0
	for w := range workers {
		if codes[w] != http.StatusOK {
			t.Fatalf("worker %d: status %d\n%s", w, codes[w], srv.logs)
		}
		total += counts[w]
	}
	if total != len(keys) {
		t.Errorf("the responses acknowledged %d items in all, want %d (%v)", total, len(keys), counts)
	}

	var events struct {
		Events []auditd.EventJSON `json:"events"`
	}
	if code := srv.call(t, "GET", "/v1/runs/"+v.ID+"/events?type=item.acknowledged&limit=1000", token, nil, &events); code != http.StatusOK {
		t.Fatalf("events: %d", code)
	}
	per := map[string]int{}
	for _, e := range events.Events {
		per[e.ItemKey]++
	}
	for _, k := range keys {
		if per[k] != 1 {
			t.Errorf("%s: %d item.acknowledged events, want 1 (%v)", k, per[k], per)
		}
	}
	var rec uiReconciliation
	if code := srv.call(t, "GET", "/v1/runs/"+v.ID+"/reconciliation", token, nil, &rec); code != http.StatusOK {
		t.Fatalf("reconciliation: %d", code)
	}
	for _, c := range rec.Checks {
		if c.ID == "R10" && (c.Status != "pass" || c.Expected != int64(len(keys))) {
			t.Errorf("R10 %s: expected %d actual %d %s", c.Status, c.Expected, c.Actual, c.Note)
		}
	}
	if !rec.Balanced {
		t.Errorf("not balanced: %s", rec.failing())
	}
}

// A finished run's reconciliation is the same, byte for byte, however
// often it is read: ten reads of its JSON and an evidence export later
// (each recorded in the ledger as an access event), the JSON, the CSV and
// the offline one are what they were.
func TestReconciliationUnchangedByViewing(t *testing.T) {
	const token = "view-test-admin-token-0123456789a"
	up := newCIUpstream(t)
	srv, data := ciServe(t, up, token)
	v := srv.ciRun(t, token, "viewed", "/q?v=0", "/q?v=1", "/q?v=2", "/q?v=3")
	if v.Status != auditd.RunSucceeded {
		t.Fatalf("run ended %s", v.Status)
	}
	path := "/v1/runs/" + v.ID + "/reconciliation"
	read := func(suffix string) []byte {
		t.Helper()
		code, b := srv.get(t, path+suffix, token)
		if code != http.StatusOK {
			t.Fatalf("GET %s%s: %d %s", path, suffix, code, b)
		}
		return b
	}
	headBefore := srv.head(t, token)
	first, firstCSV := read(""), read("?format=csv")
	for range 10 {
		read("")
	}
	if code, b := srv.get(t, "/v1/runs/"+v.ID+"/evidence.xlsx", token); code != http.StatusOK || len(b) == 0 {
		t.Fatalf("export: %d, %d bytes", code, len(b))
	}
	headAfter := srv.head(t, token)
	if headAfter < headBefore+12 {
		t.Fatalf("the ledger grew from %d to %d: the views and the export were not recorded, so nothing is tested", headBefore, headAfter)
	}
	if got := read(""); !bytes.Equal(got, first) {
		t.Errorf("the reconciliation changed after ten views and an export:\n%s", reportstest.LineDiff(string(first), string(got), 1))
	}
	if got := read("?format=csv"); !bytes.Equal(got, firstCSV) {
		t.Errorf("the CSV reconciliation changed:\n%s", reportstest.LineDiff(string(firstCSV), string(got), 1))
	}

	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.cmd.Wait(); err != nil {
		t.Fatalf("graceful shutdown: %v\n%s", err, srv.logs)
	}
	var served, offline reports.Report
	if err := json.Unmarshal(first, &served); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "reconcile", "--data", data, "--run", v.ID, "--format", "json")
	if code != 0 {
		t.Fatalf("offline: exit %d\n%s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &offline); err != nil {
		t.Fatal(err)
	}
	if offline.Run != served.Run || offline.Counts != served.Counts || !slices.Equal(offline.Failed(), served.Failed()) {
		t.Errorf("offline after the views: run %+v counts %+v; served before: %+v %+v", offline.Run, offline.Counts, served.Run, served.Counts)
	}
}

// head returns the size of the ledger's latest signed checkpoint (the
// note's second line), which covers every event appended.
func (c *child) head(t *testing.T, token string) uint64 {
	t.Helper()
	code, note := c.get(t, "/v1/ledger/checkpoint", token)
	lines := strings.Split(string(note), "\n")
	if code != http.StatusOK || len(lines) < 2 {
		t.Fatalf("checkpoint: %d %q", code, note)
	}
	n, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		t.Fatalf("checkpoint %q: %v", note, err)
	}
	return n
}
