package ledger

import (
	"crypto/sha256"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// Record is one stored event as the tree and the chain see it: its
// canonical encoding (the leaf data of leaf Seq-1) and its chain hashes.
// Canonical is valid only while the function it was passed to runs.
type Record struct {
	Seq       uint64
	Canonical []byte
	PrevHash  [32]byte
	Hash      [32]byte
}

// ScanRecords visits the stored records with from <= Seq <= to in order,
// without decoding them: an evidence pack carries the leaf bytes exactly
// as they were hashed. It reads in chunks like Scan; to == 0 means the
// head as of the start. A gap or a short record is ErrCorrupt.
func (r *Reader) ScanRecords(from, to uint64, fn func(*Record) error) error {
	next, head := max(from, 1), to
	for {
		done, n := false, 0
		err := r.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte(bucketEvents))
			if b == nil {
				done = true
				return nil
			}
			if head == 0 {
				if head = headSeq(b); head == 0 {
					done = true
					return nil
				}
			}
			var rec Record
			ec := newEventsCursor(b)
			for seq, v, err := ec.seek(next); ; seq, v, err = ec.next() {
				if err != nil {
					return fmt.Errorf("scan records from %d: %w", next, err)
				}
				if v == nil || seq > head {
					if next <= head {
						return fmt.Errorf("scan records: %w: event %d missing", ErrCorrupt, next)
					}
					done = true
					return nil
				}
				if seq != next {
					return fmt.Errorf("scan records: %w: event %d missing", ErrCorrupt, next)
				}
				if n == scanChunk {
					return nil
				}
				if len(v) < 2*sha256.Size+1 {
					return fmt.Errorf("scan records: %w: record %d of %d bytes", ErrCorrupt, seq, len(v))
				}
				rec.Seq, rec.Canonical = seq, v[sha256.Size:len(v)-sha256.Size]
				copy(rec.PrevHash[:], v)
				copy(rec.Hash[:], v[len(v)-sha256.Size:])
				if err := fn(&rec); err != nil {
					return err
				}
				next, n = seq+1, n+1
			}
		})
		if err != nil || done {
			return err
		}
	}
}
