package staging

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// The last-good index, and how a copy enters it as soon as it is staged.
//
// A request's last good copy is usable, by its run and by any other, from
// the ledger commit that records it staged. Putting its index entry in
// that commit would rewrite a page of the index chosen at random for
// every item (the keys are hashes); instead the commit appends a record to
// the recent bucket (LastGoodRecord), whose last page is all an append
// touches, and once the ledger says it is stored (Stored) the store keeps
// the copy in memory, in recent. LastGood reads both. Compact moves the
// recent records into the index in key order, many to a transaction, at
// the end of a run, and Open moves what a crash left.

// Copy is a request's last good payload, as the last-good index holds it.
type Copy struct {
	Sum       string    // hex SHA-256 of the payload
	FetchedAt time.Time // when the item that fetched it ended
	// Run is the run that fetched it; empty for a copy indexed before
	// the index recorded runs.
	Run string
	// ContentType and ContentEncoding are the response's headers as the
	// client got them, so that the copy is served as it was fetched; empty
	// when not kept (a batch run's copy, or one indexed before).
	ContentType     string
	ContentEncoding string
}

// recentCopies are the copies recorded in the recent bucket since the
// last compaction: handed out and not yet stored (pending), and stored,
// newest per request (byKey). Store.mu guards it.
type recentCopies struct {
	next    uint64 // the last recent key handed out
	done    uint64 // the largest key a compaction moved
	pending map[uint64]recentCopy
	byKey   map[string]recentCopy
}

type recentCopy struct {
	key        uint64 // its record's key in the recent bucket
	requestKey string
	Copy
}

func newRecentCopies() recentCopies {
	return recentCopies{pending: map[uint64]recentCopy{}, byKey: map[string]recentCopy{}}
}

// newer reports whether a was fetched after b, or at the same time and
// recorded later.
func (a recentCopy) newer(b recentCopy) bool {
	return a.FetchedAt.After(b.FetchedAt) || a.FetchedAt.Equal(b.FetchedAt) && a.key > b.key
}

// keep keeps rc for its request unless a newer copy is kept.
func (r *recentCopies) keep(rc recentCopy) {
	if was, ok := r.byKey[rc.requestKey]; ok && !rc.newer(was) {
		return
	}
	r.byKey[rc.requestKey] = rc
}

// load keeps the copies of the recent bucket b (a read-only store's).
func (r *recentCopies) load(b *bolt.Bucket) {
	c := b.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		if key, rk, cp, ok := decodeRecent(k, v); ok {
			r.keep(recentCopy{key, rk, cp})
			r.next = max(r.next, key)
		}
	}
}

// compacted forgets the copies a compaction moved (moved holds their
// keys, in order): the index holds them.
func (r *recentCopies) compacted(moved []uint64) {
	if len(moved) == 0 {
		return
	}
	for rk, rc := range r.byKey {
		if _, found := slices.BinarySearch(moved, rc.key); found {
			delete(r.byKey, rk)
		}
	}
	r.done = max(r.done, moved[len(moved)-1])
}

// LastGoodRecord is the record that makes c the last good payload of a
// request, for the ledger to store in the transaction that records the
// payload staged (auditd.Put); once it is stored, Stored makes the copy
// usable, by every run, and if it never is, Unspool forgets it.
func (s *Store) LastGoodRecord(requestKey string, c Copy) auditd.Put {
	s.mu.Lock()
	s.recent.next++
	key := s.recent.next
	s.recent.pending[key] = recentCopy{key, requestKey, c}
	s.mu.Unlock()
	// Key and value in one array: bbolt copies the key, and keeps the
	// value until the transaction ends.
	b := make([]byte, 8, 8+binary.MaxVarintLen64+len(requestKey)+8+len(c.Sum)+3+len(c.Run)+len(c.ContentType)+len(c.ContentEncoding))
	binary.BigEndian.PutUint64(b, key)
	b = binary.AppendUvarint(b, uint64(len(requestKey)))
	b = append(b, requestKey...)
	b = appendLastGood(b, c)
	return auditd.Put{Bucket: bucketRecent, Key: b[:8:8], Value: b[8:]}
}

// Stored tells the store that the ledger stored puts, records it made: a
// last-good record among them makes its copy the request's last good one
// from now on, unless a newer one is.
func (s *Store) Stored(puts []auditd.Put) {
	for _, p := range puts {
		if !bytes.Equal(p.Bucket, bucketRecent) || len(p.Key) != 8 {
			continue
		}
		key := binary.BigEndian.Uint64(p.Key)
		s.mu.Lock()
		rc, ok := s.recent.pending[key]
		delete(s.recent.pending, key)
		moved := key <= s.recent.done
		s.mu.Unlock()
		// A compaction since the commit may have moved the record into
		// the index already; then it is not kept twice.
		if !ok || moved && !s.inRecent(p.Key) {
			continue
		}
		s.mu.Lock()
		s.recent.keep(rc)
		s.mu.Unlock()
	}
}

