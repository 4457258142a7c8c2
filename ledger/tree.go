package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// frontier is the right edge of an RFC 6962 tree: the roots of its perfect
// subtrees, largest first. It is all the writer needs to compute the hashes
// a new leaf completes, and all Verify needs to recompute a root, without
// reading stored hashes back.
type frontier struct {
	size   uint64
	levels []int
	hashes []tlog.Hash
}

// push adds a leaf and returns the hashes tlog.StoredHashes would return for
// it: the leaf hash, then each subtree it completes, lowest level first.
func (f *frontier) push(leaf tlog.Hash, stored []tlog.Hash) []tlog.Hash {
	h, level := leaf, 0
	stored = append(stored, h)
	for n := len(f.levels); n > 0 && f.levels[n-1] == level; n-- {
		h = tlog.NodeHash(f.hashes[n-1], h)
		level++
		f.levels, f.hashes = f.levels[:n-1], f.hashes[:n-1]
		stored = append(stored, h)
	}
	f.levels = append(f.levels, level)
	f.hashes = append(f.hashes, h)
	f.size++
	return stored
}

// leafHasher computes tlog.RecordHash, SHA-256(0x00 || data), without its
// two allocations per leaf (a digest and the sum): the writer and Verify
// hash every event (BenchmarkAppendParallel, BenchmarkVerify1M). The zero
// value is ready; it is not safe for concurrent use.
type leafHasher struct{ buf []byte }

func (h *leafHasher) hash(data []byte) tlog.Hash {
	h.buf = append(append(h.buf[:0], 0x00), data...)
	return sha256.Sum256(h.buf)
}

// root returns the RFC 6962 tree hash of the leaves pushed so far.
func (f *frontier) root() tlog.Hash {
	if len(f.hashes) == 0 {
		return sha256.Sum256(nil) // RFC 6962: the empty tree hashes as the empty string
	}
	h := f.hashes[len(f.hashes)-1]
	for i := len(f.hashes) - 2; i >= 0; i-- {
		h = tlog.NodeHash(f.hashes[i], h)
	}
	return h
}

func (f *frontier) clone() frontier {
	return frontier{size: f.size, levels: append([]int(nil), f.levels...), hashes: append([]tlog.Hash(nil), f.hashes...)}
}

// loadFrontier rebuilds the frontier of a tree of size leaves from the
// stored hashes.
func loadFrontier(r tlog.HashReader, size uint64) (frontier, error) {
	f := frontier{size: size}
	var start uint64
	for level := 63; level >= 0; level-- {
		if size&(1<<level) == 0 {
			continue
		}
		hs, err := r.ReadHashes([]int64{tlog.StoredHashIndex(level, int64(start>>level))})
		if err != nil {
			return frontier{}, err
		}
		f.levels = append(f.levels, level)
		f.hashes = append(f.hashes, hs[0])
		start += 1 << level
	}
	return f, nil
}

// treeReader serves tlog's stored hash indexes from the tree bucket, whose
// entry under seq n holding k hashes is stored hash indexes
// StoredHashCount(n)-k up to StoredHashCount(n) (see doc.go).
type treeReader struct{ b *bolt.Bucket }

func (r treeReader) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	c := r.b.Cursor()
	for i, index := range indexes {
		// The hash at (level, m) was stored by the last leaf under it.
		level, m := tlog.SplitStoredHashIndex(index)
		seq := uint64(m+1) << level
		k, v := c.Seek(seqKey(seq))
		if len(k) != 8 || len(v)%tlog.HashSize != 0 {
			return nil, fmt.Errorf("%w: tree hash (level %d, node %d) missing", ErrCorrupt, level, m)
		}
		at := index - (tlog.StoredHashCount(int64(binary.BigEndian.Uint64(k))) - int64(len(v)/tlog.HashSize))
		if at < 0 || at >= int64(len(v)/tlog.HashSize) {
			return nil, fmt.Errorf("%w: tree hash (level %d, node %d) missing", ErrCorrupt, level, m)
		}
		copy(out[i][:], v[at*tlog.HashSize:])
	}
	return out, nil
}

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }
