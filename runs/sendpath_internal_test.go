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
// key gets it back, one under another key gets LostSendPath; the run's
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
	s, db = reopen(seal.Ephemeral())
	_, items, err := s.Resume(id)
	if err != nil || items[0].SendPath != LostSendPath || items[1].SendPath != "" {
		t.Fatalf("resume under another key: %+v, %v", items, err)
	}
	db.Close()

	s, db = reopen(box)
	defer db.Close()
	r, items, err := s.Resume(id)
	if err != nil || items[0].SendPath != sent || items[0].Path != "/q?token=REDACTED&f=json" {
		t.Fatalf("resume: %+v, %v", items, err)
	}
	if err := s.End(r, &auditd.Event{Outcome: auditd.Outcome(auditd.RunSucceeded), Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, items, err = s.Resume(id); err != nil || items[0].SendPath != "" {
		t.Fatalf("after the end: %+v, %v", items, err)
	}
}
