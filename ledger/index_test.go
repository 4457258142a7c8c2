package ledger_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// indexedLedger appends, group by group, the events of three runs of three
// items each (two events an item) and a few keyed events, and returns the
// seqs of each item's events.
func indexedLedger(t *testing.T) (*bolt.DB, *ledger.Ledger, map[string][]uint64) {
	t.Helper()
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	items := map[string][]uint64{}
	for g := range 3 {
		var batch []auditd.Event
		for _, run := range []string{"run-a", "run-b", "run-c"} {
			for i := range 3 {
				if i%3 != g {
					continue
				}
				for n := range 2 {
					e := sampleEvent(run, i)
					e.Attempt = uint32(n + 1)
					batch = append(batch, e)
				}
			}
		}
		keyed := auditd.Event{Type: auditd.EventSourceChanged, Principal: "op", IdempotencyKey: fmt.Sprintf("key-%d", g)}
		batch = append(batch, keyed)
		stored, err := l.AppendBatch(context.Background(), batch)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range stored {
			if e.RunID != "" {
				k := e.RunID + "/" + e.ItemKey
				items[k] = append(items[k], e.Seq)
			}
		}
	}
	mustVerify(t, db, l.PublicKey(), nil)
	return db, l, items
}

func runIndexKey(run string, seq uint64) []byte {
	k := binary.AppendUvarint(nil, uint64(len(run)))
	k = append(k, run...)
	return binary.BigEndian.AppendUint64(k, seq)
}

// rewriteRun replaces run's index entries by one entry per kept seq list.
func rewriteRun(t *testing.T, db *bolt.DB, run string, keep func(seq uint64) bool) {
	t.Helper()
	err := db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("ledger.runs"))
		prefix := runIndexKey(run, 0)
		prefix = prefix[:len(prefix)-8]
		var seqs []uint64
		var keys [][]byte
		c := b.Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			last := binary.BigEndian.Uint64(k[len(prefix):])
			for len(v) > 0 {
				d, n := binary.Uvarint(v)
				v = v[n:]
				seqs = append(seqs, last-d)
			}
			seqs = append(seqs, last)
			keys = append(keys, bytes.Clone(k))
		}
		for _, k := range keys {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		slices.Sort(seqs)
		for _, s := range seqs {
			if keep(s) {
				if err := b.Put(runIndexKey(run, s), nil); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func verifyIndex(t *testing.T, db *bolt.DB, l *ledger.Ledger) *ledger.Report {
	t.Helper()
	r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: l.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	if r.OK {
		t.Fatal("verify says intact after the index was tampered with")
	}
	if r.Problem != "" || len(r.Damage) > 0 {
		t.Errorf("an index tamper reported as chain or page damage: %q %v", r.Problem, r.Damage)
	}
	return r
}

func mentions(t *testing.T, r *ledger.Report, wants ...string) {
	t.Helper()
	all := strings.Join(r.Index, "\n")
	for _, w := range wants {
		if !strings.Contains(all, w) {
			t.Errorf("index findings lack %q:\n%s", w, all)
		}
	}
}

// Verify holds the run index and the idempotency index to the events:
// entries removed, added or moved are named.
func TestVerifyNamesIndexTampering(t *testing.T) {
	t.Run("ItemRemovedFromRun", func(t *testing.T) {
		db, l, items := indexedLedger(t)
		gone := items["run-a/parcels-0001"]
		rewriteRun(t, db, "run-a", func(s uint64) bool { return !slices.Contains(gone, s) })
		r := verifyIndex(t, db, l)
		for _, s := range gone {
			mentions(t, r, fmt.Sprintf(`event %d of run "run-a" is missing`, s))
		}
	})
	t.Run("EntryAdded", func(t *testing.T) {
		db, l, items := indexedLedger(t)
		other := items["run-b/parcels-0002"][0]
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("ledger.runs")).Put(runIndexKey("run-a", other), nil)
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l), fmt.Sprintf(`lists event %d under run "run-a", which it is not part of`, other))
	})
	t.Run("EntryMoved", func(t *testing.T) {
		db, l, items := indexedLedger(t)
		moved := items["run-c/parcels-0000"][1]
		rewriteRun(t, db, "run-c", func(s uint64) bool { return s != moved })
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("ledger.runs")).Put(runIndexKey("run-b", moved), nil)
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l),
			fmt.Sprintf(`event %d of run "run-c" is missing`, moved),
			fmt.Sprintf(`lists event %d under run "run-b"`, moved))
	})
	t.Run("RunWithoutEvents", func(t *testing.T) {
		db, l, _ := indexedLedger(t)
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("ledger.runs")).Put(runIndexKey("run-z", 3), nil)
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l), `lists run "run-z", which has no events`)
	})
	t.Run("KeyRemoved", func(t *testing.T) {
		db, l, _ := indexedLedger(t)
		var seq uint64
		if err := db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("ledger.idempotency"))
			seq = binary.BigEndian.Uint64(b.Get([]byte("key-1")))
			return b.Delete([]byte("key-1"))
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l), fmt.Sprintf("the key of event %d is missing", seq))
	})
	t.Run("KeyMoved", func(t *testing.T) {
		db, l, _ := indexedLedger(t)
		var seq uint64
		if err := db.Update(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("ledger.idempotency"))
			seq = binary.BigEndian.Uint64(b.Get([]byte("key-2")))
			return b.Put([]byte("key-2"), binary.BigEndian.AppendUint64(nil, 1))
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l), fmt.Sprintf("the key of event %d points at event 1", seq))
	})
	t.Run("KeyAdded", func(t *testing.T) {
		db, l, _ := indexedLedger(t)
		if err := db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket([]byte("ledger.idempotency")).Put([]byte("stray"), binary.BigEndian.AppendUint64(nil, 2))
		}); err != nil {
			t.Fatal(err)
		}
		mentions(t, verifyIndex(t, db, l), `key "stray" points at event 2, which does not carry it`)
	})
}
