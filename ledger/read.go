package ledger

import (
	"encoding/binary"
	"fmt"

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

// Scan visits the events with from <= Seq <= to in order; to == 0 means the
// head as of the start of the scan. It reads one consistent snapshot in one
// read transaction, so fn should not block for long. The event passed to fn
// is reused for the next one: fn must copy what it keeps.
func (r *Reader) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	return r.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketEvents))
		if b == nil {
			return nil // no ledger in this file yet
		}
		c := b.Cursor()
		var e auditd.Event
		for k, v := c.Seek(seqKey(max(from, 1))); k != nil; k, v = c.Next() {
			seq := binary.BigEndian.Uint64(k)
			if to != 0 && seq > to {
				break
			}
			if err := decodeRecord(v, &e); err != nil {
				return fmt.Errorf("scan event %d: %w", seq, err)
			}
			if err := fn(&e); err != nil {
				return err
			}
		}
		return nil
	})
}

// ScanRun visits the events of run runID with Seq > after, in order, through
// the run index. Like Scan it reads one snapshot and reuses the event.
func (r *Reader) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	if runID == "" {
		return auditd.Errorf(auditd.EINVALID, "run id is required")
	}
	return r.db.View(func(tx *bolt.Tx) error {
		events, runs := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketRuns))
		if events == nil || runs == nil {
			return nil // no ledger in this file yet
		}
		var e auditd.Event
		return scanRunIndex(runs, runID, after, func(seq uint64) error {
			v := events.Get(seqKey(seq))
			if v == nil {
				return fmt.Errorf("scan run %s: %w: indexed event %d missing", runID, ErrCorrupt, seq)
			}
			if err := decodeRecord(v, &e); err != nil {
				return fmt.Errorf("scan run %s: event %d: %w", runID, seq, err)
			}
			return fn(&e)
		})
	})
}

// Event returns the event with sequence number seq, or ErrNotFound.
func (r *Reader) Event(seq uint64) (auditd.Event, error) {
	var e auditd.Event
	err := r.db.View(func(tx *bolt.Tx) error {
		var err error
		e, err = getEvent(tx.Bucket([]byte(bucketEvents)), seqKey(seq))
		return err
	})
	if err != nil {
		return auditd.Event{}, fmt.Errorf("event %d: %w", seq, err)
	}
	return e, nil
}
