package ledger

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Reader reads a ledger without opening it for writing: offline commands
// (reconcile, export) use it on a read-only db. Ledger reads the same way.
type Reader struct{ db *bolt.DB }

// NewReader returns a Reader of the ledger in db.
func NewReader(db *bolt.DB) *Reader { return &Reader{db: db} }

// Scan is Reader.Scan on the ledger's db.
func (l *Ledger) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	return NewReader(l.db).Scan(from, to, fn)
}

// ScanRun is Reader.ScanRun on the ledger's db.
func (l *Ledger) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	return NewReader(l.db).ScanRun(runID, after, fn)
}

// Event is Reader.Event on the ledger's db.
func (l *Ledger) Event(seq uint64) (auditd.Event, error) { return NewReader(l.db).Event(seq) }

// SeqAt is Reader.SeqAt on the ledger's db.
func (l *Ledger) SeqAt(t time.Time) (uint64, error) { return NewReader(l.db).SeqAt(t) }

// scanChunk is how many events one read transaction of a scan visits. A
// bbolt read transaction holds the file's memory map: while one is open the
// writer cannot grow the file, so a long scan in one transaction (an export
// of a million rows, a slow client streaming events) would stall every
// append. The ledger is append-only, so reading in chunks sees the same
// events as one snapshot would.
const scanChunk = 4096

// errChunkFull ends one chunk of a run scan.
var errChunkFull = errors.New("scan chunk full")

// Scan visits the events with from <= Seq <= to in order; to == 0 means the
// head as of the start of the scan. It reads in chunks of scanChunk events,
// each in a read transaction of its own, and never holds one while fn runs
// past a chunk's end; fn may itself read the database. The event passed to
// fn is reused for the next one: fn must copy what it keeps.
func (r *Reader) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	next, head := max(from, 1), to
	st := new(stringTable)
	for {
		done, n := false, 0
		err := r.db.View(func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte(bucketEvents))
			if b == nil {
				done = true // no ledger in this file yet
				return nil
			}
			if head == 0 {
				if head = headSeq(b); head == 0 {
					done = true
					return nil
				}
			}
			var e auditd.Event
			ec := newEventsCursor(b)
			for seq, v, err := ec.seek(next); ; seq, v, err = ec.next() {
				if err != nil {
					return fmt.Errorf("scan events from %d: %w", next, err)
				}
				if v == nil || seq > head {
					done = true
					return nil
				}
				if n == scanChunk {
					next = seq
					return nil
				}
				if err := decodeRecord(v, &e, st); err != nil {
					return fmt.Errorf("scan event %d: %w", seq, err)
				}
				if err := fn(&e); err != nil {
					return err
				}
				n++
			}
		})
		if err != nil || done {
			return err
		}
	}
}

// ScanRun visits the events of run runID with Seq > after, in order, through
// the run index, in chunks like Scan; events appended to the run while it
// scans may be visited too. It reuses the event like Scan.
func (r *Reader) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	if runID == "" {
		return auditd.Errorf(auditd.EINVALID, "run id is required")
	}
	st := new(stringTable)
	for {
		more, n := false, 0
		err := r.db.View(func(tx *bolt.Tx) error {
			events, runs := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketRuns))
			if events == nil || runs == nil {
				return nil // no ledger in this file yet
			}
			var e auditd.Event
			ec := newEventsCursor(events)
			return scanRunIndex(runs, runID, after, func(seq uint64) error {
				if n == scanChunk {
					more = true
					return errChunkFull
				}
				v, err := ec.at(seq)
				if err != nil {
					return fmt.Errorf("scan run %s: event %d: %w", runID, seq, err)
				}
				if v == nil {
					return fmt.Errorf("scan run %s: %w: indexed event %d missing", runID, ErrCorrupt, seq)
				}
				if err := decodeRecord(v, &e, st); err != nil {
					return fmt.Errorf("scan run %s: event %d: %w", runID, seq, err)
				}
				after, n = seq, n+1
				return fn(&e)
			})
		})
		if errors.Is(err, errChunkFull) {
			err = nil
		}
		if err != nil || !more {
			return err
		}
	}
}

// Event returns the event with sequence number seq, or ErrNotFound.
func (r *Reader) Event(seq uint64) (auditd.Event, error) {
	var e auditd.Event
	err := r.db.View(func(tx *bolt.Tx) error {
		var err error
		e, err = getEventAt(tx.Bucket([]byte(bucketEvents)), seq)
		return err
	})
	if err != nil {
		return auditd.Event{}, fmt.Errorf("event %d: %w", seq, err)
	}
	return e, nil
}

// SeqAt returns the sequence number of the first event recorded at or after
// t, or one past the head when there is none. One writer stamps the events
// in order, each commit group when it is prepared, so their times do not
// decrease along the sequence, and a binary search reads some twenty events
// to find it. (A wall clock stepped back between two starts breaks that
// order; then the answer may be a little early or late.)
func (r *Reader) SeqAt(t time.Time) (uint64, error) {
	var seq uint64
	err := r.db.View(func(tx *bolt.Tx) error {
		events := tx.Bucket([]byte(bucketEvents))
		seq = 1
		if events == nil {
			return nil // no ledger in this file yet
		}
		head := headSeq(events)
		if head == 0 {
			return nil
		}
		// The answer is in [lo, hi]: every event before lo is older than
		// t, and hi is the head's successor or an event at t or later.
		lo, hi := uint64(1), head+1
		for lo < hi {
			mid := lo + (hi-lo)/2
			e, err := getEventAt(events, mid)
			if err != nil {
				return fmt.Errorf("event %d: %w", mid, err)
			}
			if e.Time.Before(t) {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		seq = lo
		return nil
	})
	return seq, err
}

// Checkpoint returns the latest signed checkpoint note stored in the file
// (nil for an empty ledger), for offline exports.
func (r *Reader) Checkpoint() ([]byte, error) {
	var note []byte
	err := r.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(bucketMeta)); b != nil {
			note = bytes.Clone(b.Get([]byte(metaCheckpoint)))
		}
		return nil
	})
	return note, err
}
