package ledger

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// proofHeader opens the text form of a Proof.
const proofHeader = "auditd inclusion proof v1"

// Proof shows that one event belongs to the tree a signed checkpoint names,
// without the rest of the ledger. Its text form (MarshalText) is:
//
//	auditd inclusion proof v1
//	seq 42
//	record <base64 canonical encoding>
//	path <base64 hash>      (one line per hash, leaf to root)
//	<blank line>
//	<the signed checkpoint note, verbatim>
type Proof struct {
	Seq        uint64      // the event's sequence number; its leaf is Seq-1
	Record     []byte      // the event's canonical encoding: the leaf data
	Path       []tlog.Hash // tlog.RecordProof from the leaf to the checkpoint's root
	Checkpoint []byte      // the signed checkpoint note the path leads to
}

// Prove returns an inclusion proof of event seq against the latest
// checkpoint, read from the same snapshot as the tree hashes.
func (l *Ledger) Prove(seq uint64) (*Proof, error) { return Prove(l.db, seq, l.vkey) }

// Prove is Ledger.Prove for offline use: it only reads db, so it works on a
// read-only one. verifierKey checks the checkpoint the proof leads to.
func Prove(db *bolt.DB, seq uint64, verifierKey string) (*Proof, error) {
	p := &Proof{Seq: seq}
	err := db.View(func(tx *bolt.Tx) error {
		meta := tx.Bucket([]byte(bucketMeta))
		if meta == nil {
			return ErrNotFound
		}
		p.Checkpoint = bytes.Clone(meta.Get([]byte(metaCheckpoint)))
		t, err := OpenCheckpoint(p.Checkpoint, verifierKey)
		if err != nil {
			return err
		}
		if seq == 0 || seq > t.Size {
			return ErrNotFound
		}
		v, err := getRecord(tx.Bucket([]byte(bucketEvents)), seq)
		if errors.Is(err, ErrNotFound) {
			v, err = nil, nil
		}
		if err != nil {
			return err
		}
		if len(v) < 2*sha256.Size+1 {
			return fmt.Errorf("%w: record missing or short", ErrCorrupt)
		}
		p.Record = bytes.Clone(v[sha256.Size : len(v)-sha256.Size])
		p.Path, err = tlog.ProveRecord(int64(t.Size), int64(seq-1), treeReader{tx.Bucket([]byte(bucketTree))})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("prove event %d: %w", seq, err)
	}
	return p, nil
}

// Verify checks p offline against verifierKey: the checkpoint's signature,
// then the path from the record to the signed root. It returns the event
// the record decodes to (without PrevHash and Hash, which the tree does not
// cover) and the tree it was proven against.
func (p *Proof) Verify(verifierKey string) (auditd.Event, SignedTree, error) {
	t, err := OpenCheckpoint(p.Checkpoint, verifierKey)
	if err != nil {
		return auditd.Event{}, SignedTree{}, err
	}
	var e auditd.Event
	if err := UnmarshalCanonical(p.Record, &e); err != nil {
		return auditd.Event{}, t, fmt.Errorf("%w: record: %v", ErrBadProof, err)
	}
	if e.Seq != p.Seq || p.Seq == 0 || p.Seq > t.Size {
		return auditd.Event{}, t, fmt.Errorf("%w: event %d is not leaf %d of a tree of %d", ErrBadProof, e.Seq, p.Seq, t.Size)
	}
	if err := tlog.CheckRecord(p.Path, int64(t.Size), t.Root, int64(p.Seq-1), tlog.RecordHash(p.Record)); err != nil {
		return auditd.Event{}, t, fmt.Errorf("%w: %v", ErrBadProof, err)
	}
	return e, t, nil
}

// MarshalText implements encoding.TextMarshaler.
func (p *Proof) MarshalText() ([]byte, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\nseq %d\nrecord %s\n", proofHeader, p.Seq, base64.StdEncoding.EncodeToString(p.Record))
	for _, h := range p.Path {
		fmt.Fprintf(&b, "path %s\n", base64.StdEncoding.EncodeToString(h[:]))
	}
	b.WriteString("\n")
	b.Write(p.Checkpoint)
	return b.Bytes(), nil
}

// UnmarshalText implements encoding.TextUnmarshaler. It checks the form
// only; Verify checks the content.
func (p *Proof) UnmarshalText(text []byte) error {
	head, cp, ok := bytes.Cut(text, []byte("\n\n"))
	if !ok {
		return fmt.Errorf("%w: no checkpoint", ErrBadProof)
	}
	lines := strings.Split(string(head), "\n")
	if len(lines) < 3 || lines[0] != proofHeader {
		return fmt.Errorf("%w: not an %q", ErrBadProof, proofHeader)
	}
	var q Proof
	s, ok := strings.CutPrefix(lines[1], "seq ")
	seq, err := strconv.ParseUint(s, 10, 64)
	if !ok || err != nil || strconv.FormatUint(seq, 10) != s {
		return fmt.Errorf("%w: bad seq line", ErrBadProof)
	}
	q.Seq = seq
	s, ok = strings.CutPrefix(lines[2], "record ")
	if q.Record, err = base64.StdEncoding.Strict().DecodeString(s); !ok || err != nil || len(q.Record) > MaxEventSize {
		return fmt.Errorf("%w: bad record line", ErrBadProof)
	}
	// A path is at most one hash per tree level.
	if len(lines)-3 > 64 {
		return fmt.Errorf("%w: path too long", ErrBadProof)
	}
	for _, line := range lines[3:] {
		s, ok := strings.CutPrefix(line, "path ")
		var h tlog.Hash
		if !ok || decodeHash(s, h[:]) != nil {
			return fmt.Errorf("%w: bad path line", ErrBadProof)
		}
		q.Path = append(q.Path, h)
	}
	q.Checkpoint = bytes.Clone(cp)
	*p = q
	return nil
}
