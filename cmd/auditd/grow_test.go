package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// A reconciliation reads the ledger and re-hashes staged payloads while the
// fetch loop keeps appending. bbolt grows its file by remapping it, and a
// remap waits for every open read transaction: a reader that opened a
// second transaction inside its scan deadlocked the service this way. Here
// the file starts small so the appends remap it many times while runs are
// reconciled; the test hangs (and times out) if that can deadlock again.
func TestReconcileWhileLedgerGrows(t *testing.T) {
	if testing.Short() {
		t.Skip("appends ~60k events")
	}
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, dbFile), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.NoSync = true // the point is remapping, not durability
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

	const run, items = "01JRUNGROWS0000000000000000", 300
	batch := []auditd.Event{{Type: auditd.EventRunStarted, RunID: run}}
	for i := range items {
		batch = append(batch, auditd.Event{Type: auditd.EventItemQueued, RunID: run, SourceID: "s", ItemKey: fmt.Sprint(i), Method: "GET", Path: "/q"})
	}
	if _, err := led.AppendBatch(ctx, batch); err != nil {
		t.Fatal(err)
	}
	for i := range items {
		sum, n, err := stage.Put(strings.NewReader(fmt.Sprintf(`{"item":%d}`, i)))
		if err != nil {
			t.Fatal(err)
		}
		key := fmt.Sprint(i)
		if _, err := led.AppendBatch(ctx, []auditd.Event{
			{Type: auditd.EventDispatch, RunID: run, SourceID: "s", ItemKey: key, Attempt: 1, Method: "GET", Path: "/q"},
			{Type: auditd.EventResponse, RunID: run, SourceID: "s", ItemKey: key, Attempt: 1, Status: 200, Bytes: n, Outcome: auditd.OutcomeSuccess},
			{Type: auditd.EventPayloadStaged, RunID: run, SourceID: "s", ItemKey: key, PayloadHash: sum, Bytes: n},
			{Type: auditd.EventItemFinished, RunID: run, SourceID: "s", ItemKey: key, Outcome: auditd.ItemSucceeded},
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := led.Append(ctx, auditd.Event{Type: auditd.EventRunFinished, RunID: run, Outcome: auditd.Outcome(auditd.RunSucceeded)}); err != nil {
		t.Fatal(err)
	}

	var done atomic.Bool
	grown := make(chan error, 1)
	go func() { // another run's traffic, growing the file
		filler := make([]auditd.Event, 1000)
		for i := range filler {
			filler[i] = auditd.Event{Type: auditd.EventWait, RunID: "01JRUNOTHER0000000000000000", SourceID: "t", ItemKey: "x", Gate: strings.Repeat("rate ", 20)}
		}
		for i := 0; i < 60 && !done.Load(); i++ {
			if _, err := led.AppendBatch(ctx, filler); err != nil {
				grown <- err
				return
			}
		}
		grown <- nil
	}()
	r := reports.NewReconciler(led)
	r.Hash = newLedgerHash()
	r.Payloads = stage
	for i := 0; i < 15; i++ {
		rep, err := r.Reconcile(ctx, run, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Balanced {
			t.Fatalf("reconciliation %d: not balanced: %v", i, rep.Failed())
		}
	}
	done.Store(true)
	if err := <-grown; err != nil {
		t.Fatal(err)
	}
}
