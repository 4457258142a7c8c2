package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// indexCheck holds the run index and the idempotency index to the events,
// which Verify reads in order: every event of a run is listed under its
// run, in order, once; every listed seq is an event of that run; every
// idempotency key points at the one event that carries it, and no key at
// an event that does not. It keeps a cursor per run seen, not the index.
type indexCheck struct {
	runs, idem *bolt.Bucket
	iters      map[string]*runIter
	keyed      int // events with an idempotency key
	r          *Report
	more       int // findings past maxFindings
}

func newIndexCheck(tx *bolt.Tx, r *Report) *indexCheck {
	return &indexCheck{runs: tx.Bucket([]byte(bucketRuns)), idem: tx.Bucket([]byte(bucketIdempotency)),
		iters: map[string]*runIter{}, r: r}
}

func (x *indexCheck) add(format string, args ...any) {
	if len(x.r.Index) >= maxFindings {
		x.more++
		return
	}
	x.r.Index = append(x.r.Index, fmt.Sprintf(format, args...))
}

// observe checks the index entries of e, the next event in order.
func (x *indexCheck) observe(e *auditd.Event) {
	if e.RunID != "" {
		x.observeRun(e)
	}
	if k := e.IdempotencyKey; k != "" {
		x.keyed++
		v := x.bucketGet(x.idem, []byte(k))
		switch {
		case v == nil:
			x.add("idempotency index: the key of event %d is missing from it", e.Seq)
		case len(v) != 8:
			x.add("idempotency index: the key of event %d holds %d bytes, not a sequence number", e.Seq, len(v))
		case binary.BigEndian.Uint64(v) != e.Seq:
			x.add("idempotency index: the key of event %d points at event %d", e.Seq, binary.BigEndian.Uint64(v))
		}
	}
}

func (x *indexCheck) bucketGet(b *bolt.Bucket, k []byte) []byte {
	if b == nil {
		return nil
	}
	return b.Get(k)
}

func (x *indexCheck) observeRun(e *auditd.Event) {
	it := x.iters[e.RunID]
	if it == nil {
		it = newRunIter(x, e.RunID)
		x.iters[e.RunID] = it
	}
	for {
		s, ok := it.peek()
		if !ok || s > e.Seq {
			x.add("run index: event %d of run %q is missing from it", e.Seq, e.RunID)
			return
		}
		it.pop()
		if s == e.Seq {
			return
		}
		// s came before e and was not one of the run's.
		x.add("run index: lists event %d under run %q, which it is not part of", s, it.run)
	}
}

// finish reports what the index holds beyond the events: entries of runs
// after their last event, runs without events, keys of no event. events is
// the events bucket, for the keys' events.
func (x *indexCheck) finish(events *bolt.Bucket) {
	for _, it := range x.iters {
		for s, ok := it.peek(); ok; s, ok = it.peek() {
			it.pop()
			if s > x.r.Head {
				x.add("run index: lists event %d under run %q, past the ledger's last event %d: the ledger was cut short", s, it.run, x.r.Head)
				continue
			}
			x.add("run index: lists event %d under run %q, which it is not part of", s, it.run)
		}
	}
	if x.runs != nil {
		c := x.runs.Cursor()
		for k, _ := c.First(); k != nil; {
			run, ok := runOfKey(k)
			if !ok {
				x.add("run index: malformed key %x", k)
				k, _ = c.Next()
				continue
			}
			if x.iters[run] == nil {
				x.add("run index: lists run %q, which has no events (first entry ends at event %d)", run, binary.BigEndian.Uint64(k[len(k)-8:]))
			}
			// Past this run's entries. On a damaged page whose keys are
			// out of order the seek can land at or before k: report it and
			// stop rather than go round for ever.
			prev := bytes.Clone(k)
			k, _ = c.Seek(append(prev[:len(prev)-8:len(prev)-8], 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
			if k != nil && bytes.Compare(k, prev) <= 0 {
				x.add("run index: keys out of order after %x", prev)
				break
			}
		}
	}
	if x.idem != nil {
		n := 0
		x.idem.ForEach(func(k, v []byte) error { n++; return nil })
		if n > x.keyed {
			x.idem.ForEach(func(k, v []byte) error {
				if len(v) != 8 {
					return nil // reported with its event, or below
				}
				seq := binary.BigEndian.Uint64(v)
				if e, err := getEventAt(events, seq); err != nil || e.IdempotencyKey != string(k) {
					x.add("idempotency index: key %q points at event %d, which does not carry it", k, seq)
				}
				return nil
			})
		}
	}
	if x.more > 0 {
		x.r.Index = append(x.r.Index, fmt.Sprintf("and %d more index findings", x.more))
	}
}

// runOfKey returns the run id a run index key names.
func runOfKey(k []byte) (string, bool) {
	n, w := binary.Uvarint(k)
	if w <= 0 || uint64(len(k)) != uint64(w)+n+8 {
		return "", false
	}
	return string(k[w : w+int(n)]), true
}

// runIter hands out the seqs the run index lists for one run, in order.
type runIter struct {
	x      *indexCheck
	run    string
	c      *bolt.Cursor
	prefix []byte
	pend   []uint64 // the current entry's seqs not handed out yet
	done   bool
}

func newRunIter(x *indexCheck, run string) *runIter {
	k := runKey(run, 0)
	it := &runIter{x: x, run: run, prefix: k[:len(k)-8]}
	if x.runs == nil {
		it.done = true
		return it
	}
	it.c = x.runs.Cursor()
	it.load(it.c.Seek(it.prefix))
	return it
}

// load decodes the entry k, v into pend, or ends the iterator past the
// run's entries. A malformed entry is reported and skipped.
func (it *runIter) load(k, v []byte) {
	for {
		if k == nil || !bytes.HasPrefix(k, it.prefix) {
			it.done = true
			return
		}
		if seqs, ok := decodeRunEntry(k, v, len(it.prefix)); ok {
			it.pend = seqs
			return
		}
		it.x.add("run index: malformed entry %x of run %q", k, it.run)
		k, v = it.c.Next()
	}
}

// decodeRunEntry returns the seqs of the run index entry k, v, or false
// when it is malformed (runEntrySeqs) or its seqs are not in order.
func decodeRunEntry(k, v []byte, prefix int) ([]uint64, bool) {
	var seqs []uint64
	ok, err := runEntrySeqs(k, v, prefix, func(s uint64) error {
		if len(seqs) > 0 && s <= seqs[len(seqs)-1] {
			return errOutOfOrder
		}
		seqs = append(seqs, s)
		return nil
	})
	return seqs, ok && err == nil
}

// errOutOfOrder ends the decoding of a run index entry whose seqs are not
// in order.
var errOutOfOrder = errors.New("out of order")

func (it *runIter) peek() (uint64, bool) {
	for !it.done && len(it.pend) == 0 {
		it.load(it.c.Next())
	}
	if it.done {
		return 0, false
	}
	return it.pend[0], true
}

func (it *runIter) pop() { it.pend = it.pend[1:] }
