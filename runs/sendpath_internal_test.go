package runs

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/seal"
	bolt "go.etcd.io/bbolt"
)

// TestSendPathsSealedUntilTheEnd: an item's path as sent (its credentials
// unredacted) is in the bbolt file only sealed; a resume under the same
// key feeds it back (Todo), one under another key LostSendPath; the run's
// end forgets it.
func TestSendPathsSealedUntilTheEnd(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auditd.db")
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	box := seal.Ephemeral()
	s, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}, Seal: box})
	if err != nil {
		t.Fatal(err)
	}
	const sent = "/q?token=SENDPATHSECRET&f=json"
	live, err := s.Create(auditd.Run{Name: "r", Status: auditd.RunRunning, CreatedAt: time.Now()}, auditd.NewRun{Items: []auditd.Item{
		{Key: "a", SourceID: "s", Method: "GET", Path: "/q?token=REDACTED&f=json", SendPath: sent},
		{Key: "b", SourceID: "s", Method: "GET", Path: "/plain"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := live.ID()
	db.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("SENDPATHSECRET")) {
		t.Fatal("the bbolt file holds the path as sent in the clear")
	}

	reopen := func(box *seal.Box) (*Store, *bolt.DB) {
		db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		s, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}, Seal: box})
		if err != nil {
			t.Fatal(err)
		}
		return s, db
	}
	// The workers' feed (Todo) carries the paths as sent; a resume of a
	// run stored in pages brings no items of its own.
	todo := func(s *Store) []auditd.Item {
		t.Helper()
		items, _, err := s.Todo(id, "s", 0, 2, 10)
		if err != nil || len(items) != 2 {
			t.Fatalf("todo: %+v, %v", items, err)
		}
		return items
	}
	s, db = reopen(seal.Ephemeral())
	if _, items, err := s.Resume(id); err != nil || items != nil {
		t.Fatalf("resume under another key: %+v, %v", items, err)
	}
	if items := todo(s); items[0].SendPath != LostSendPath || items[1].SendPath != "" {
		t.Fatalf("fed under another key: %+v", items)
	}
	db.Close()

	s, db = reopen(box)
	defer db.Close()
	r, _, err := s.Resume(id)
	if err != nil {
		t.Fatal(err)
	}
	if items := todo(s); items[0].SendPath != sent || items[0].Path != "/q?token=REDACTED&f=json" {
		t.Fatalf("fed: %+v", items)
	}
	if err := s.End(r, &auditd.Event{Outcome: auditd.Outcome(auditd.RunSucceeded), Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if items := todo(s); items[0].SendPath != "" {
		t.Fatalf("after the end: %+v", items)
	}
}
