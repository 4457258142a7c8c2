package ledger_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// eventsEntry is one entry of the events bucket: one record (an 8-byte
// key) or a block of them (first and last seq).
type eventsEntry struct {
	key         []byte
	first, last uint64
	val         []byte
}

func eventsEntries(tb testing.TB, db *bolt.DB) []eventsEntry {
	tb.Helper()
	var out []eventsEntry
	err := db.View(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("ledger.events")).ForEach(func(k, v []byte) error {
			e := eventsEntry{key: bytes.Clone(k), val: bytes.Clone(v)}
			switch len(k) {
			case 8:
				e.first = binary.BigEndian.Uint64(k)
				e.last = e.first
			case 16:
				e.first, e.last = binary.BigEndian.Uint64(k[:8]), binary.BigEndian.Uint64(k[8:])
			default:
				tb.Fatalf("events key %x", k)
			}
			out = append(out, e)
			return nil
		})
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// records splits a block's value into its framed records.
func (e eventsEntry) records(tb testing.TB) [][]byte {
	tb.Helper()
	var recs [][]byte
	for v := e.val; len(v) > 0; {
		n, w := binary.Uvarint(v)
		if w <= 0 || n > uint64(len(v)-w) {
			tb.Fatalf("block %d to %d: bad framing", e.first, e.last)
		}
		recs = append(recs, v[w:w+int(n)])
		v = v[w+int(n):]
	}
	return recs
}

// frame builds a block's value from records.
func frame(recs [][]byte) []byte {
	var v []byte
	for _, r := range recs {
		v = binary.AppendUvarint(v, uint64(len(r)))
		v = append(v, r...)
	}
	return v
}

// A commit group's events are stored in blocks, a record too large for one
// alone; every reader finds every event, from anywhere in a block, and a
// reopened ledger goes on from the last event of the last block.
func TestBlocksHoldACommitGroup(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	appendGroups(t, l, []string{"run1", "run2"}, 1, 70, 5)
	big := sampleEvent("run1", 1000)
	big.Detail = strings.Repeat("x", 3000) // more than a block holds
	batch := []auditd.Event{sampleEvent("run1", 1001), big, sampleEvent("run2", 1002), sampleEvent("run2", 1003)}
	if _, err := l.AppendBatch(context.Background(), batch); err != nil {
		t.Fatal(err)
	}
	const head = 80
	if h, _ := l.Head(); h != head {
		t.Fatalf("head %d, want %d", h, head)
	}

	entries := eventsEntries(t, db)
	next, blocks := uint64(1), 0
	for _, e := range entries {
		if e.first != next {
			t.Fatalf("entry starts at %d, want %d", e.first, next)
		}
		next = e.last + 1
		if e.first < e.last {
			blocks++
			if len(e.val) > 2000 {
				t.Errorf("block %d to %d holds %d bytes", e.first, e.last, len(e.val))
			}
			if n := len(e.records(t)); n != int(e.last-e.first+1) {
				t.Errorf("block %d to %d holds %d records", e.first, e.last, n)
			}
		}
	}
	if blocks == 0 || next != head+1 {
		t.Fatalf("%d blocks over %d entries ending at %d", blocks, len(entries), next-1)
	}
	// The first event stands alone (a group of one), and so does the big one.
	if bigEntry := findEntry(t, entries, 78); entries[0].last != 1 || bigEntry.first != 78 || bigEntry.last != 78 || !bytes.Contains(bigEntry.val, []byte(big.Detail)) {
		t.Errorf("events 1 and 78 are not stored alone: entries %x and %x", entries[0].key, bigEntry.key)
	}

	var scanned []auditd.Event
	if err := l.Scan(1, 0, func(e *auditd.Event) error { scanned = append(scanned, *e); return nil }); err != nil || len(scanned) != head {
		t.Fatalf("Scan: %d events, %v", len(scanned), err)
	}
	for _, want := range scanned {
		got, err := l.Event(want.Seq)
		if err != nil || got != want {
			t.Fatalf("Event(%d) = %+v, %v; want %+v", want.Seq, got, err, want)
		}
	}
	// Ranges that start and end inside blocks.
	for _, r := range [][2]uint64{{3, 9}, {40, 41}, {76, 80}, {80, 80}, {2, 2}} {
		var got []uint64
		if err := l.Scan(r[0], r[1], func(e *auditd.Event) error { got = append(got, e.Seq); return nil }); err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(got) != fmt.Sprint(seqs(r[0], r[1])) {
			t.Errorf("Scan(%d, %d) = %v", r[0], r[1], got)
		}
	}
	if _, err := l.Event(head + 1); err == nil {
		t.Errorf("Event(%d) past the head: no error", head+1)
	}
	if seq, err := l.SeqAt(scanned[40].Time); err != nil || seq > 41 || !scanned[seq-1].Time.Equal(scanned[40].Time) {
		t.Errorf("SeqAt(time of 41) = %d, %v", seq, err)
	}
	for _, seq := range []uint64{2, 40, 71, 78, 80} {
		p, err := l.Prove(seq)
		if err != nil {
			t.Fatalf("prove %d: %v", seq, err)
		}
		if e, _, err := p.Verify(l.PublicKey()); err != nil || e.Seq != seq {
			t.Fatalf("proof of %d: event %d, %v", seq, e.Seq, err)
		}
	}
	mustVerify(t, db, l.PublicKey(), nil)

	key := l.PublicKey()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	l = MustOpen(t, db, ledger.Options{})
	if h, hash := l.Head(); h != head || hash != scanned[head-1].Hash {
		t.Fatalf("reopened at %d, want %d", h, head)
	}
	appendGroups(t, l, []string{"run3"}, 12)
	if r := mustVerify(t, db, key, nil); r.Head != head+12 {
		t.Fatalf("verified to %d, want %d", r.Head, head+12)
	}
}

func findEntry(tb testing.TB, entries []eventsEntry, seq uint64) eventsEntry {
	tb.Helper()
	for _, e := range entries {
		if e.first <= seq && seq <= e.last {
			return e
		}
	}
	tb.Fatalf("no entry holds event %d", seq)
	return eventsEntry{}
}

// Verify names the event a tampered block no longer vouches for: the edited
// record, the first of a deleted block, the first a cut block lacks, the
// last before bytes added after it.
func TestVerifyNamesTamperInBlock(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	appendGroups(t, l, []string{"r"}, 1, 40)
	key := l.PublicKey()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	block := findEntry(t, eventsEntries(t, db), 2)
	if block.first != 2 || block.last < 5 {
		t.Fatalf("events 2 on are stored as %d to %d", block.first, block.last)
	}
	recs := block.records(t)
	third, last := block.first+2, block.last

	for _, tc := range []struct {
		name   string
		tamper func(b *bolt.Bucket) error
		want   uint64
	}{
		{"EditedRecord", func(b *bolt.Bucket) error {
			edited := bytes.Clone(recs[2])
			edited[len(edited)-40] ^= 1
			return b.Put(block.key, frame(append(append(append([][]byte{}, recs[:2]...), edited), recs[3:]...)))
		}, third},
		{"DeletedBlock", func(b *bolt.Bucket) error { return b.Delete(block.key) }, block.first},
		{"LastRecordCut", func(b *bolt.Bucket) error { return b.Put(block.key, frame(recs[:len(recs)-1])) }, last},
		{"RecordRemoved", func(b *bolt.Bucket) error {
			return b.Put(block.key, frame(append(append([][]byte{}, recs[:2]...), recs[3:]...)))
		}, third},
		{"BytesAppended", func(b *bolt.Bucket) error { return b.Put(block.key, append(bytes.Clone(block.val), 0)) }, last},
		{"LengthTooLong", func(b *bolt.Bucket) error {
			v := frame(recs[:2])
			v = binary.AppendUvarint(v, uint64(len(block.val)))
			return b.Put(block.key, append(v, frame(recs[2:])...))
		}, third},
		// The record before a cut, or one whose length swallows the rest
		// of the block, is still read, and named for its own hash.
		{"EditedThenCut", func(b *bolt.Bucket) error {
			edited := bytes.Clone(recs[2])
			edited[len(edited)-40] ^= 1
			return b.Put(block.key, frame(append(append([][]byte{}, recs[:2]...), edited)))
		}, third},
		{"LengthSwallowsRest", func(b *bolt.Bucket) error {
			rest := frame(recs[2:])
			_, w := binary.Uvarint(rest)
			v := binary.AppendUvarint(frame(recs[:2]), uint64(len(rest)-w))
			return b.Put(block.key, append(v, rest[w:]...))
		}, third},
		{"KeyClaimsOneMore", func(b *bolt.Bucket) error {
			if err := b.Delete(block.key); err != nil {
				return err
			}
			k := binary.BigEndian.AppendUint64(binary.BigEndian.AppendUint64(nil, block.first), block.last+1)
			return b.Put(k, block.val)
		}, last + 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			restore := eventsEntries(t, db)
			if err := db.Update(func(tx *bolt.Tx) error { return tc.tamper(tx.Bucket([]byte("ledger.events"))) }); err != nil {
				t.Fatal(err)
			}
			defer db.Update(func(tx *bolt.Tx) error {
				if err := tx.DeleteBucket([]byte("ledger.events")); err != nil {
					return err
				}
				b, err := tx.CreateBucket([]byte("ledger.events"))
				for _, e := range restore {
					if err == nil {
						err = b.Put(e.key, e.val)
					}
				}
				return err
			})
			r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: key})
			if err != nil || r.OK || r.FirstBad != tc.want {
				t.Fatalf("Verify = %+v, %v; want first bad %d", r, err, tc.want)
			}
		})
	}
	mustVerify(t, db, key, nil) // every case put the block back
}
