package fleetlog

import (
	"context"
	"fmt"

	"github.com/auditd/auditd/witness"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/mod/sumdb/tlog"
)

// reader reads stored hashes, from the cache or etcd.
func (l *Log) reader(ctx context.Context) tlog.HashReader {
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			l.mu.Lock()
			h, ok := l.hashes[x]
			l.mu.Unlock()
			if !ok {
				resp, err := l.client.Get(ctx, l.hashKey(x))
				if err != nil {
					return nil, fmt.Errorf("read fleet hash %d: %w", x, err)
				}
				if len(resp.Kvs) != 1 || len(resp.Kvs[0].Value) != len(h) {
					return nil, fmt.Errorf("%w: hash %d missing", ErrCorrupt, x)
				}
				copy(h[:], resp.Kvs[0].Value)
				l.mu.Lock()
				l.hashes[x] = h
				l.mu.Unlock()
			}
			out[i] = h
		}
		return out, nil
	})
}

// overlay reads hashes from base on from fresh, the rest as reader does.
func (l *Log) overlay(ctx context.Context, base int64, fresh []tlog.Hash) tlog.HashReader {
	r := l.reader(ctx)
	return tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
		out := make([]tlog.Hash, len(indexes))
		for i, x := range indexes {
			if x >= base && x < base+int64(len(fresh)) {
				out[i] = fresh[x-base]
				continue
			}
			hs, err := r.ReadHashes([]int64{x})
			if err != nil {
				return nil, err
			}
			out[i] = hs[0]
		}
		return out, nil
	})
}

// Head returns the fleet log's tree as etcd holds it now.
func (l *Log) Head(ctx context.Context) (Tree, error) {
	resp, err := l.client.Get(ctx, l.headKey())
	if err != nil {
		return Tree{}, fmt.Errorf("fleet log head: %w", err)
	}
	var h head
	if _, _, err := decode(resp.Kvs, &h); err != nil {
		return Tree{}, err
	}
	t := Tree{Origin: l.origin, Size: h.Size}
	if h.Size > 0 {
		if t.Root, err = decodeRoot(h.Root); err != nil {
			return Tree{}, err
		}
	} else {
		t.Root, _ = tlog.TreeHash(0, nil)
	}
	return t, nil
}

// Leaf returns the bytes of leaf i.
func (l *Log) Leaf(ctx context.Context, i uint64) ([]byte, error) {
	resp, err := l.client.Get(ctx, l.leafKey(i))
	if err != nil {
		return nil, fmt.Errorf("fleet leaf %d: %w", i, err)
	}
	if len(resp.Kvs) != 1 {
		return nil, fmt.Errorf("%w: leaf %d missing", ErrCorrupt, i)
	}
	return resp.Kvs[0].Value, nil
}

// ProveLeaf returns the RFC 6962 inclusion proof of leaf i in the tree of
// size leaves.
func (l *Log) ProveLeaf(ctx context.Context, i, size uint64) (tlog.RecordProof, error) {
	return tlog.ProveRecord(int64(size), int64(i), l.reader(ctx))
}

// ProveTree returns the RFC 6962 consistency proof from the tree of old
// leaves to the tree of size leaves.
func (l *Log) ProveTree(ctx context.Context, size, old uint64) (tlog.TreeProof, error) {
	return tlog.ProveTree(int64(size), int64(old), l.reader(ctx))
}

// Cosign adds c's cosignature to the fleet checkpoint of the tree of size
// leaves (at most the head), after checking from the stored hashes that it
// is consistent with the last tree c cosigned through this Log.
func (l *Log) Cosign(ctx context.Context, c *witness.Cosigner, size uint64) (Tree, error) {
	h, err := l.Head(ctx)
	if err != nil {
		return Tree{}, err
	}
	if size > h.Size {
		return Tree{}, fmt.Errorf("cosign fleet tree %d: the log holds %d", size, h.Size)
	}
	r := l.reader(ctx)
	if root, err := tlog.TreeHash(int64(h.Size), r); err != nil || root != h.Root {
		return Tree{}, fmt.Errorf("%w: head root is not the stored hashes' (%v)", ErrCorrupt, err)
	}
	t := Tree{Origin: l.origin, Size: size}
	if t.Root, err = tlog.TreeHash(int64(size), r); err != nil {
		return Tree{}, fmt.Errorf("cosign fleet tree %d: %w", size, err)
	}
	l.mu.Lock()
	prev, seen := l.cosigned[c.Name()]
	l.mu.Unlock()
	if seen && prev.Size <= size {
		if root, err := tlog.TreeHash(int64(prev.Size), r); err != nil || root != prev.Root {
			return Tree{}, fmt.Errorf("cosign fleet tree %d: not consistent with the tree of %d %s cosigned: %w", size, prev.Size, c.Name(), ErrInconsistent)
		}
	}
	line := c.Sign(t.Text(), l.clock.Now())
	if _, err := l.client.Put(ctx, l.cosigDir(size)+c.Name(), line); err != nil {
		return Tree{}, fmt.Errorf("cosign fleet tree %d: %w", size, err)
	}
	l.mu.Lock()
	if !seen || prev.Size <= size {
		l.cosigned[c.Name()] = t
	}
	l.mu.Unlock()
	return t, nil
}

// Checkpoint returns the fleet checkpoint of the tree of size leaves, with
// every cosignature posted for it, and the names of its cosigners.
func (l *Log) Checkpoint(ctx context.Context, size uint64) ([]byte, []string, error) {
	root, err := tlog.TreeHash(int64(size), l.reader(ctx))
	if err != nil {
		return nil, nil, fmt.Errorf("fleet checkpoint %d: %w", size, err)
	}
	resp, err := l.client.Get(ctx, l.cosigDir(size), clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("fleet checkpoint %d: %w", size, err)
	}
	var lines, names []string
	for _, kv := range resp.Kvs {
		lines = append(lines, string(kv.Value))
		names = append(names, string(kv.Key[len(l.cosigDir(size)):]))
	}
	t := Tree{Origin: l.origin, Size: size, Root: root}
	return assemble(t.Text(), lines), names, nil
}

// NodeTree is a node's last checkpoint the fleet log accepted: the node
// ledger's tree (Size events, Root) and the fleet leaf that holds it.
type NodeTree struct {
	Size uint64
	Root tlog.Hash
	Leaf uint64
}

// NodeKey returns the note verifier key node's first post was made under;
// ok is false when the node has posted none.
func (l *Log) NodeKey(ctx context.Context, node string) (key string, ok bool, err error) {
	resp, err := l.client.Get(ctx, l.pubKey(node))
	if err != nil {
		return "", false, fmt.Errorf("fleet log node %s: %w", node, err)
	}
	if len(resp.Kvs) == 0 {
		return "", false, nil
	}
	return string(resp.Kvs[0].Value), true, nil
}

// Node returns node's last accepted checkpoint; ok is false when the node
// has posted none.
func (l *Log) Node(ctx context.Context, node string) (t NodeTree, ok bool, err error) {
	resp, err := l.client.Get(ctx, l.nodeKey(node))
	if err != nil {
		return NodeTree{}, false, fmt.Errorf("fleet log node %s: %w", node, err)
	}
	var ns nodeState
	if _, ok, err = decode(resp.Kvs, &ns); !ok || err != nil {
		return NodeTree{}, false, err
	}
	root, err := decodeRoot(ns.Root)
	if err != nil {
		return NodeTree{}, false, err
	}
	return NodeTree{Size: ns.Size, Root: root, Leaf: ns.Leaf}, true, nil
}
