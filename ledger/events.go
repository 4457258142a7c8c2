package ledger

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// The events bucket holds two kinds of entries (see doc.go):
//
//	8-byte seq                    -> one record: PrevHash | canonical | Hash
//	8-byte first | 8-byte last    -> a block: the records first to last, each
//	                                 a uvarint length and the record
//
// A block holds consecutive records of one commit group. bbolt's cost is
// per key (a cursor, a copy of the key and a slot in its leaf for every
// Put), and a commit group holds hundreds of events, so packing them cuts
// most of the ledger's puts (BenchmarkAppendParallel: +18% events/s when
// blocks came). A record stored alone keeps the first form, which is also
// all that ledgers written before blocks hold.

// maxBlock is the most bytes of framed records one block takes, unless a
// single record is larger (it is then stored alone). Blocks this size pack
// two or more to a 4 KiB page, as single records did; a value larger than
// a page gets pages of its own, which bbolt allocates outside its page
// pool. (bbolt does not split a node of four entries or fewer, so a few
// blocks can still share an overflowing node.)
const maxBlock = 2000

// putRecords stores records, consecutive events of one commit group keyed
// by their seq, packing them into blocks of at most maxBlock bytes built in
// *scratch: bbolt keeps the values until the transaction ends, so scratch
// must not be reused before then.
func putRecords(events *bolt.Bucket, records []kv, scratch *[]byte) error {
	need := 0
	for _, r := range records {
		need += binary.MaxVarintLen32 + len(r.val)
	}
	if cap(*scratch) < need {
		*scratch = make([]byte, 0, need)
	}
	buf := (*scratch)[:0]
	for i := 0; i < len(records); {
		// The block is records[i:j].
		j, size := i, 0
		for j < len(records) {
			n := uvarintLen(uint64(len(records[j].val))) + len(records[j].val)
			if j > i && size+n > maxBlock {
				break
			}
			size += n
			j++
		}
		first := records[i]
		if j == i+1 {
			if err := events.Put(first.key, first.val); err != nil {
				return fmt.Errorf("append event %d: %w", binary.BigEndian.Uint64(first.key), err)
			}
			i = j
			continue
		}
		start := len(buf)
		for _, r := range records[i:j] {
			buf = binary.AppendUvarint(buf, uint64(len(r.val)))
			buf = append(buf, r.val...)
		}
		var key [16]byte // bbolt copies the key
		copy(key[:8], first.key)
		copy(key[8:], records[j-1].key)
		if err := events.Put(key[:], buf[start:len(buf):len(buf)]); err != nil {
			return fmt.Errorf("append events %d to %d: %w", binary.BigEndian.Uint64(first.key), binary.BigEndian.Uint64(records[j-1].key), err)
		}
		i = j
	}
	*scratch = buf
	return nil
}

// entrySpan returns the first and last seq an events entry's key covers.
func entrySpan(k []byte) (first, last uint64, ok bool) {
	switch len(k) {
	case 8:
		s := binary.BigEndian.Uint64(k)
		return s, s, s > 0
	case 16:
		first, last = binary.BigEndian.Uint64(k[:8]), binary.BigEndian.Uint64(k[8:])
		return first, last, first > 0 && first < last
	}
	return 0, 0, false
}

// eventsCursor reads the events bucket record by record, whichever kind of
// entry holds them. Its methods return the seq of a record and the record
// (valid while the transaction is), a nil record past the last one, or an
// error wrapping ErrCorrupt that names where the bucket stops making sense
// (*corruptAt, for Verify).
type eventsCursor struct {
	c     *bolt.Cursor
	seq   uint64 // the seq of the next record in rest
	last  uint64 // the last seq of the entry being read
	rest  []byte // the entry's records not read yet
	block bool   // rest is framed records, not one bare record
}

// corruptAt is an events entry that cannot be read: Verify reports Seq.
type corruptAt struct {
	Seq uint64
	Msg string
}

func (e *corruptAt) Error() string { return fmt.Sprintf("%v: %s", ErrCorrupt, e.Msg) }
func (e *corruptAt) Unwrap() error { return ErrCorrupt }

func newEventsCursor(b *bolt.Bucket) *eventsCursor { return &eventsCursor{c: b.Cursor()} }

// first returns the first record.
func (ec *eventsCursor) first() (uint64, []byte, error) {
	k, v := ec.c.First()
	return ec.load(k, v, 1)
}

