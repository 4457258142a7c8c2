package ledger

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// The proofs below read the stored tree of a ledger at any size up to its
// head, for witnesses and auditors: an RFC 6962 tree only grows, so the
// hashes a proof at an older size needs are all still stored.

// ErrBadSize means a tree size (or a range) the ledger cannot answer for:
// zero where leaves are needed, past the head, or out of order.
var ErrBadSize = errors.New("bad tree size")

// proofView runs fn on a read transaction with the ledger's head and its
// tree bucket as a tlog.HashReader.
func (r *Reader) proofView(fn func(head uint64, hr tlog.HashReader, tx *bolt.Tx) error) error {
	return r.db.View(func(tx *bolt.Tx) error {
		events, tree := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketTree))
		var head uint64
		if events != nil {
			head = headSeq(events)
		}
		if tree == nil {
			return fn(0, nil, tx)
		}
		return fn(head, treeReader{tree}, tx)
	})
}

// Head returns the sequence number of the newest stored event (0 when the
// file holds none).
func (r *Reader) Head() (uint64, error) {
	var head uint64
	err := r.proofView(func(h uint64, _ tlog.HashReader, _ *bolt.Tx) error { head = h; return nil })
	return head, err
}

// TreeHash returns the RFC 6962 root of the ledger's first size events.
func (r *Reader) TreeHash(size uint64) (tlog.Hash, error) {
	var h tlog.Hash
	err := r.proofView(func(head uint64, hr tlog.HashReader, _ *bolt.Tx) error {
		if size > head {
			return fmt.Errorf("%w: %d is past the head %d", ErrBadSize, size, head)
		}
		if size == 0 {
			h = emptyRoot()
			return nil
		}
		var err error
		h, err = tlog.TreeHash(int64(size), hr)
		return err
	})
	return h, err
}

func emptyRoot() tlog.Hash {
	var f frontier
	return f.root()
}

