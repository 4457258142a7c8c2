package staging

import (
	"fmt"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Compact moves more than a chunk in several transactions, leaving the
// spool and the recent bucket empty, and so does Open when a crash left
// more than a chunk (its keys start again from 1, so nothing may stay).
// Within and across chunks the newest copy of a request wins.
func TestCompactInChunks(t *testing.T) {
	db, s, reopen := openInternal(t)
	t0 := time.Date(2026, 12, 4, 8, 0, 0, 0, time.UTC)
	const n = 2*compactChunk + 37
	// stage records n payloads and last good copies in a transaction
	// each; every request gets two copies, the newer in a later chunk.
	stage := func(s *Store, round int, stored bool) []Copy {
		t.Helper()
		var copies []Copy
		for i := range n {
			p := finishSmallInternal(t, s, fmt.Sprintf("payload %d of round %d", i, round))
			rec, _ := p.Record()
			c := Copy{Sum: p.Sum, FetchedAt: t0.Add(time.Duration(round*n+i) * time.Second), Run: "run"}
			lg := s.LastGoodRecord(fmt.Sprintf("req-%d", i%(n/2)), c)
			if err := db.Update(func(tx *bolt.Tx) error {
				if err := tx.Bucket(rec.Bucket).Put(rec.Key, rec.Value); err != nil {
					return err
				}
				return tx.Bucket(lg.Bucket).Put(lg.Key, lg.Value)
			}); err != nil {
				t.Fatal(err)
			}
			if stored {
				s.Stored([]auditd.Put{rec, lg})
			}
			copies = append(copies, c)
		}
		return copies
	}
	check := func(s *Store, copies []Copy, when string) {
		t.Helper()
		if err := db.View(func(tx *bolt.Tx) error {
			if k, _ := tx.Bucket(bucketSpool).Cursor().First(); k != nil {
				t.Errorf("%s: the spool still holds %x", when, k)
			}
			if k, _ := tx.Bucket(bucketRecent).Cursor().First(); k != nil {
				t.Errorf("%s: the recent bucket still holds %x", when, k)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if len(s.pending) != 0 || len(s.recent.byKey) != 0 {
			t.Errorf("%s: %d payloads and %d copies still kept in memory", when, len(s.pending), len(s.recent.byKey))
		}
		for i, c := range copies {
			if err := s.VerifyPayload(c.Sum); err != nil {
				t.Errorf("%s: payload %d: %v", when, i, err)
			}
		}
		for i := range n / 2 {
			want := copies[i+(n/2)*((n-1-i)/(n/2))] // the last copy of req-i
			if got, ok, err := s.LastGood(fmt.Sprintf("req-%d", i)); err != nil || !ok || got != want {
				t.Errorf("%s: req-%d: %+v, %t, %v; want %+v", when, i, got, ok, err, want)
			}
		}
	}

	copies := stage(s, 0, true)
	moved, err := s.Compact()
	if err != nil || moved != n {
		t.Fatalf("Compact moved %d payloads (%v), want %d", moved, err, n)
	}
	check(s, copies, "compacted")

	// A crash: records stored, Stored never told, the store reopened.
	copies = stage(s, 1, false)
	s = reopen()
	check(s, copies, "reopened")
}
