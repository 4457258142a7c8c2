package ledger

import (
	"bytes"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The run index keeps one entry per run per commit group (see doc.go), so a
// group costs one Put per run rather than one per event. Keying an entry by
// its last event lets a scan for the events after seq n seek straight to the
// first entry that holds one: every entry before it ends at n or earlier.

// runKey is the run index key of the entry of runID ending at seq. The run
// id is length-prefixed so that no run id is a prefix of another's keys.
func runKey(runID string, seq uint64) []byte {
	k := binary.AppendUvarint(make([]byte, 0, len(runID)+12), uint64(len(runID)))
	k = append(k, runID...)
	return binary.BigEndian.AppendUint64(k, seq)
}

// runIndex collects the run index entries of one commit group.
type runIndex struct {
	seqs map[string][]uint64 // run id -> its events in the group, in order
}

func (x *runIndex) reset() { clear(x.seqs) }

func (x *runIndex) add(runID string, seq uint64) {
	if runID == "" {
		return
	}
	if x.seqs == nil {
		x.seqs = make(map[string][]uint64)
	}
	x.seqs[runID] = append(x.seqs[runID], seq)
}

// put writes the group's entries to the runs bucket. Their keys and values
// are fresh: bbolt keeps them until the transaction ends.
func (x *runIndex) put(b *bolt.Bucket) error {
	for run, seqs := range x.seqs {
		last := seqs[len(seqs)-1]
		var val []byte
		for _, seq := range seqs[:len(seqs)-1] {
			val = binary.AppendUvarint(val, last-seq)
		}
		if err := b.Put(runKey(run, last), val); err != nil {
			return fmt.Errorf("index run %s at event %d: %w", run, last, err)
		}
	}
	return nil
}

// scanRunIndex calls fn with the sequence numbers after `after` that the
// runs bucket lists for runID, in order.
func scanRunIndex(runs *bolt.Bucket, runID string, after uint64, fn func(seq uint64) error) error {
	c := runs.Cursor()
	start := runKey(runID, after+1)
	prefix := start[:len(start)-8]
	later := func(seq uint64) error { // the entry's key, its last seq, is later by Seek
		if seq > after {
			return fn(seq)
		}
		return nil
	}
	for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		if len(k) != len(start) {
			return fmt.Errorf("%w: run index key %x malformed", ErrCorrupt, k)
		}
		if ok, err := runEntrySeqs(k, v, len(prefix), later); err != nil {
			return err
		} else if !ok {
			return fmt.Errorf("%w: run index entry %x malformed", ErrCorrupt, k)
		}
	}
	return nil
}

// runEntrySeqs calls fn with the seqs of the run index entry k, v (whose
// run prefix is prefix bytes long), in the order stored, the key's own
// last. ok is false, with fn called for the seqs before it, when the
// entry is malformed; err is fn's.
func runEntrySeqs(k, v []byte, prefix int, fn func(seq uint64) error) (ok bool, err error) {
	if len(k) != prefix+8 {
		return false, nil
	}
	last := binary.BigEndian.Uint64(k[prefix:])
	for len(v) > 0 {
		d, n := binary.Uvarint(v)
		if n <= 0 || d == 0 || d >= last {
			return false, nil
		}
		v = v[n:]
		if err := fn(last - d); err != nil {
			return true, err
		}
	}
	return true, fn(last)
}
