package staging

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"
)

// compactChunk is the most records one compaction transaction moves. The
// payload bucket and the last-good index are keyed by hashes, so a
// transaction rewrites about one of their leaf pages per record it moves,
// and holds each page (and the branch pages above it) in memory until it
// commits; the share of branch pages a chunk touches grows with the
// index. A chunk of 256 holds a few MB whatever the size of the run or
// the index (docs/bench/fetch.md, "Runs at the scale of a state").
const compactChunk = 256

// Compact moves every spooled payload to the payload bucket, and every
// recent last-good copy to the last-good index, in chunks of at most
// compactChunk records, each in key order and in a transaction of its own,
// and says how many payloads it moved. Moving is always safe: a payload or
// a copy is found in either place. A record appended while Compact runs
// may be moved by it or left for the next. The fetch loop compacts every
// so many items and when a run ends; Open compacts what a crash left.
func (s *Store) Compact() (int, error) {
	// What was handed out before Compact began bounds its work: records
	// appended meanwhile cannot keep it going.
	s.mu.Lock()
	lastCopy, lastPayload := s.recent.next, s.spoolNext
	s.mu.Unlock()
	return s.compact(lastCopy, lastPayload)
}

// compact moves chunks until one is short or has moved the records up to
// lastCopy and the payloads up to lastPayload. Open passes the largest
// keys there are: the keys it hands out start again from 1, so it must
// empty the spool and the recent bucket.
func (s *Store) compact(lastCopy, lastPayload uint64) (int, error) {
	for {
		moved, err := s.compactCopies()
		if err != nil {
			return 0, fmt.Errorf("compact last good copies: %w", err)
		}
		if len(moved) < compactChunk || moved[len(moved)-1] >= lastCopy {
			break
		}
	}
	total := 0
	for {
		moved, last, err := s.compactPayloads()
		if err != nil {
			return total, fmt.Errorf("compact staged payloads: %w", err)
		}
		total += moved
		if moved < compactChunk || last >= lastPayload {
			return total, nil
		}
	}
}

// compactCopies moves the first chunk of the recent bucket into the index
// and returns the keys of the records it moved, in order.
func (s *Store) compactCopies() ([]uint64, error) {
	var moved []uint64
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		moved, err = compactRecent(tx, compactChunk)
		return err
	})
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.recent.compacted(moved)
	s.mu.Unlock()
	return moved, nil
}

// compactRecent moves the first most records of the recent bucket into
// the index, the newest per request, in key order, and deletes them. It
// returns the keys of the records it moved, in order. It works on the
// bytes as bbolt holds them, which stay valid until the transaction ends:
// the index entry is the record's own last-good entry. A copy of a later
// chunk replaces one of this chunk only if it is newer (putLastGood's
// rule, which newer follows too).
func compactRecent(tx *bolt.Tx, most int) ([]uint64, error) {
	type raw struct {
		requestKey, entry []byte
		at                int64
		key               uint64
	}
	var recs []raw
	var moved []uint64
	var malformed [][]byte
	recent := tx.Bucket(bucketRecent)
	c := recent.Cursor()
	for k, v := c.First(); k != nil && len(moved)+len(malformed) < most; k, v = c.Next() {
		if len(k) != 8 {
			malformed = append(malformed, k)
			continue
		}
		moved = append(moved, binary.BigEndian.Uint64(k))
		key, rk, entry, ok := splitRecent(k, v)
		if !ok {
			continue
		}
		at, ok := lastGoodAt(entry)
		if !ok {
			continue
		}
		recs = append(recs, raw{rk, entry, at.UnixNano(), key})
	}
	// By request, the newest of each last.
	slices.SortFunc(recs, func(a, b raw) int {
		if c := bytes.Compare(a.requestKey, b.requestKey); c != 0 {
			return c
		}
		if a.at != b.at {
			return cmp.Compare(a.at, b.at)
		}
		return cmp.Compare(a.key, b.key)
	})
	index := tx.Bucket(bucketLastGood)
	for i, r := range recs {
		if i+1 < len(recs) && bytes.Equal(recs[i+1].requestKey, r.requestKey) {
			continue
		}
		if was, ok := lastGoodAt(index.Get(r.requestKey)); ok && was.UnixNano() > r.at {
			continue
		}
		if err := index.Put(r.requestKey, r.entry); err != nil {
			return nil, err
		}
	}
	// Deleted after the puts: the entries put above stay readable until
	// the transaction ends.
	var key [8]byte
	for _, k := range moved {
		binary.BigEndian.PutUint64(key[:], k)
		if err := recent.Delete(key[:]); err != nil {
			return nil, err
		}
	}
	for _, k := range malformed {
		if err := recent.Delete(k); err != nil {
			return nil, err
		}
	}
	return moved, nil
}

// compactPayloads moves the first chunk of the spool to the payload
// bucket, in hash order, and says how many payloads it moved and the
// largest spool key among them.
func (s *Store) compactPayloads() (n int, last uint64, err error) {
	type spooled struct {
		sum [sha256.Size]byte
		key uint64
		val []byte // in the spool's pages: valid until the transaction ends
	}
	moved := make([]spooled, 0, compactChunk)
	var keys []byte // the payloads' keys, hex, one after another
	err = s.db.Update(func(tx *bolt.Tx) error {
		moved = moved[:0]
		spool := tx.Bucket(bucketSpool)
		c := spool.Cursor()
		for k, v := c.First(); k != nil && len(moved) < compactChunk; k, v = c.Next() {
			if len(k) != 8 || len(v) < sha256.Size {
				return fmt.Errorf("spool entry %x is malformed", k)
			}
			moved = append(moved, spooled{[sha256.Size]byte(v), binary.BigEndian.Uint64(k), v[sha256.Size:]})
		}
		if len(moved) == 0 {
			return nil
		}
		// Hex keeps the order of the bytes it encodes.
		byHash := slices.Clone(moved)
		slices.SortFunc(byHash, func(a, b spooled) int { return bytes.Compare(a.sum[:], b.sum[:]) })
		// The keys, hex, cut from one buffer: bbolt keeps them until the
		// transaction ends.
		keys = make([]byte, 0, len(moved)*hex.EncodedLen(sha256.Size))
		payloads := tx.Bucket(bucketInline)
		for _, p := range byHash {
			start := len(keys)
			keys = hex.AppendEncode(keys, p.sum[:])
			if err := payloads.Put(keys[start:], p.val); err != nil {
				return err
			}
		}
		// Deleted after the puts: the values put above stay readable
		// until the transaction ends.
		var key [8]byte
		for _, p := range moved {
			binary.BigEndian.PutUint64(key[:], p.key)
			if err := spool.Delete(key[:]); err != nil {
				return err
			}
		}
		last = moved[len(moved)-1].key // the spool is in key order
		moved = byHash
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	const hexLen = 2 * sha256.Size
	for i, p := range moved {
		if sum := keys[i*hexLen : (i+1)*hexLen]; s.pending[string(sum)] == p.key {
			delete(s.pending, string(sum))
		}
	}
	return len(moved), last, nil
}
