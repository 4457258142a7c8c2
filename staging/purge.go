package staging

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
)

// bucketPurged keeps a tombstone of every purged payload: payload hash ->
// the sequence number (8 bytes, big-endian) of the ledger event that
// recorded the purge. It is created by the first purge.
var bucketPurged = []byte("staging.purged")

// Purge deletes the payloads sums wherever they are kept (the spool, the
// payload bucket, a file) and every last-good entry naming one (in the
// index, recent or compacted), and keeps
// a tombstone of each, so that VerifyPayload and Open say a payload was
// purged rather than lost. seq is the ledger event that recorded the
// purge: the caller appends it first, so a crash leaves the record
// without the deletion, never the reverse. The retention package decides
// what may be purged; staging only deletes.
func (s *Store) Purge(seq uint64, sums []string) error {
	want := map[string]bool{}
	for _, sum := range sums {
		if !validSum(sum) {
			return fmt.Errorf("purge: %q is not a payload hash", sum)
		}
		want[sum] = true
	}
	s.mu.Lock()
	spooled := map[string]uint64{}
	for sum := range want {
		if k, ok := s.pending[sum]; ok {
			spooled[sum] = k
		}
	}
	s.mu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		tomb, err := tx.CreateBucketIfNotExists(bucketPurged)
		if err != nil {
			return err
		}
		inline, spool, lastGood := tx.Bucket(bucketInline), tx.Bucket(bucketSpool), tx.Bucket(bucketLastGood)
		for sum := range want {
			if err := inline.Delete([]byte(sum)); err != nil {
				return err
			}
			if k, ok := spooled[sum]; ok {
				if err := spool.Delete(binary.BigEndian.AppendUint64(nil, k)); err != nil {
					return err
				}
			}
			if err := tomb.Put([]byte(sum), binary.BigEndian.AppendUint64(nil, seq)); err != nil {
				return err
			}
		}
		var stale, staleRecent [][]byte
		c := lastGood.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if c, ok := decodeLastGood(v); ok && want[c.Sum] {
				stale = append(stale, append([]byte(nil), k...))
			}
		}
		recent := tx.Bucket(bucketRecent)
		c = recent.Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if _, _, c, ok := decodeRecent(k, v); ok && want[c.Sum] {
				staleRecent = append(staleRecent, append([]byte(nil), k...))
			}
		}
		for _, k := range stale {
			if err := lastGood.Delete(k); err != nil {
				return err
			}
		}
		for _, k := range staleRecent {
			if err := recent.Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("purge payloads: %w", err)
	}
	s.mu.Lock()
	for rk, c := range s.recent.byKey {
		if want[c.Sum] {
			delete(s.recent.byKey, rk)
		}
	}
	for sum, k := range spooled {
		if s.pending[sum] == k {
			delete(s.pending, sum)
		}
	}
	s.mu.Unlock()
	for sum := range want {
		if err := os.Remove(s.path(sum)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("purge payload %s: %w", sum, err)
		}
	}
	return nil
}

// Purged reports whether the payload sum was purged, and by which ledger
// event.
func (s *Store) Purged(sum string) (seq uint64, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketPurged); b != nil {
			if v := b.Get([]byte(sum)); len(v) == 8 {
				seq, ok = binary.BigEndian.Uint64(v), true
			}
		}
		return nil
	})
	return seq, ok, err
}

// notFound is ErrNotFound, and for a purged payload also auditd.ErrPurged,
// naming the event that recorded the purge.
func (s *Store) notFound(sum string) error {
	if seq, ok, err := s.Purged(sum); err == nil && ok {
		return fmt.Errorf("payload %s: %w: %w at event %d", sum, ErrNotFound, auditd.ErrPurged, seq)
	}
	return ErrNotFound
}
