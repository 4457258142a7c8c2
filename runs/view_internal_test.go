package runs

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// TestItemsPagesAFinishedRun: a finished run's items come a page at a
// time, each page's cursor leading to the next, until every item is seen
// once in submission order.
func TestItemsPagesAFinishedRun(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	s, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}})
	if err != nil {
		t.Fatal(err)
	}
	items := testItems("r", 7)
	live, err := s.Create(auditd.Run{Name: "r", Status: auditd.RunRunning, CreatedAt: time.Now()}, auditd.NewRun{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.End(live, &auditd.Event{Outcome: auditd.Outcome(auditd.RunSucceeded), Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	var seen []string
	after := ""
	for page := 0; ; page++ {
		got, next, err := s.Items(context.Background(), live.ID(), after, 3)
		if err != nil {
			t.Fatalf("page %d after %q: %v", page, after, err)
		}
		for _, it := range got {
			seen = append(seen, it.Key)
		}
		if next == "" {
			break
		}
		after = next
	}
	if len(seen) != len(items) {
		t.Fatalf("paged %d items, want %d: %v", len(seen), len(items), seen)
	}
	for i := range items {
		if seen[i] != items[i].Key {
			t.Fatalf("item %d: %s, want %s", i, seen[i], items[i].Key)
		}
	}
}
