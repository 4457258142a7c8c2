package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// FuzzEventsCursor reads an events bucket holding one arbitrary entry
// before and after a record stored alone: whatever the entry's bytes, the
// cursor returns consecutive seqs, records cut from the entry's value, and
// either every record the key claims or an error wrapping ErrCorrupt; it
// never panics. (The file is outside input: Verify reads what an attacker
// may have written.)
func FuzzEventsCursor(f *testing.F) {
	rec := bytes.Repeat([]byte{7}, 70)
	block := binary.AppendUvarint(nil, uint64(len(rec)))
	block = append(block, rec...)
	block = binary.AppendUvarint(block, uint64(len(rec)))
	block = append(block, rec...)
	f.Add(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 2), 3), block)
	f.Add(binary.BigEndian.AppendUint64(nil, 2), rec)
	f.Add([]byte{1, 2, 3}, []byte{})
	f.Add(binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 2), 9), block[:50])

	db, err := bolt.Open(filepath.Join(f.TempDir(), "fuzz.db"), 0o600, nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { db.Close() })
	f.Fuzz(func(t *testing.T, k, v []byte) {
		if len(k) == 0 || len(k) > bolt.MaxKeySize {
			return
		}
		before, after := seqKey(1), seqKey(1<<40)
		err := db.Update(func(tx *bolt.Tx) error {
			_ = tx.DeleteBucket([]byte("events"))
			b, err := tx.CreateBucket([]byte("events"))
			for _, e := range [][2][]byte{{before, rec}, {k, v}, {after, rec}} {
				if err == nil {
					err = b.Put(e[0], e[1])
				}
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("events"))
			ec := newEventsCursor(b)
			var got []uint64
			for s, r, err := ec.first(); ; s, r, err = ec.next() {
				if err != nil {
					if !errors.Is(err, ErrCorrupt) {
						t.Fatalf("error %v does not wrap ErrCorrupt", err)
					}
					return nil
				}
				if r == nil {
					break
				}
				if !bytes.Equal(r, rec) && !bytes.Contains(v, r) {
					t.Fatalf("record of event %d is not cut from any entry", s)
				}
				if got = append(got, s); len(got) > len(v)+3 {
					t.Fatalf("%d records from %d bytes", len(got), len(v))
				}
			}
			if first, last, ok := entrySpan(k); ok && first > 1 && last < 1<<40 {
				// Read whole, the entry gave every record its key claims.
				want := []uint64{1}
				for s := first; s <= last; s++ {
					want = append(want, s)
				}
				want = append(want, 1<<40)
				if !slices.Equal(got, want) {
					t.Fatalf("read events %v, key %x claims %d to %d", got, k, first, last)
				}
			}
			// Lookups never panic either.
			for _, seq := range []uint64{1, 2, 3, 1 << 40, 1<<40 + 1} {
				getRecord(b, seq)
			}
			return nil
		})
	})
}

// headSeq reads the head off the last key, and none off a malformed one.
func TestHeadSeqIgnoresMalformedKey(t *testing.T) {
	db, err := bolt.Open(filepath.Join(t.TempDir(), "head.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	block := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 2), 9)
	for _, tc := range []struct {
		key  []byte
		want uint64
	}{
		{seqKey(7), 7},
		{block, 9},
		{binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, 10), 3), 0}, // first > last
		{[]byte{0xff}, 0}, // too short
	} {
		err := db.Update(func(tx *bolt.Tx) error {
			_ = tx.DeleteBucket([]byte("events"))
			b, err := tx.CreateBucket([]byte("events"))
			if err == nil {
				err = b.Put(tc.key, []byte("x"))
			}
			if got := headSeq(b); err == nil && got != tc.want {
				t.Errorf("headSeq with last key %x = %d, want %d", tc.key, got, tc.want)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
