package runs

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

func openTestStore(t *testing.T) (*Store, *bolt.DB) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}})
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// listKeys lists a run's items by cursor, limit at a time.
func listKeys(t *testing.T, s *Store, id string, limit int) (keys []string, results int) {
	t.Helper()
	after := ""
	for {
		page, next, err := s.Items(context.Background(), id, after, limit)
		if err != nil {
			t.Fatal(err)
		}
		for _, it := range page {
			keys = append(keys, it.Key)
			if it.Result != nil {
				results++
			}
		}
		if next == "" {
			return keys, results
		}
		after = next
	}
}

// TestOpenRunTakesPages: an open run's pages append after its items, in
// submission order, across chunk boundaries; a page repeating a key of the
// run is refused whole; the feed (Todo) and a resume see every page.
func TestOpenRunTakesPages(t *testing.T) {
	s, _ := openTestStore(t)
	first := testItems("a", 300)
	live, err := s.Create(auditd.Run{Name: "r", Status: auditd.RunRunning, CreatedAt: time.Now(), Open: true, ItemCount: 300}, auditd.NewRun{Items: first, Open: true})
	if err != nil {
		t.Fatal(err)
	}
	second := testItems("b", 5)
	if err := s.AddItems(live, second); err != nil {
		t.Fatal(err)
	}
	dup := []auditd.Item{{Key: "c-new", SourceID: "s", Path: "/n"}, first[7]}
	if err := s.AddItems(live, dup); auditd.ErrorCode(err) != auditd.EINVALID || err.(*auditd.Error).Field != "items[1].key" {
		t.Fatalf("a page repeating a key: %v, want EINVALID naming items[1].key", err)
	}
	if err := s.AddItems(live, testItems("c", 260)); err != nil {
		t.Fatal(err)
	}
	want := append(append(append([]auditd.Item{}, first...), second...), testItems("c", 260)...)
	if n := live.Run().ItemCount; n != len(want) {
		t.Fatalf("item count %d, want %d", n, len(want))
	}
	keys, _ := listKeys(t, s, live.ID(), 7)
	if len(keys) != len(want) {
		t.Fatalf("listed %d, want %d", len(keys), len(want))
	}
	for i := range want {
		if keys[i] != want[i].Key {
			t.Fatalf("item %d: %s, want %s", i, keys[i], want[i].Key)
		}
	}
	if _, err := s.Item(context.Background(), live.ID(), "c-new"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
		t.Fatalf("an item of the refused page: %v, want ENOTFOUND", err)
	}
	// The feed reads every page, a chunk at a time, and skips what ended.
	p := ResultPut(live.ID(), want[301].Key, &auditd.ItemResult{Outcome: auditd.ItemSucceeded})
	if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(p.Bucket).Put(p.Key, p.Value) }); err != nil {
		t.Fatal(err)
	}
	fed := 0
	for from := uint32(0); ; {
		items, next, err := s.Todo(live.ID(), "s", from, uint32(len(want)), 64)
		if err != nil {
			t.Fatal(err)
		}
		fed += len(items)
		if next == from {
			break
		}
		from = next
	}
	if fed != len(want)-1 {
		t.Fatalf("fed %d items, want %d (all but the one that ended)", fed, len(want)-1)
	}
	r, items, err := s.Resume(live.ID())
	if err != nil || items != nil || r.Run().ItemCount != len(want) || r.legacy {
		t.Fatalf("resume: %d items (want none: read a chunk at a time), count %d, legacy %v, %v", len(items), r.Run().ItemCount, r.legacy, err)
	}
}

// TestResumeLegacyRun: a run an earlier build stored (items in fixed
// chunks, results kept in memory until the end) resumes with the results
// the ledger rebuilt stored at its start; a proxy-mode one with the items
// the ledger queued.
func TestResumeLegacyRun(t *testing.T) {
	s, _ := openTestStore(t)
	items := testItems("old", 10)
	rec := &record{Run: auditd.Run{ID: "01OLDBATCH", Name: "old", Status: auditd.RunRunning, ItemCount: 10}}
	if err := s.db.Update(func(tx *bolt.Tx) error {
		if err := saveRun(tx, rec); err != nil {
			return err
		}
		return putItems(tx, rec.ID, items)
	}); err != nil {
		t.Fatal(err)
	}
	live, got, err := s.Resume(rec.ID)
	if err != nil || len(got) != 10 || !live.legacy {
		t.Fatalf("resume: %d items, legacy %v, %v", len(got), live.legacy, err)
	}
	live.Rebuilt(items[3].Key, &auditd.ItemResult{Outcome: auditd.ItemSucceeded, Advertised: -1})
	if err := s.Start(live); err != nil {
		t.Fatal(err)
	}
	v, err := s.Item(context.Background(), rec.ID, items[3].Key)
	if err != nil || v.Result == nil || v.Result.Outcome != auditd.ItemSucceeded {
		t.Fatalf("the rebuilt result: %+v, %v", v.Result, err)
	}

	prec := &record{Run: auditd.Run{ID: "01OLDPROXY", Name: "old proxy", Status: auditd.RunRunning, Mode: auditd.RunProxy}}
	if err := s.db.Update(func(tx *bolt.Tx) error { return saveRun(tx, prec) }); err != nil {
		t.Fatal(err)
	}
	plive, _, err := s.Resume(prec.ID)
	if err != nil || !plive.legacy {
		t.Fatalf("resume proxy: legacy %v, %v", plive.legacy, err)
	}
	for _, k := range []string{"GET /a", "GET /b"} {
		if err := plive.RestoreItem(auditd.Item{Key: k, SourceID: "s", Method: "GET", Path: "/" + k[5:]}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Start(plive); err != nil {
		t.Fatal(err)
	}
	if keys, _ := listKeys(t, s, prec.ID, 1); len(keys) != 2 || keys[0] != "GET /a" || keys[1] != "GET /b" || plive.Run().ItemCount != 2 {
		t.Fatalf("restored items %v, count %d", keys, plive.Run().ItemCount)
	}
	// A new request of the resumed run takes the next index.
	if err := plive.AddItem(auditd.Item{Key: "GET /a", SourceID: "s"}); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Fatalf("a restored key again: %v, want ECONFLICT", err)
	}
}
