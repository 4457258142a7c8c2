package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

// reconcileDataDir writes the clean fixture, changed by m, into the ledger
// of a new data directory.
func reconcileDataDir(tb testing.TB, m reportstest.Mutation) string {
	tb.Helper()
	evs := reportstest.LoadFixture(tb, "clean.ndjson")
	if m.Before != nil {
		evs = m.Before(evs)
	}
	dir := tb.TempDir()
	reportstest.WriteLedger(tb, dir, evs)
	return dir
}

func runCmd(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestReconcileOffline: the clean fixture balances (exit 0); every mutation
// a ledger can carry by itself makes exactly its check fail (exit 1).
// The fixture's data directory holds a ledger and no payload store, so R6
// counts payloads without re-hashing them (TestReconcileOfflineRehashesPayloads
// has a store). Mutations needing the running service (live counters for
// R7, a payload that does not verify) or tampering below the ledger (R8)
// are covered by TestReconcileServer and TestReconcileOfflineTampered.
func TestReconcileOffline(t *testing.T) {
	t.Run("Clean", func(t *testing.T) {
		dir := reconcileDataDir(t, reportstest.Mutation{})
		// The fixture's run is partial by design (an item failed, one was shed).
		code, out, errOut := runCmd(t, "reconcile", "--data", dir, "--run", reportstest.FixtureRun, "--allow-partial")
		if code != 0 || !strings.Contains(out, "BALANCED") {
			t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
		}
		for _, want := range []string{"hashes not verified", "exit 0: balanced, and the run is partial, accepted by --allow-partial"} {
			if !strings.Contains(out, want) {
				t.Errorf("offline table lacks %q:\n%s", want, out)
			}
		}
		if !regexp.MustCompile(`\nR7 +the live counters equal a recount of the ledger's events +n/a `).MatchString(out) {
			t.Errorf("offline table's R7 is not n/a with its meaning:\n%s", out)
		}
	})
	for _, m := range reportstest.Mutations() {
		if m.Before == nil || m.Breaks == reports.R7 || m.Name == "R6/HashDoesNotVerify" {
			continue
		}
		t.Run(m.Name, func(t *testing.T) {
			dir := reconcileDataDir(t, m)
			code, out, errOut := runCmd(t, "reconcile", "--data", dir, "--run", reportstest.FixtureRun, "--format", "json")
			if code != 1 {
				t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
			}
			rep := decodeReport(t, out)
			if got := rep.Failed(); len(got) != 1 || got[0] != m.Breaks {
				t.Errorf("failed %v, want exactly %s", got, m.Breaks)
			}
		})
	}
}

// TestReconcileOfflineTampered edits one stored event below the ledger:
// R8 fails and the exit status is 1.
func TestReconcileOfflineTampered(t *testing.T) {
	dir := reconcileDataDir(t, reportstest.Mutation{})
	db, err := bolt.Open(filepath.Join(dir, dbFile), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("ledger.events"))
		k := binary.BigEndian.AppendUint64(nil, 10)
		v := bytes.Clone(b.Get(k))
		i := bytes.Index(v, []byte("resultOffset=0"))
		if i < 0 {
			t.Fatal("event 10 does not hold its path")
		}
		v[i+len("resultOffset=")] = '9'
		return b.Put(k, v)
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "reconcile", "--data", dir, "--run", reportstest.FixtureRun, "--format", "json")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	rep := decodeReport(t, out)
	if got := rep.Failed(); len(got) != 1 || got[0] != reports.R8 || rep.Checks[7].Offending[0] != 10 {
		t.Errorf("failed %v (R8 offending %v), want R8 naming seq 10", got, rep.Checks[7].Offending)
	}
}