// seek returns the record seq, or the first one after it when the bucket
// has no seq.
func (ec *eventsCursor) seek(seq uint64) (uint64, []byte, error) {
	k, v := ec.c.Seek(seqKey(seq))
	if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) != seq {
		// seq may be inside the block before: its key starts earlier.
		var pk, pv []byte
		if k == nil {
			pk, pv = ec.c.Last()
		} else {
			pk, pv = ec.c.Prev()
		}
		if _, last, ok := entrySpan(pk); ok && last >= seq {
			k, v = pk, pv
		} else {
			k, v = ec.c.Seek(seqKey(seq))
		}
	}
	s, rec, err := ec.load(k, v, seq)
	for err == nil && rec != nil && s < seq {
		s, rec, err = ec.next()
	}
	return s, rec, err
}

// at returns record seq, which must not come before the last one read:
// from the entry being read when it holds seq, by a seek otherwise. It
// returns a nil record when the bucket has no seq.
func (ec *eventsCursor) at(seq uint64) ([]byte, error) {
	if ec.rest == nil || seq < ec.seq || seq > ec.last {
		s, rec, err := ec.seek(seq)
		if err != nil || s != seq {
			return nil, err
		}
		return rec, nil
	}
	for {
		s, rec, err := ec.next()
		if err != nil || rec == nil || s > seq {
			return nil, err
		}
		if s == seq {
			return rec, nil
		}
	}
}

// next returns the record after the last one returned.
func (ec *eventsCursor) next() (uint64, []byte, error) {
	if ec.rest == nil {
		k, v := ec.c.Next()
		return ec.load(k, v, ec.last+1)
	}
	s := ec.seq
	if !ec.block {
		rec := ec.rest
		ec.rest, ec.seq = nil, s+1
		return s, rec, nil
	}
	n, w := binary.Uvarint(ec.rest)
	if w <= 0 || n > uint64(len(ec.rest)-w) {
		return 0, nil, &corruptAt{s, fmt.Sprintf("block of events to %d: event %d is cut short", ec.last, s)}
	}
	rec := ec.rest[w : w+int(n)]
	ec.rest, ec.seq = ec.rest[w+int(n):], s+1
	// A block that ends early is reported when the missing record is
	// asked for, so that the one before it is still read and checked.
	if s == ec.last {
		if len(ec.rest) > 0 {
			return 0, nil, &corruptAt{s, fmt.Sprintf("block of events to %d: bytes after its last event", ec.last)}
		}
		ec.rest = nil
	}
	return s, rec, nil
}

// load starts reading the entry k, v (nil past the last) and returns its
// first record. want is the seq the caller expects it to start with, for
// the error's sake; 0 when any will do.
func (ec *eventsCursor) load(k, v []byte, want uint64) (uint64, []byte, error) {
	ec.rest = nil
	if k == nil {
		return 0, nil, nil
	}
	first, last, ok := entrySpan(k)
	if !ok && want == 0 {
		return 0, nil, &corruptAt{1, fmt.Sprintf("malformed events key %x", k)}
	} else if !ok {
		return 0, nil, &corruptAt{want, fmt.Sprintf("malformed key %x where event %d belongs", k, want)}
	}
	ec.seq, ec.last, ec.block = first, last, len(k) == 16
	ec.rest = v
	if ec.rest == nil {
		ec.rest = []byte{} // a bare record may be empty, and is then too short
	}
	return ec.next()
}

// lastRecord returns the seq and record of the bucket's last event; a nil
// record when it has none.
func lastRecord(events *bolt.Bucket) (uint64, []byte, error) {
	ec := newEventsCursor(events)
	k, v := ec.c.Last()
	s, rec, err := ec.load(k, v, 0)
	for err == nil && rec != nil && s < ec.last {
		s, rec, err = ec.next()
	}
	return s, rec, err
}

// headSeq is the seq of the bucket's last event, from its key alone; 0 when
// it has none.
func headSeq(events *bolt.Bucket) uint64 {
	k, _ := events.Cursor().Last()
	if _, last, ok := entrySpan(k); ok {
		return last
	}
	return 0
}

// getRecord returns record seq, or ErrNotFound.
func getRecord(events *bolt.Bucket, seq uint64) ([]byte, error) {
	if events == nil {
		return nil, ErrNotFound
	}
	rec, err := newEventsCursor(events).at(seq)
	if err != nil {
		return nil, err
	}
	if rec == nil {
		return nil, ErrNotFound
	}
	return rec, nil
}