// ConsistencyProof returns the RFC 6962 proof that the tree of the first
// old events is a prefix of the tree of the first new: tlog.TreeProof,
// which tlog.CheckTree (and any RFC 6962 verifier) checks. 0 < old <= new
// <= head; old == new is the empty proof.
func (r *Reader) ConsistencyProof(old, new uint64) (tlog.TreeProof, error) {
	var p tlog.TreeProof
	err := r.proofView(func(head uint64, hr tlog.HashReader, _ *bolt.Tx) error {
		switch {
		case old == 0 || old > new:
			return fmt.Errorf("%w: consistency needs 0 < old <= new, got %d and %d", ErrBadSize, old, new)
		case new > head:
			return fmt.Errorf("%w: %d is past the head %d", ErrBadSize, new, head)
		}
		var err error
		p, err = tlog.ProveTree(int64(new), int64(old), hr)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("consistency proof %d to %d: %w", old, new, err)
	}
	return p, nil
}

// InclusionProof returns the RFC 6962 proof of event seq (leaf seq-1) in
// the tree of the first size events, and that tree's root.
func (r *Reader) InclusionProof(seq, size uint64) (tlog.RecordProof, tlog.Hash, error) {
	var (
		p    tlog.RecordProof
		root tlog.Hash
	)
	err := r.proofView(func(head uint64, hr tlog.HashReader, _ *bolt.Tx) error {
		switch {
		case size > head:
			return fmt.Errorf("%w: %d is past the head %d", ErrBadSize, size, head)
		case seq == 0 || seq > size:
			return fmt.Errorf("%w: event %d is not in a tree of %d", ErrBadSize, seq, size)
		}
		var err error
		if p, err = tlog.ProveRecord(int64(size), int64(seq-1), hr); err != nil {
			return err
		}
		root, err = tlog.TreeHash(int64(size), hr)
		return err
	})
	if err != nil {
		return nil, tlog.Hash{}, fmt.Errorf("inclusion proof of %d at %d: %w", seq, size, err)
	}
	return p, root, nil
}

// RangeProof is what, with the leaves of events First to Last, recomputes
// the root of a tree of Size: the compact ranges of the leaves before and
// after them. Left holds the roots of the perfect subtrees that cover
// leaves [0, First-1), largest first; Right those that cover [Last, Size),
// left to right (transparency-dev/merkle's compact.Range order in both).
type RangeProof struct {
	Size, First, Last uint64
	Left, Right       []tlog.Hash
}

// ProveRange returns the range proof of events first to last (inclusive)
// in the tree of the first size events.
func (r *Reader) ProveRange(first, last, size uint64) (*RangeProof, error) {
	p := &RangeProof{Size: size, First: first, Last: last}
	err := r.proofView(func(head uint64, hr tlog.HashReader, _ *bolt.Tx) error {
		switch {
		case size > head:
			return fmt.Errorf("%w: %d is past the head %d", ErrBadSize, size, head)
		case first == 0 || first > last || last > size:
			return fmt.Errorf("%w: events %d to %d are not a range of a tree of %d", ErrBadSize, first, last, size)
		}
		var err error
		if p.Left, err = readNodes(hr, subtrees(0, first-1)); err != nil {
			return err
		}
		p.Right, err = readNodes(hr, subtrees(last, size))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("range proof of %d to %d at %d: %w", first, last, size, err)
	}
	return p, nil
}

// node is a perfect subtree: 2^level leaves from index<<level.
type node struct {
	level int
	index int64
}

// subtrees returns the perfect subtrees that cover leaves [begin, end),
// left to right, each as large as its alignment allows: the nodes of a
// compact range.
func subtrees(begin, end uint64) []node {
	var out []node
	for begin < end {
		level := 63
		if begin > 0 {
			level = bits.TrailingZeros64(begin)
		}
		for level > 0 && begin+1<<level > end {
			level--
		}
		out = append(out, node{level, int64(begin >> level)})
		begin += 1 << level
	}
	return out
}

func readNodes(hr tlog.HashReader, nodes []node) ([]tlog.Hash, error) {
	if len(nodes) == 0 {
		return nil, nil
	}
	idx := make([]int64, len(nodes))
	for i, n := range nodes {
		idx[i] = tlog.StoredHashIndex(n.level, n.index)
	}
	return hr.ReadHashes(idx)
}

// CheckpointAt returns the signed checkpoint of size size from the
// history, or the latest when it has that size; ErrNotFound otherwise.
func (r *Reader) CheckpointAt(size uint64) ([]byte, error) {
	var msg []byte
	err := r.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(bucketCheckpoints)); b != nil {
			msg = bytes.Clone(b.Get(seqKey(size)))
		}
		if msg == nil {
			if b := tx.Bucket([]byte(bucketMeta)); b != nil {
				latest := b.Get([]byte(metaCheckpoint))
				if t, err := parseCheckpointText(latest); err == nil && t.Size == size {
					msg = bytes.Clone(latest)
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if msg == nil {
		return nil, fmt.Errorf("checkpoint of size %d: %w", size, ErrNotFound)
	}
	return msg, nil
}

// Checkpoints calls fn with the checkpoints of the history whose size is
// greater than after, in increasing size, until fn returns false; the
// latest follows when it is newer than the history's last.
func (r *Reader) Checkpoints(after uint64, fn func(size uint64, msg []byte) bool) error {
	return r.db.View(func(tx *bolt.Tx) error {
		last := after
		if b := tx.Bucket([]byte(bucketCheckpoints)); b != nil {
			c := b.Cursor()
			for k, v := c.Seek(seqKey(after + 1)); k != nil; k, v = c.Next() {
				if len(k) != 8 {
					return fmt.Errorf("%w: checkpoint key %x", ErrCorrupt, k)
				}
				last = binary.BigEndian.Uint64(k)
				if !fn(last, bytes.Clone(v)) {
					return nil
				}
			}
		}
		if b := tx.Bucket([]byte(bucketMeta)); b != nil {
			latest := b.Get([]byte(metaCheckpoint))
			if t, err := parseCheckpointText(latest); err == nil && t.Size > last {
				fn(t.Size, bytes.Clone(latest))
			}
		}
		return nil
	})
}

// parseCheckpointText reads a checkpoint's size from its note without
// checking the signature (the caller hands the note out, to be checked by
// whoever reads it).
func parseCheckpointText(msg []byte) (SignedTree, error) {
	text, _, ok := bytes.Cut(msg, []byte("\n\n"))
	if !ok {
		return SignedTree{}, ErrBadCheckpoint
	}
	return parseCheckpoint(string(text) + "\n")
}

// ParseCheckpoint reads the text of a checkpoint note (note.Note.Text),
// once its signature has been checked by whoever opened it.
func ParseCheckpoint(text string) (SignedTree, error) { return parseCheckpoint(text) }
