package runs

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// A pending page is seen by no view until it is committed: not listed,
// its items not found, the run's count unchanged; a stop before its
// commit leaves nothing a resume sees, and its keys free.
func TestPendingPageUntilCommitted(t *testing.T) {
	s, db := openTestStore(t)
	first := testItems("a", 10)
	live, err := s.Create(auditd.Run{Name: "r", Status: auditd.RunRunning, CreatedAt: time.Now(), Open: true, ItemCount: 10}, auditd.NewRun{Items: first, Open: true})
	if err != nil {
		t.Fatal(err)
	}
	id := live.ID()
	p, err := s.BeginItems(live)
	if err != nil {
		t.Fatal(err)
	}
	for _, prefix := range []string{"b", "c"} {
		if err := p.Add(testItems(prefix, 300)); err != nil {
			t.Fatal(err)
		}
	}
	hidden := func(when string) {
		t.Helper()
		if keys, _ := listKeys(t, s, id, 7); len(keys) != 10 {
			t.Fatalf("%s: listed %d items, want the 10 committed", when, len(keys))
		}
		if _, err := s.Item(context.Background(), id, "c-k00005"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
			t.Fatalf("%s: an item of the pending page: %v, want ENOTFOUND", when, err)
		}
	}
	hidden("pending")
	if live.Run().ItemCount != 10 {
		t.Fatalf("pending: the run counts %d items", live.Run().ItemCount)
	}

	// A stop: another store on the same file resumes the run.
	s2, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}})
	if err != nil {
		t.Fatal(err)
	}
	resumed, items, err := s2.Resume(id)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := s2.ItemsAt(id, 0, 1000)
	if err != nil || items != nil || len(stored) != 10 || resumed.Run().ItemCount != 10 {
		t.Fatalf("resumed with %d items stored (count %d; %d brought along), want the 10 committed: %v", len(stored), resumed.Run().ItemCount, len(items), err)
	}
	s = s2
	hidden("resumed")
	p, err = s.BeginItems(resumed)
	if err != nil {
		t.Fatal(err)
	}
	last := testItems("c", 400) // keys c-k00000 to c-k00399: the stopped page's and more
	if err := p.Add(last); err != nil {
		t.Fatalf("the keys of a page a stop left are taken: %v", err)
	}
	if err := p.Commit(); err != nil {
		t.Fatal(err)
	}
	keys, _ := listKeys(t, s, id, 64)
	if len(keys) != 410 || keys[10] != last[0].Key || resumed.Run().ItemCount != 410 {
		t.Fatalf("committed: %d listed, count %d", len(keys), resumed.Run().ItemCount)
	}
	if _, err := s.Item(context.Background(), id, "c-k00005"); err != nil {
		t.Fatalf("an item of the committed page: %v", err)
	}
}