// inRecent reports whether the recent bucket still holds key (a read that
// fails counts as not).
func (s *Store) inRecent(key []byte) bool {
	found := false
	err := s.db.View(func(tx *bolt.Tx) error {
		found = tx.Bucket(bucketRecent).Get(key) != nil
		return nil
	})
	return err == nil && found
}

// SetLastGood records c as the last good payload of a request in the
// index, unless the index already holds a copy fetched later.
func (s *Store) SetLastGood(requestKey string, c Copy) error {
	return s.db.Update(func(tx *bolt.Tx) error { return putLastGood(tx.Bucket(bucketLastGood), requestKey, c) })
}

// putLastGood puts c as requestKey's entry in the index b, unless the
// entry there was fetched later.
func putLastGood(b *bolt.Bucket, requestKey string, c Copy) error {
	if was, ok := lastGoodAt(b.Get([]byte(requestKey))); ok && was.After(c.FetchedAt) {
		return nil
	}
	return b.Put([]byte(requestKey), appendLastGood(nil, c))
}

// decodeRecent reads a record of the recent bucket: its key, the request
// key, and the copy (a last-good entry).
func decodeRecent(k, v []byte) (key uint64, requestKey string, c Copy, ok bool) {
	key, rk, entry, ok := splitRecent(k, v)
	if !ok {
		return 0, "", Copy{}, false
	}
	c, ok = decodeLastGood(entry)
	return key, string(rk), c, ok
}

// splitRecent splits a record of the recent bucket into its key, the
// request key and its last-good entry, in the bytes as bbolt holds them.
func splitRecent(k, v []byte) (key uint64, requestKey, entry []byte, ok bool) {
	if len(k) != 8 {
		return 0, nil, nil, false
	}
	n, w := binary.Uvarint(v)
	if w <= 0 || n > uint64(len(v)-w) {
		return 0, nil, nil, false
	}
	return binary.BigEndian.Uint64(k), v[w : w+int(n)], v[w+int(n):], true
}

// appendLastGood appends c as a last-good entry: the time its payload was
// fetched (8 bytes, Unix nanoseconds, big-endian), the payload's hash,
// then, each after a zero byte and as far as the last one set, the run
// that fetched it, its content type and its content encoding (none holds
// a zero byte: run ids are ULIDs, and header values cannot).
func appendLastGood(b []byte, c Copy) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(c.FetchedAt.UnixNano()))
	b = append(b, c.Sum...)
	tail := []string{c.Run, c.ContentType, c.ContentEncoding}
	for len(tail) > 0 && tail[len(tail)-1] == "" {
		tail = tail[:len(tail)-1]
	}
	for _, f := range tail {
		b = append(append(b, 0), f...)
	}
	return b
}

// decodeLastGood reads a last-good entry (appendLastGood). Entries written
// before the index recorded runs end with the hash, and those written
// before it kept headers with the run.
func decodeLastGood(v []byte) (c Copy, ok bool) {
	at, ok := lastGoodAt(v)
	if !ok {
		return Copy{}, false
	}
	c.FetchedAt = at.UTC()
	f := append(strings.SplitN(string(v[8:]), "\x00", 4), "", "", "")
	c.Sum, c.Run, c.ContentType, c.ContentEncoding = f[0], f[1], f[2], f[3]
	return c, c.Sum != ""
}

// lastGoodAt reads only the time of a last-good entry.
func lastGoodAt(v []byte) (time.Time, bool) {
	if len(v) <= 8 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), true
}

// LastGood returns the last good payload of a request, if there is one:
// the newer of the index's entry and a copy stored since the last
// compaction.
func (s *Store) LastGood(requestKey string) (c Copy, ok bool, err error) {
	s.mu.Lock()
	rc, recent := s.recent.byKey[requestKey]
	s.mu.Unlock()
	err = s.db.View(func(tx *bolt.Tx) error {
		c, ok = decodeLastGood(tx.Bucket(bucketLastGood).Get([]byte(requestKey)))
		return nil
	})
	if recent && (!ok || !c.FetchedAt.After(rc.FetchedAt)) {
		return rc.Copy, true, err
	}
	return c, ok, err
}
