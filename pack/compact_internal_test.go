package pack

import (
	"context"
	"crypto/sha256"
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
)

// TestCompactRangeRebuildsRoots: the ledger's range proofs with the
// range's leaves give the tree's root at every size and range tried.
func TestCompactRangeRebuildsRoots(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())
	for range 40 {
		if _, err := l.Append(context.Background(), auditd.Event{Type: auditd.EventSourceChanged, SourceID: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	r := ledger.NewReader(db)
	var leaves []tlog.Hash
	r.ScanRecords(1, 0, func(rec *ledger.Record) error {
		leaves = append(leaves, sha256.Sum256(append([]byte{0}, rec.Canonical...)))
		return nil
	})
	for size := uint64(1); size <= 40; size++ {
		want, _ := r.TreeHash(size)
		for first := uint64(1); first <= size; first += 3 {
			for last := first; last <= size; last += 5 {
				p, err := r.ProveRange(first, last, size)
				if err != nil {
					t.Fatal(err)
				}
				c, err := newCompactRange(first-1, p.Left)
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range leaves[first-1 : last] {
					if err := c.push(0, h); err != nil {
						t.Fatal(err)
					}
				}
				if err := c.appendRight(size, p.Right); err != nil {
					t.Fatalf("%d-%d@%d: %v", first, last, size, err)
				}
				if c.root() != want {
					t.Fatalf("%d-%d@%d: root differs", first, last, size)
				}
				if len(p.Right) > 0 {
					c2, _ := newCompactRange(first-1, p.Left)
					for _, h := range leaves[first-1 : last] {
						c2.push(0, h)
					}
					if err := c2.appendRight(size, p.Right[1:]); err == nil && c2.root() == want {
						t.Fatalf("%d-%d@%d: a short right side still gives the root", first, last, size)
					}
				}
			}
		}
	}
}
