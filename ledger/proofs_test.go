package ledger_test

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"slices"
	"testing"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
)

// TestProofsAtEverySize checks the proofs of an older tree size against an
// independent RFC 6962 implementation (transparency-dev/merkle): range
// proofs rebuild the root from the range's leaves, consistency and
// inclusion proofs verify, and the roots are the checkpoints' roots.
func TestProofsAtEverySize(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{Clock: clock.NewFake(epoch), CheckpointEvery: 8})
	const n = 70
	appendN(t, l, "r", n)
	r := ledger.NewReader(db)
	var leaves [][]byte
	err := r.ScanRecords(1, 0, func(rec *ledger.Record) error {
		if got := sha256.Sum256(append(rec.PrevHash[:], rec.Canonical...)); got != rec.Hash {
			t.Fatalf("record %d: chain hash does not recompute", rec.Seq)
		}
		leaves = append(leaves, rfc6962.DefaultHasher.HashLeaf(rec.Canonical))
		return nil
	})
	if err != nil || len(leaves) != n {
		t.Fatalf("ScanRecords: %d leaves, %v", len(leaves), err)
	}
	rf := &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}
	root := func(size uint64) []byte {
		cr := rf.NewEmptyRange(0)
		for _, lh := range leaves[:size] {
			cr.Append(lh, nil)
		}
		h, _ := cr.GetRootHash(nil)
		return h
	}
	for _, size := range []uint64{1, 2, 3, 7, 8, 9, 33, 64, 70} {
		got, err := r.TreeHash(size)
		if err != nil || !bytes.Equal(got[:], root(size)) {
			t.Fatalf("TreeHash(%d) = %x, %v; want %x", size, got, err, root(size))
		}
		for _, rg := range [][2]uint64{{1, 1}, {1, size}, {size, size}, {(size + 1) / 2, size}, {2, max(2, size-1)}} {
			first, last := rg[0], rg[1]
			if last > size || first > last {
				continue
			}
			p, err := r.ProveRange(first, last, size)
			if err != nil {
				t.Fatal(err)
			}
			cr, err := rf.NewRange(0, first-1, bs(p.Left))
			if err != nil {
				t.Fatalf("range %d-%d@%d left: %v", first, last, size, err)
			}
			for _, lh := range leaves[first-1 : last] {
				cr.Append(lh, nil)
			}
			right, err := rf.NewRange(last, size, bs(p.Right))
			if err != nil {
				t.Fatalf("range %d-%d@%d right: %v", first, last, size, err)
			}
			if err := cr.AppendRange(right, nil); err != nil {
				t.Fatal(err)
			}
			if h, _ := cr.GetRootHash(nil); !bytes.Equal(h, got[:]) {
				t.Errorf("range %d-%d@%d rebuilds %x, want %x", first, last, size, h, got)
			}
		}
		for _, old := range []uint64{1, size / 2, size} {
			if old == 0 {
				continue
			}
			cp, err := r.ConsistencyProof(old, size)
			if err != nil {
				t.Fatal(err)
			}
			if err := proof.VerifyConsistency(rfc6962.DefaultHasher, old, size, bs(cp), root(old), got[:]); err != nil {
				t.Errorf("consistency %d to %d: %v", old, size, err)
			}
		}
		ip, ir, err := r.InclusionProof(size, size)
		if err != nil || ir != got {
			t.Fatal(err)
		}
		if err := proof.VerifyInclusion(rfc6962.DefaultHasher, size-1, size, leaves[size-1], bs(ip), got[:]); err != nil {
			t.Errorf("inclusion of %d at %d: %v", size, size, err)
		}
	}
	for _, bad := range []struct{ old, new uint64 }{{0, 5}, {6, 5}, {1, n + 1}} {
		if _, err := r.ConsistencyProof(bad.old, bad.new); !errors.Is(err, ledger.ErrBadSize) {
			t.Errorf("ConsistencyProof(%d, %d): %v, want ErrBadSize", bad.old, bad.new, err)
		}
	}
	if _, err := r.ProveRange(5, 4, n); !errors.Is(err, ledger.ErrBadSize) {
		t.Errorf("ProveRange(5, 4): %v", err)
	}

	// The history: every checkpoint opens, in increasing size, the last
	// being the latest; CheckpointAt finds each.
	var sizes []uint64
	err = r.Checkpoints(0, func(size uint64, msg []byte) bool {
		tr, err := ledger.OpenCheckpoint(msg, l.PublicKey())
		if err != nil || tr.Size != size {
			t.Fatalf("checkpoint %d: %+v %v", size, tr, err)
		}
		h, _ := r.TreeHash(size)
		if tr.Root != h {
			t.Errorf("checkpoint %d root differs from the tree's", size)
		}
		if at, err := r.CheckpointAt(size); err != nil || !bytes.Equal(at, msg) {
			t.Errorf("CheckpointAt(%d): %v", size, err)
		}
		sizes = append(sizes, size)
		return true
	})
	if err != nil || len(sizes) < 3 || sizes[len(sizes)-1] != n {
		t.Fatalf("history sizes %v, %v", sizes, err)
	}
	for size := uint64(1); size <= n; size++ {
		if !slices.Contains(sizes, size) {
			if _, err := r.CheckpointAt(size); !errors.Is(err, ledger.ErrNotFound) {
				t.Errorf("CheckpointAt(%d), not in the history: %v, want ErrNotFound", size, err)
			}
			break
		}
	}
}

func bs(hs []tlog.Hash) [][]byte {
	out := make([][]byte, len(hs))
	for i := range hs {
		out[i] = hs[i][:]
	}
	return out
}