// reconcileServer serves GET /v1/runs/{id}/reconciliation as the API does,
// reconciling the fixture changed by m in memory with every seam given.
func reconcileServer(t *testing.T, m reportstest.Mutation, token string) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/runs/{id}/reconciliation", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"title":"Unauthorized","detail":"bad token"}`))
			return
		}
		rc := reports.NewReconciler(m.Apply(t))
		rc.Hash, rc.Payloads = reportstest.Hash, reportstest.CleanPayloads()
		// Live counters: the clean ones for the clean fixture; a mutation
		// that changes counts gives none (R7 n/a) unless it is R7's.
		live := m.Live
		if m.Name == "" {
			live = reportstest.CleanLive()
		}
		rep, err := rc.Reconcile(r.Context(), r.PathValue("id"), live)
		if err != nil {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"title":"Not Found","detail":"no such run"}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		reports.WriteJSON(w, rep)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestReconcileServer(t *testing.T) {
	const token = "s3cret-token"
	t.Setenv("AUDITD_TOKEN", token)
	run := reportstest.FixtureRun

	t.Run("Clean", func(t *testing.T) {
		srv := reconcileServer(t, reportstest.Mutation{}, token)
		if code, out, errOut := runCmd(t, "reconcile", "--server", srv.URL, "--run", run, "--allow-partial"); code != 0 {
			t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
		}
	})
	for _, m := range reportstest.Mutations() {
		t.Run(m.Name, func(t *testing.T) {
			srv := reconcileServer(t, m, token)
			code, out, errOut := runCmd(t, "reconcile", "--server", srv.URL, "--run", run)
			if code != 1 || !strings.Contains(out, "NOT BALANCED: failed "+m.Breaks+"\n") {
				t.Fatalf("exit %d, want 1 naming %s only\n%s%s", code, m.Breaks, out, errOut)
			}
		})
	}

	errorCases := []struct {
		name string
		args func(url string) []string
		want string
	}{
		{"BadToken", func(u string) []string { return []string{"--server", u, "--run", run, "--token", "wrong"} }, "401 Unauthorized"},
		{"UnknownRun", func(u string) []string { return []string{"--server", u, "--run", "01JNOSUCHRUN00000000000000"} }, "404 Not Found"},
		{"ServerDown", func(string) []string { return []string{"--server", "http://127.0.0.1:1", "--run", run} }, "server:"},
		{"NoRun", func(u string) []string { return []string{"--server", u} }, "--run is required"},
		{"BothSources", func(u string) []string { return []string{"--server", u, "--data", t.TempDir(), "--run", run} }, "exactly one"},
		{"NoDataDir", func(string) []string { return []string{"--data", filepath.Join(t.TempDir(), "none"), "--run", run} }, "auditd.db"},
	}
	for _, tt := range errorCases {
		t.Run(tt.name, func(t *testing.T) {
			srv := reconcileServer(t, reportstest.Mutation{}, token)
			code, out, errOut := runCmd(t, append([]string{"reconcile"}, tt.args(srv.URL)...)...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 mentioning %q\n%s", code, errOut, tt.want, out)
			}
			if strings.Contains(errOut, token) {
				t.Error("stderr shows the token")
			}
		})
	}
}

func decodeReport(t *testing.T, s string) *reports.Report {
	t.Helper()
	var rep reports.Report
	if err := json.Unmarshal([]byte(s), &rep); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	return &rep
}

// TestLiveCounters: the fetch loop's counters of the clean fixture, as the
// loop would have kept them, make R7 pass; one off makes it fail.
func TestLiveCounters(t *testing.T) {
	c := auditd.Counts{Items: 6, Succeeded: 3, Cached: 1, Failed: 1, Shed: 1, Dispatches: 11, Retries: 5,
		Status2xx: 5, Status429: 1, Status5xx: 2, StatusOther: 1, TransportErrors: 1, Interrupted: 1,
		Waits: 4, BreakerOpens: 1, Staged: 3, Acknowledged: 4}
	l := reportstest.Mutation{}.Apply(t)
	for _, tt := range []struct {
		name string
		edit func(*auditd.Counts)
		want reports.Status
	}{
		{"Equal", func(*auditd.Counts) {}, reports.StatusPass},
		{"WaitsOff", func(c *auditd.Counts) { c.Waits++ }, reports.StatusFail},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := c
			tt.edit(&c)
			rep, err := reports.NewReconciler(l).Reconcile(context.Background(), reportstest.FixtureRun, &reports.LiveCounters{Total: c})
			if err != nil {
				t.Fatal(err)
			}
			if got := rep.Checks[6]; got.Status != tt.want {
				t.Errorf("R7 = %s (%s), want %s", got.Status, got.Note, tt.want)
			}
		})
	}
}

// TestProblemSaysItOnce: a failed answer is described by its status and
// its problem's detail, the title only when it adds to the status; a 401
// says how to pass a token.
func TestProblemSaysItOnce(t *testing.T) {
	for _, tc := range []struct {
		code int
		body string
		want string
	}{
		{404, `{"title":"Not Found","detail":"run \"x\" not found"}`, `404 Not Found: run "x" not found`},
		{409, `{"title":"Run finished","detail":"It ended."}`, "409 Conflict: Run finished It ended."},
		{503, `not json`, "503 Service Unavailable"},
		{401, `{"title":"Unauthorized","detail":"A valid bearer token is required."}`, "401 Unauthorized: A valid bearer token is required. Pass --token, or set AUDITD_TOKEN."},
		{401, `not json`, "401 Unauthorized"},
	} {
		resp := &http.Response{StatusCode: tc.code, Status: fmt.Sprintf("%d %s", tc.code, http.StatusText(tc.code)), Body: io.NopCloser(strings.NewReader(tc.body))}
		if got := problem(resp); got != tc.want {
			t.Errorf("%d %s: %q, want %q", tc.code, tc.body, got, tc.want)
		}
	}
}
