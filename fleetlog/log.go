package fleetlog

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"sync"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
)

// DefaultPrefix is where a Log keeps its keys unless told otherwise.
const DefaultPrefix = "/auditd/fleetlog/"

// DefaultOrigin names the fleet log in its checkpoints unless told
// otherwise.
const DefaultOrigin = "auditd-fleet"

// Config shapes a Log.
type Config struct {
	// Prefix is where the log's keys live; default DefaultPrefix.
	Prefix string
	// Origin is the first line of the fleet's checkpoints; default
	// DefaultOrigin. Every node of a fleet must use the same.
	Origin string
	// Clock times cosignatures; default clock.Real.
	Clock clock.Clock
}

// Log is one node's handle on the fleet log in etcd. Any number of Logs,
// on any nodes, may share one log; each is safe for concurrent use.
type Log struct {
	client *clientv3.Client
	clock  clock.Clock
	prefix string
	origin string

	mu       sync.Mutex
	hashes   map[int64]tlog.Hash // stored hashes read or written: never rewritten
	cosigned map[string]Tree     // per cosigner, the last tree it cosigned through this Log
}

// New returns the Log kept under cfg.Prefix on client.
func New(client *clientv3.Client, cfg Config) *Log {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Origin == "" {
		cfg.Origin = DefaultOrigin
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	return &Log{client: client, clock: cfg.Clock, prefix: cfg.Prefix, origin: cfg.Origin,
		hashes: make(map[int64]tlog.Hash), cosigned: make(map[string]Tree)}
}

// Post is one node's checkpoint for the fleet log.
type Post struct {
	Node string
	// Key is the node ledger's note verifier key.
	Key string
	// Checkpoint is the node ledger's signed checkpoint note.
	Checkpoint []byte
	// Revision is the etcd revision of the last fleet grant the node's
	// ledger records up to Checkpoint (0 when none).
	Revision int64
	// Prove returns the node ledger's consistency proof from its tree at
	// oldSize to Checkpoint's; it is called when the node's last accepted
	// checkpoint is smaller.
	Prove func(oldSize uint64) (tlog.TreeProof, error)
}

// Entry is where a post landed: its leaf index, the fleet tree that
// includes it, and the etcd revision of the transaction.
type Entry struct {
	Index    uint64
	Tree     Tree
	Revision int64
}

// head and nodeState are the JSON values of head and node/<name>.
type head struct {
	Size uint64 `json:"size"`
	Root string `json:"root"`
}

type nodeState struct {
	Size uint64 `json:"size"`
	Root string `json:"root"`
	Leaf uint64 `json:"leaf"`
}

func (l *Log) headKey() string             { return l.prefix + "head" }
func (l *Log) leafKey(i uint64) string     { return fmt.Sprintf("%sleaf/%020d", l.prefix, i) }
func (l *Log) hashKey(i int64) string      { return fmt.Sprintf("%shash/%020d", l.prefix, i) }
func (l *Log) nodeKey(name string) string  { return l.prefix + "node/" + name }
func (l *Log) pubKey(name string) string   { return l.prefix + "key/" + name }
func (l *Log) cosigDir(size uint64) string { return fmt.Sprintf("%scosig/%020d/", l.prefix, size) }

// Post appends p's checkpoint to the fleet log, unless it is the node's
// last accepted one again (then it returns that leaf's Entry with the
// current tree), or contradicts it (ErrFork, ErrRollback, ErrInconsistent).
func (l *Log) Post(ctx context.Context, p Post) (Entry, error) {
	if !validName(p.Node) {
		return Entry{}, fmt.Errorf("post: node name %q: %w", p.Node, ErrBadLeaf)
	}
	st, err := ledger.OpenCheckpoint(p.Checkpoint, p.Key)
	if err != nil {
		return Entry{}, fmt.Errorf("post of node %s: %w: %v", p.Node, ErrBadCheckpoint, err)
	}
	provedFrom := ^uint64(0)
	for {
		resp, err := l.client.Txn(ctx).Then(clientv3.OpGet(l.headKey()), clientv3.OpGet(l.nodeKey(p.Node)),
			clientv3.OpGet(l.pubKey(p.Node))).Commit()
		if err != nil {
			return Entry{}, fmt.Errorf("post of node %s: %w", p.Node, err)
		}
		var h head
		var last *nodeState
		hRev, _, err := decode(resp.Responses[0].GetResponseRange().Kvs, &h)
		if err != nil {
			return Entry{}, err
		}
		var ns nodeState
		nRev, nOK, err := decode(resp.Responses[1].GetResponseRange().Kvs, &ns)
		if err != nil {
			return Entry{}, err
		}
		if nOK {
			last = &ns
		}
		kvs := resp.Responses[2].GetResponseRange().Kvs
		kRev := int64(0)
		if len(kvs) == 1 {
			if string(kvs[0].Value) != p.Key {
				return Entry{}, fmt.Errorf("node %s posted under key %q, its first post under %q: %w", p.Node, p.Key, kvs[0].Value, ErrKeyMismatch)
			}
			kRev = kvs[0].ModRevision
		}
		if last != nil {
			same, err := l.checkForward(p, st, *last, &provedFrom)
			if err != nil {
				return Entry{}, err
			}
			if same {
				root, err := decodeRoot(h.Root)
				if err != nil {
					return Entry{}, err
				}
				return Entry{Index: last.Leaf, Tree: Tree{Origin: l.origin, Size: h.Size, Root: root}, Revision: resp.Header.Revision}, nil
			}
		}
		e, ok, err := l.append(ctx, p, st, h, hRev, nRev, kRev)
		if err != nil || ok {
			return e, err
		}
	}
}

// checkForward holds st to the node's last accepted checkpoint: same
// reports that it is that checkpoint again. provedFrom remembers the size a
// consistency proof was checked from, so that a retried post asks once.
func (l *Log) checkForward(p Post, st ledger.SignedTree, last nodeState, provedFrom *uint64) (same bool, err error) {
	lastRoot, err := decodeRoot(last.Root)
	if err != nil {
		return false, err
	}
	was := fmt.Sprintf("size %d root %s (fleet leaf %d)", last.Size, last.Root, last.Leaf)
	now := fmt.Sprintf("size %d root %s", st.Size, base64.StdEncoding.EncodeToString(st.Root[:]))
	switch {
	case st.Size < last.Size:
		return false, fmt.Errorf("node %s: checkpoint %s is older than its %s: %w", p.Node, now, was, ErrRollback)
	case st.Size == last.Size && st.Root != lastRoot:
		return false, fmt.Errorf("node %s: checkpoint %s contradicts its %s: %w", p.Node, now, was, ErrFork)
	case st.Size == last.Size:
		return true, nil
	case *provedFrom == last.Size:
		return false, nil
	}
	if p.Prove == nil {
		return false, fmt.Errorf("node %s: checkpoint %s after its %s came with no proof: %w", p.Node, now, was, ErrInconsistent)
	}
	proof, err := p.Prove(last.Size)
	if err != nil {
		return false, fmt.Errorf("node %s: prove %d to %d: %w", p.Node, last.Size, st.Size, err)
	}
	if err := tlog.CheckTree(proof, int64(st.Size), st.Root, int64(last.Size), lastRoot); err != nil {
		return false, fmt.Errorf("node %s: checkpoint %s does not extend its %s: %w", p.Node, now, was, ErrInconsistent)
	}
	*provedFrom = last.Size
	return false, nil
}

// append writes p as leaf h.Size if head, the node's state and its key are
// still at the revisions read; ok is false when another post came first.
func (l *Log) append(ctx context.Context, p Post, st ledger.SignedTree, h head, hRev, nRev, kRev int64) (e Entry, ok bool, err error) {
	idx := h.Size
	leaf := Leaf{Node: p.Node, Revision: p.Revision, Checkpoint: p.Checkpoint}.Marshal()
	hashes, err := tlog.StoredHashes(int64(idx), leaf, l.reader(ctx))
	if err != nil {
		return Entry{}, false, fmt.Errorf("post of node %s: %w", p.Node, err)
	}
	base := tlog.StoredHashCount(int64(idx))
	root, err := tlog.TreeHash(int64(idx)+1, l.overlay(ctx, base, hashes))
	if err != nil {
		return Entry{}, false, fmt.Errorf("post of node %s: %w", p.Node, err)
	}
	rootB64 := base64.StdEncoding.EncodeToString(root[:])
	hb, _ := json.Marshal(head{Size: idx + 1, Root: rootB64})
	nb, _ := json.Marshal(nodeState{Size: st.Size, Root: base64.StdEncoding.EncodeToString(st.Root[:]), Leaf: idx})
	ops := []clientv3.Op{clientv3.OpPut(l.leafKey(idx), string(leaf)), clientv3.OpPut(l.headKey(), string(hb)),
		clientv3.OpPut(l.nodeKey(p.Node), string(nb)), clientv3.OpPut(l.pubKey(p.Node), p.Key)}
	for i, hash := range hashes {
		ops = append(ops, clientv3.OpPut(l.hashKey(base+int64(i)), string(hash[:])))
	}
	resp, err := l.client.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(l.headKey()), "=", hRev),
		clientv3.Compare(clientv3.ModRevision(l.nodeKey(p.Node)), "=", nRev),
		clientv3.Compare(clientv3.ModRevision(l.pubKey(p.Node)), "=", kRev),
	).Then(ops...).Commit()
	if err != nil {
		return Entry{}, false, fmt.Errorf("post of node %s: %w", p.Node, err)
	}
	if !resp.Succeeded {
		return Entry{}, false, nil
	}
	l.mu.Lock()
	for i, hash := range hashes {
		l.hashes[base+int64(i)] = hash
	}
	l.mu.Unlock()
	return Entry{Index: idx, Tree: Tree{Origin: l.origin, Size: idx + 1, Root: root}, Revision: resp.Header.Revision}, true, nil
}

// decode reads the JSON value of a get, with its ModRevision; ok is
// false when the key does not exist.
func decode(kvs []*mvccpb.KeyValue, v any) (rev int64, ok bool, err error) {
	if len(kvs) == 0 {
		return 0, false, nil
	}
	if err := json.Unmarshal(kvs[0].Value, v); err != nil {
		return 0, false, fmt.Errorf("%w: %s: %v", ErrCorrupt, kvs[0].Key, err)
	}
	return kvs[0].ModRevision, true, nil
}

func decodeRoot(s string) (tlog.Hash, error) {
	var h tlog.Hash
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil || len(b) != len(h) {
		return h, fmt.Errorf("%w: root %q", ErrCorrupt, s)
	}
	copy(h[:], b)
	return h, nil
}
