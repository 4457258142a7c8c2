package fetch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fetch"
	bolt "go.etcd.io/bbolt"
)

// results returns every item of run id with its result (nil while pending).
func results(tb testing.TB, h *harness, id string) map[string]*fetch.ItemResult {
	tb.Helper()
	items, next, err := h.loop.Items(id, "", 1000)
	if err != nil || next != "" {
		tb.Fatalf("items: next %q, %v", next, err)
	}
	out := map[string]*fetch.ItemResult{}
	for _, it := range items {
		out[it.Key] = it.Result
	}
	return out
}

// An active run keeps its items' results with it until it ends. A restart
// in the middle rebuilds them from the ledger's item.finished events: the
// items that finished before it read exactly as they did.
func TestRestartRebuildsResults(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	items := mixedItems()
	v, _, err := h.loop.Submit(context.Background(), fetch.SubmitRequest{Name: "restart", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(func() bool {
		rv, err := h.loop.Run(v.ID)
		return err == nil && rv.Counts.Done() >= 3
	}, 200_000) {
		t.Fatal("no three items finished")
	}
	h.close(t)
	// Read before the restart from the store alone: none of it is there yet.
	h.open(t, h.dir)
	rebuiltEarly := results(t, h, v.ID)
	v = h.finish(t, v.ID)
	after := results(t, h, v.ID)

	finishedBefore := 0
	for key, res := range rebuiltEarly {
		if res == nil {
			continue
		}
		finishedBefore++
		if !reflect.DeepEqual(res, after[key]) {
			t.Errorf("%s: rebuilt %+v, stored at the end %+v", key, *res, *after[key])
		}
	}
	if finishedBefore < 3 {
		t.Fatalf("only %d results rebuilt after the restart, want at least 3", finishedBefore)
	}
	for _, it := range items {
		res := after[it.Key]
		if res == nil {
			t.Errorf("%s has no result after the run ended", it.Key)
			continue
		}
		if res.Outcome == auditd.ItemSucceeded && (res.Attempts < 1 || res.Pages < 1 || res.PayloadHash == "" || res.Bytes == 0) {
			t.Errorf("%s: succeeded with a thin result %+v", it.Key, *res)
		}
	}
	h.reconcile(t, v.ID)
}

// A crash after run.finished is durable but before the store has the run's
// end leaves the run "running" there with no results. The next start
// stores its end from the ledger and records nothing new.
func TestRestartAfterRunFinishedStoresItsEnd(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	v, _, err := h.loop.Submit(context.Background(), fetch.SubmitRequest{Name: "end", Items: mixedItems()[:4]})
	if err != nil {
		t.Fatal(err)
	}
	done := h.finish(t, v.ID)
	want := results(t, h, v.ID)
	events := len(h.events(t, v.ID))
	h.close(t)

	// Put the store back as the crash would have left it.
	db, err := bolt.Open(filepath.Join(h.dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		runs := tx.Bucket([]byte("fetch.runs"))
		var rec map[string]any
		if err := json.Unmarshal(runs.Get([]byte(v.ID)), &rec); err != nil {
			return err
		}
		rec["status"] = string(auditd.RunRunning)
		delete(rec, "finished_at")
		delete(rec, "head_at_end")
		b, _ := json.Marshal(rec)
		if err := runs.Put([]byte(v.ID), b); err != nil {
			return err
		}
		// The run's results, in chunks keyed by the run id, 0, a key.
		res := tx.Bucket([]byte("fetch.resultchunks"))
		prefix := append([]byte(v.ID), 0)
		var chunks [][]byte
		c := res.Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			chunks = append(chunks, bytes.Clone(k))
		}
		if len(chunks) == 0 {
			return fmt.Errorf("run %s stored no results", v.ID)
		}
		for _, k := range chunks {
			if err := res.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	h.open(t, h.dir)
	got, err := h.loop.Run(v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != done.Status || !got.FinishedAt.Equal(done.FinishedAt) || got.HeadAtEnd != done.HeadAtEnd {
		t.Fatalf("after the restart the run is %s (finished %v, head %s); it ended %s (%v, %s)",
			got.Status, got.FinishedAt, got.HeadAtEnd, done.Status, done.FinishedAt, done.HeadAtEnd)
	}
	if n := len(h.events(t, v.ID)); n != events {
		t.Fatalf("the restart recorded %d new events for a finished run", n-events)
	}
	if r := results(t, h, v.ID); !reflect.DeepEqual(r, want) {
		t.Fatalf("results after the restart differ from those stored at the end")
	}
	h.reconcile(t, v.ID)
}
