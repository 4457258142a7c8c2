package pack

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/auditd/auditd"
	"golang.org/x/mod/sumdb/tlog"
)

// Format names this version of the pack in pack.json.
const Format = "auditd-evidence-pack/1"

// The entries of a pack (docs/EVIDENCE-PACK.md).
const (
	FileManifest           = "pack.json"
	FileVerify             = "VERIFY.md"
	FileWorkbook           = "evidence.xlsx"
	FileCheckpoint         = "checkpoint.txt"
	FilePublicKey          = "public-key.txt"
	FileLeaves             = "events.bin"
	FileNDJSON             = "events.ndjson"
	FileProof              = "proof.json"
	FilePreviousCheckpoint = "previous-checkpoint.txt"
	FileConsistency        = "consistency.json"
)

// Limits of what Open reads into memory from a pack: the small entries.
// The leaves, their NDJSON and the workbook are streamed.
const (
	maxSmallEntry = 1 << 20
	maxRanges     = 1 << 16
	maxRuns       = 1 << 16
)

// ErrBadPack means a pack is not well formed: an entry is missing, too
// large or does not parse. What a well-formed pack says is checked by
// Verify.
var ErrBadPack = errors.New("malformed evidence pack")

// Manifest is pack.json: what the pack covers.
type Manifest struct {
	Format   string `json:"format"`
	ExportID string `json:"export_id"`
	Filters  string `json:"filters"`
	// Origin and TreeSize are those of the checkpoint the leaves are
	// proven against.
	Origin   string `json:"origin"`
	TreeSize uint64 `json:"tree_size"`
	// Runs are the runs of the workbook, each with the first and last
	// sequence number of its events (its population's range).
	Runs []Run `json:"runs"`
	// Ranges are the leaves events.bin holds, in order: the runs' ranges
	// merged. Every event of a range is there, whatever its run.
	Ranges []Range `json:"ranges"`
	// Retention are the retention events of the runs' awards that the
	// workbook's Retention sheet shows (retention dates, holds, purges);
	// each is a leaf of the ranges.
	Retention []uint64 `json:"retention,omitempty"`
	// Access are the access events (views and exports) of the runs
	// recorded after their ranges, which the workbook's Access log shows;
	// each is a leaf of the ranges.
	Access []uint64 `json:"access,omitempty"`
	// Leaves is how many leaves events.bin holds.
	Leaves uint64 `json:"leaves"`
}

// Run is one run of a pack and its range of sequence numbers.
type Run struct {
	ID    string `json:"id"`
	First uint64 `json:"first_seq"`
	Last  uint64 `json:"last_seq"`
}

// Range is a run of consecutive leaves: events First to Last (leaf
// indexes First-1 to Last-1). PrevHash is the chain hash of event
// First-1 (zero for the first event), hex, from which the events' chain
// hashes (the workbook's "Event hash") follow.
type Range struct {
	First    uint64 `json:"first_seq"`
	Last     uint64 `json:"last_seq"`
	PrevHash string `json:"prev_hash"`
}

// Proof is proof.json: for each range, the compact ranges of the leaves
// before and after it, so that with the range's leaves they rebuild the
// root of the checkpoint's tree (RFC 6962).
type Proof struct {
	TreeSize uint64       `json:"tree_size"`
	Root     string       `json:"root"` // base64, as in the checkpoint
	Ranges   []RangeProof `json:"ranges"`
}

// RangeProof proves one Range: Left are the roots of the perfect subtrees
// covering leaves [0, First-1), largest first; Right those covering
// [Last, TreeSize), left to right; base64.
type RangeProof struct {
	First uint64   `json:"first_seq"`
	Last  uint64   `json:"last_seq"`
	Left  []string `json:"left"`
	Right []string `json:"right"`
}

// Consistency is consistency.json: the RFC 6962 consistency proof from
// the tree of previous-checkpoint.txt to the tree of checkpoint.txt.
type Consistency struct {
	OldSize uint64   `json:"old_size"`
	NewSize uint64   `json:"new_size"`
	Hashes  []string `json:"hashes"` // base64
}

// leafJSON is one line of events.ndjson: the event as the API shows it,
// with its leaf.
type leafJSON struct {
	auditd.EventJSON
	LeafIndex uint64 `json:"leaf_index"`
	LeafHash  string `json:"leaf_hash"` // hex, SHA-256(0x00 || canonical)
}

func newLeafJSON(e *auditd.Event, leaf tlog.Hash) leafJSON {
	return leafJSON{EventJSON: auditd.NewEventJSON(e), LeafIndex: e.Seq - 1, LeafHash: hex.EncodeToString(leaf[:])}
}

// writeFrame writes one leaf of events.bin: a 4-byte big-endian length,
// then the canonical encoding.
func writeFrame(w io.Writer, canonical []byte) error {
	var n [4]byte
	binary.BigEndian.PutUint32(n[:], uint32(len(canonical)))
	if _, err := w.Write(n[:]); err != nil {
		return err
	}
	_, err := w.Write(canonical)
	return err
}

// readFrame reads one leaf of events.bin into buf.
func readFrame(r io.Reader, buf []byte, max int) ([]byte, error) {
	var n [4]byte
	if _, err := io.ReadFull(r, n[:]); err != nil {
		return nil, err
	}
	size := int(binary.BigEndian.Uint32(n[:]))
	if size == 0 || size > max {
		return nil, fmt.Errorf("leaf of %d bytes", size)
	}
	if cap(buf) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	if _, err := io.ReadFull(r, buf); err != nil {
		return nil, io.ErrUnexpectedEOF
	}
	return buf, nil
}

func b64(hs []tlog.Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h[:])
	}
	return out
}

func unb64(ss []string) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(ss))
	for i, s := range ss {
		b, err := base64.StdEncoding.Strict().DecodeString(s)
		if err != nil || len(b) != sha256.Size {
			return nil, fmt.Errorf("hash %d is not a base64 SHA-256", i)
		}
		copy(out[i][:], b)
	}
	return out, nil
}
