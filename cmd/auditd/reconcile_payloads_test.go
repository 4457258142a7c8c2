package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// payloadsDataDir writes a finished run of three items into a new data
// directory, with a payload in each place staging keeps one: in a file
// (too large for the bbolt file), in the payload bucket (Put), and still in
// the spool (stored with its events, as the fetch loop stores it, and not
// yet compacted). It returns the directory, the run and the file payload's
// path.
func payloadsDataDir(t *testing.T) (dir, run, file string) {
	t.Helper()
	dir, run = t.TempDir(), "01JRUNPAYLOADS0000000000000"
	db, err := bolt.Open(filepath.Join(dir, dbFile), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	led, err := ledger.Open(db, ledger.Options{KeyDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close(context.Background())
	stage, err := staging.Open(db, filepath.Join(dir, payloadsDir))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	items := []string{"file", "bucket", "spool"}
	batch := []auditd.Event{{Type: auditd.EventRunStarted, RunID: run}}
	for _, key := range items {
		batch = append(batch, auditd.Event{Type: auditd.EventItemQueued, RunID: run, SourceID: "s", ItemKey: key, Method: "GET", Path: "/q/" + key})
	}
	if _, err := led.AppendBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for _, key := range items {
		body := fmt.Sprintf(`{"item":%q}`, key)
		var sum string
		var n int64
		var puts []auditd.Put
		switch key {
		case "file":
			stage.InlineMax = 4
			sum, n, err = stage.Put(strings.NewReader(body))
			stage.InlineMax = staging.DefaultInlineMax
			file = filepath.Join(dir, payloadsDir, sum[:2], sum)
		case "bucket":
			sum, n, err = stage.Put(strings.NewReader(body))
		case "spool":
			w, werr := stage.NewWriter()
			if werr != nil {
				t.Fatal(werr)
			}
			w.Write([]byte(body))
			p, ferr := w.Finish()
			rec, ok := p.Record()
			if !ok {
				t.Fatal("a small payload has no spool record")
			}
			sum, n, err, puts = p.Sum, p.N, ferr, []auditd.Put{rec}
		}
		if err != nil {
			t.Fatal(err)
		}
		f, err := led.Add([]auditd.Event{
			{Type: auditd.EventDispatch, RunID: run, SourceID: "s", ItemKey: key, Attempt: 1, Method: "GET", Path: "/q/" + key},
			{Type: auditd.EventResponse, RunID: run, SourceID: "s", ItemKey: key, Attempt: 1, Status: 200, Bytes: n, Outcome: auditd.OutcomeSuccess},
			{Type: auditd.EventPayloadStaged, RunID: run, SourceID: "s", ItemKey: key, PayloadHash: sum, Bytes: n},
			{Type: auditd.EventItemFinished, RunID: run, SourceID: "s", ItemKey: key, Outcome: auditd.ItemSucceeded},
		}, puts...)
		if err == nil {
			err = f.Wait(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := led.Append(ctx, auditd.Event{Type: auditd.EventRunFinished, RunID: run, Outcome: auditd.Outcome(auditd.RunSucceeded)}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Fatalf("the large payload has no file: %v", err)
	}
	return dir, run, file
}

// TestReconcileOfflineRehashesPayloads: offline, R6 re-hashes the payloads
// of a stopped server's data directory wherever staging keeps them (a file,
// the payload bucket, the spool), and fails, naming the event, when one of
// them has been altered; the offline evidence workbook's reconciliation
// does the same.
func TestReconcileOfflineRehashesPayloads(t *testing.T) {
	dir, run, file := payloadsDataDir(t)
	code, out, errOut := runCmd(t, "reconcile", "--data", dir, "--run", run, "--format", "json")
	if code != 0 {
		t.Fatalf("exit %d, want 0\n%s%s", code, out, errOut)
	}
	r6 := check(t, decodeReport(t, out), reports.R6)
	if r6.Status != reports.StatusPass || r6.Actual != 3 || strings.Contains(r6.Note, "not verified") {
		t.Fatalf("R6 %+v: want a pass over 3 re-hashed payloads", r6)
	}

	// The offline evidence workbook reconciles the same way.
	code, out, errOut = runCmd(t, "export", "--data", dir, "--run", run, "--out", filepath.Join(t.TempDir(), "evidence.xlsx"))
	if code != 0 || !strings.Contains(out, "balanced=true") {
		t.Fatalf("export: exit %d, want 0 and a balanced reconciliation\n%s%s", code, out, errOut)
	}

	if err := os.WriteFile(file, []byte(`{"item":"altered"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = runCmd(t, "reconcile", "--data", dir, "--run", run, "--format", "json")
	if code != 1 {
		t.Fatalf("exit %d after altering a payload, want 1\n%s%s", code, out, errOut)
	}
	rep := decodeReport(t, out)
	if got := rep.Failed(); len(got) != 1 || got[0] != reports.R6 || len(check(t, rep, reports.R6).Offending) != 1 {
		t.Fatalf("failed %v (R6 %+v), want R6 alone naming one event", got, check(t, rep, reports.R6))
	}
	code, out, errOut = runCmd(t, "export", "--data", dir, "--run", run, "--out", filepath.Join(t.TempDir(), "evidence.xlsx"))
	if code != 0 || !strings.Contains(out, "balanced=false") {
		t.Fatalf("export after altering a payload: exit %d, want 0 and an unbalanced reconciliation\n%s%s", code, out, errOut)
	}
}

// check returns the total-scope check id of rep.
func check(t *testing.T, rep *reports.Report, id string) reports.Check {
	t.Helper()
	for _, c := range rep.Checks {
		if c.ID == id && c.Scope == "total" {
			return c
		}
	}
	t.Fatalf("no total %s in the report", id)
	return reports.Check{}
}
