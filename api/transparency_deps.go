package api

import (
	"context"
	"time"

	"github.com/auditd/auditd"
)

// Log serves the ledger's Merkle tree to witnesses and auditors: proofs
// at any size up to the head, the checkpoint history, cosigned
// checkpoints, and events by sequence number whatever their run. Sizes
// and ranges past the head, or out of order, are EINVALID naming the
// parameter. cmd/auditd adapts the ledger and the witness store to it.
type Log interface {
	// Consistency proves the tree of old events a prefix of the tree of
	// new (RFC 6962).
	Consistency(ctx context.Context, old, new uint64) (ConsistencyProof, error)
	// Inclusion proves event seq a leaf of the tree of size events.
	Inclusion(ctx context.Context, seq, size uint64) (Inclusion, error)
	// Checkpoints returns up to limit signed checkpoints of the history
	// larger than after, in increasing size, and whether more follow.
	Checkpoints(ctx context.Context, after uint64, limit int) ([]CheckpointInfo, bool, error)
	// CheckpointAt returns the signed checkpoint of size, with every
	// witness cosignature kept for it; ENOTFOUND when there is none.
	CheckpointAt(ctx context.Context, size uint64) ([]byte, error)
	// Cosign keeps a witness's cosignature of a checkpoint: note is the
	// checkpoint with the witness's signature line added. EINVALID when
	// it is not a checkpoint of this ledger cosigned by a configured
	// witness.
	Cosign(ctx context.Context, note []byte) (Cosigned, error)
	// Scan visits the events with from <= Seq <= to in order.
	Scan(from, to uint64, fn func(*auditd.Event) error) error
}

// ConsistencyProof is an RFC 6962 consistency proof between two tree sizes.
type ConsistencyProof struct {
	OldSize uint64   `json:"old_size"`
	NewSize uint64   `json:"new_size"`
	OldRoot string   `json:"old_root"` // base64
	NewRoot string   `json:"new_root"` // base64
	Hashes  []string `json:"hashes"`   // base64
}

// Inclusion is an RFC 6962 inclusion proof of one event at a chosen size.
type Inclusion struct {
	Seq       uint64   `json:"seq"`
	LeafIndex uint64   `json:"leaf_index"`
	LeafHash  string   `json:"leaf_hash"` // base64, SHA-256(0x00 || canonical encoding)
	TreeSize  uint64   `json:"tree_size"`
	RootHash  string   `json:"root_hash"` // base64
	Hashes    []string `json:"hashes"`    // base64, leaf to root
	// Checkpoint is the signed checkpoint of TreeSize when the history
	// keeps one; empty otherwise (the root is then computed, not signed).
	Checkpoint string `json:"checkpoint,omitempty"`
}

// CheckpointInfo is one signed checkpoint of the history.
type CheckpointInfo struct {
	Size uint64    `json:"size"`
	Root string    `json:"root"` // base64
	Time time.Time `json:"time"`
	Note string    `json:"note"` // the signed note, verbatim
}

// Cosigned is what a kept cosignature covers.
type Cosigned struct {
	Size      uint64   `json:"size"`
	Witnesses []string `json:"witnesses"` // every witness whose cosignature is now kept for Size
}
