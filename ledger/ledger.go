package ledger

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Defaults for Options.
const (
	// DefaultCheckpointEvery keeps one signed checkpoint in the history for
	// at least this many events. It bounds how closely Verify can place a
	// rewrite whose chain and tree were re-hashed without the key (see doc.go).
	DefaultCheckpointEvery = 64

	// DefaultMaxGroup caps the events one commit group (one bbolt
	// transaction, one fsync) takes, so a flood of appenders cannot make a
	// transaction, and the latency of the first appender in it, unbounded.
	DefaultMaxGroup = 4096
)

// Errors.
var (
	// ErrClosed is returned by Append after Close.
	ErrClosed = errors.New("ledger closed")

	// ErrCorrupt means stored bytes are not what the ledger wrote.
	ErrCorrupt = errors.New("ledger corrupt")

	// ErrKeyMissing means the signing key of a ledger that already holds
	// events is gone; a new key could not vouch for them.
	ErrKeyMissing = errors.New("ledger signing key missing")

	// ErrBadCheckpoint means a checkpoint note is not signed by the expected
	// key or does not parse.
	ErrBadCheckpoint = errors.New("bad checkpoint")

	// ErrBadProof means an inclusion proof does not check out.
	ErrBadProof = errors.New("bad inclusion proof")

	// ErrNotFound means no event has the requested sequence number.
	ErrNotFound = errors.New("event not found")
)

// Bucket names. Nothing outside this package writes to them.
const (
	bucketEvents      = "ledger.events"      // seq -> PrevHash | canonical | Hash
	bucketTree        = "ledger.tree"        // seq -> the tree hashes leaf seq-1 completed
	bucketCheckpoints = "ledger.checkpoints" // tree size -> signed checkpoint note (history)
	bucketRuns        = "ledger.runs"        // uvarint(len run) | run | seq -> empty
	bucketIdempotency = "ledger.idempotency" // key -> seq
	bucketMeta        = "ledger.meta"        // metaCheckpoint -> latest signed checkpoint
)

const metaCheckpoint = "checkpoint"

// Options configure Open. Zero fields take their Default.
type Options struct {
	// KeyDir holds the ed25519 key pair that signs checkpoints, created on
	// first open with 0600 permissions. Default: the bbolt file's directory.
	KeyDir string

	// Clock stamps events with Time and Mono. Default: clock.Real{}.
	Clock clock.Clock

	// CheckpointEvery is how many events at least separate two checkpoints
	// kept in the history. Default: DefaultCheckpointEvery. The latest
	// checkpoint is replaced on every commit whatever this is.
	CheckpointEvery uint64

	// MaxGroup caps the events one commit group takes. Default: DefaultMaxGroup.
	MaxGroup int
}

// Ledger is the append-only event store. It is safe for concurrent use; one
// writer goroutine, started by Open and stopped by Close, owns every write.
type Ledger struct {
	db              *bolt.DB
	clock           clock.Clock
	start           time.Time
	signer          note.Signer
	vkey            string
	checkpointEvery uint64
	maxGroup        int

	reqs      chan *request
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once

	// Owned by the writer goroutine (and by Open before it starts).
	front       frontier
	chain       [32]byte
	lastHistory uint64

	mu       sync.RWMutex // guards what Head and Checkpoint read
	head     uint64
	headHash [32]byte
	latest   []byte
}

// request is one Append or AppendBatch waiting for its commit group.
type request struct {
	in   []auditd.Event
	out  []auditd.Event
	err  error
	done chan struct{}
}

// Open opens the ledger kept in db, creating its buckets and, for a new
// ledger, its key pair. db must be writable; Verify works on a read-only one.
// Open trusts what is on disk beyond a cheap check that the latest
// checkpoint matches the head; `auditd verify` checks everything.
func Open(db *bolt.DB, opts Options) (*Ledger, error) {
	l := &Ledger{
		db:              db,
		clock:           opts.Clock,
		checkpointEvery: opts.CheckpointEvery,
		maxGroup:        opts.MaxGroup,
		reqs:            make(chan *request),
		stop:            make(chan struct{}),
		done:            make(chan struct{}),
	}
	if l.clock == nil {
		l.clock = clock.Real{}
	}
	if l.checkpointEvery == 0 {
		l.checkpointEvery = DefaultCheckpointEvery
	}
	if l.maxGroup <= 0 {
		l.maxGroup = DefaultMaxGroup
	}
	keyDir := opts.KeyDir
	if keyDir == "" {
		keyDir = filepath.Dir(db.Path())
	}

	err := db.Update(func(tx *bolt.Tx) error {
		for _, name := range []string{bucketEvents, bucketTree, bucketCheckpoints, bucketRuns, bucketIdempotency, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists([]byte(name)); err != nil {
				return fmt.Errorf("create bucket %s: %w", name, err)
			}
		}
		if k, v := tx.Bucket([]byte(bucketEvents)).Cursor().Last(); k != nil {
			if len(k) != 8 || len(v) < 2*sha256.Size+1 {
				return fmt.Errorf("%w: last event record malformed", ErrCorrupt)
			}
			l.head = binary.BigEndian.Uint64(k)
			copy(l.chain[:], v[len(v)-sha256.Size:])
		}
		if k, _ := tx.Bucket([]byte(bucketTree)).Cursor().Last(); l.head > 0 && (k == nil || binary.BigEndian.Uint64(k) != l.head) {
			return fmt.Errorf("%w: tree does not end at event %d", ErrCorrupt, l.head)
		}
		if k, _ := tx.Bucket([]byte(bucketCheckpoints)).Cursor().Last(); k != nil {
			l.lastHistory = binary.BigEndian.Uint64(k)
		}
		l.latest = bytes.Clone(tx.Bucket([]byte(bucketMeta)).Get([]byte(metaCheckpoint)))
		var err error
		l.front, err = loadFrontier(treeReader{tx.Bucket([]byte(bucketTree))}, l.head)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l.headHash = l.chain

	if l.signer, l.vkey, err = loadKey(keyDir, l.head == 0); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l.start = l.clock.Now()
	if l.latest == nil && l.head == 0 {
		// A new ledger starts with a signed empty tree, so Checkpoint
		// always has something to hand out.
		err := l.db.Update(func(tx *bolt.Tx) (err error) {
			l.latest, err = l.putCheckpoint(tx, 0, l.start)
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("open ledger: %w", err)
		}
	} else {
		t, err := OpenCheckpoint(l.latest, l.vkey)
		if err != nil {
			return nil, fmt.Errorf("open ledger: latest checkpoint: %w", err)
		}
		if t.Size != l.head || t.Root != l.front.root() || t.Chain != l.chain {
			return nil, fmt.Errorf("open ledger: %w: latest checkpoint (size %d) does not match the head (%d); run auditd verify", ErrCorrupt, t.Size, l.head)
		}
	}

	go l.run()
	return l, nil
}

// putCheckpoint signs the tree as it stands in the writer's state and stores
// it as the latest, and in the history when CheckpointEvery has passed.
func (l *Ledger) putCheckpoint(tx *bolt.Tx, size uint64, now time.Time) ([]byte, error) {
	t := SignedTree{Origin: l.signer.Name(), Size: size, Root: l.front.root(), Time: now.UTC(), Chain: l.chain}
	msg, err := note.Sign(&note.Note{Text: t.format()}, l.signer)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint %d: %w", size, err)
	}
	if err := tx.Bucket([]byte(bucketMeta)).Put([]byte(metaCheckpoint), msg); err != nil {
		return nil, fmt.Errorf("store checkpoint %d: %w", size, err)
	}
	if size == 0 || size-l.lastHistory >= l.checkpointEvery {
		b := tx.Bucket([]byte(bucketCheckpoints))
		b.FillPercent = 1.0
		if err := b.Put(seqKey(size), msg); err != nil {
			return nil, fmt.Errorf("store checkpoint %d: %w", size, err)
		}
		l.lastHistory = size
	}
	return msg, nil
}

// Close stops accepting appends, commits those already handed to the
// writer, and waits for it to stop or for ctx to end. It does not close db.
func (l *Ledger) Close(ctx context.Context) error {
	l.closeOnce.Do(func() { close(l.stop) })
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close ledger: %w", ctx.Err())
	}
}

// PublicKey returns the note verifier key that checks this ledger's
// checkpoints; it is safe to publish.
func (l *Ledger) PublicKey() string { return l.vkey }

// Head returns the sequence number and hash of the last durable event
// (0 and the zero hash for an empty ledger).
func (l *Ledger) Head() (seq uint64, hash [32]byte) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.head, l.headHash
}

// Checkpoint returns the latest signed checkpoint note; it covers every
// event Append has acknowledged.
func (l *Ledger) Checkpoint() ([]byte, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return bytes.Clone(l.latest), nil
}

// Append records e and returns it as stored, with Seq, Time, Mono, PrevHash
// and Hash assigned. It returns only once the event is durable. When
// e.IdempotencyKey was appended before, it writes nothing and returns the
// first event with that key.
//
// If ctx ends while the event waits for its commit group, Append returns
// ctx's error, but the event may still be recorded: retry with the same
// idempotency key to learn which.
func (l *Ledger) Append(ctx context.Context, e auditd.Event) (auditd.Event, error) {
	out, err := l.AppendBatch(ctx, []auditd.Event{e})
	if err != nil {
		return auditd.Event{}, err
	}
	return out[0], nil
}

// AppendBatch records events in order in one commit group: all are durable
// together, or none is. The result is in the same order as events.
func (l *Ledger) AppendBatch(ctx context.Context, events []auditd.Event) ([]auditd.Event, error) {
	if len(events) == 0 {
		return nil, nil
	}
	for i := range events {
		if err := validate(&events[i]); err != nil {
			return nil, err
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// The writer reads its own copy: a caller whose ctx ends may reuse the
	// slice while the group is still being written.
	r := &request{in: slices.Clone(events), done: make(chan struct{})}
	select {
	case l.reqs <- r:
	case <-l.done:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	select {
	case <-r.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, r.err
	}
	return r.out, nil
}

// validate rejects what the ledger must never store. The size test counts
// only the variable-length fields: the fixed ones add well under 1 KiB.
func validate(e *auditd.Event) error {
	if e.Type == "" {
		return auditd.Errorf(auditd.EINVALID, "event type is required")
	}
	n := len(e.Type) + len(e.RunID) + len(e.SourceID) + len(e.ItemKey) + len(e.IdempotencyKey) +
		len(e.Method) + len(e.Path) + len(e.RetryAfterRaw) + len(e.From) + len(e.To) + len(e.Group) +
		len(e.Outcome) + len(e.BodyError) + len(e.PayloadHash) + len(e.Cause) + len(e.Principal) + len(e.Detail)
	if n > MaxEventSize-1024 {
		return auditd.Errorf(auditd.EINVALID, "event of %d bytes is too large", n)
	}
	return nil
}

// run is the writer: it takes whatever appends are waiting, commits them in
// one transaction and answers them, until Close.
func (l *Ledger) run() {
	defer close(l.done)
	for {
		var group []*request
		select {
		case r := <-l.reqs:
			group = append(group, r)
		case <-l.stop:
			// Appenders already blocked on the channel get their events
			// committed; later ones see done and ErrClosed.
			for {
				select {
				case r := <-l.reqs:
					l.commit([]*request{r})
					continue
				default:
				}
				return
			}
		}
		n := len(group[0].in)
	fill:
		for n < l.maxGroup {
			select {
			case r := <-l.reqs:
				group = append(group, r)
				n += len(r.in)
			default:
				break fill
			}
		}
		l.commit(group)
	}
}

// commit writes one group in one transaction. The writer's state moves on
// only when the transaction committed, so a failed group leaves no gap.
func (l *Ledger) commit(group []*request) {
	now := l.clock.Now()
	stamp := time.Unix(0, now.UnixNano()).UTC() // what decoding gives back
	mono := now.Sub(l.start)
	front, chain, lastHistory := l.front.clone(), l.chain, l.lastHistory
	seq := l.head
	var latest []byte

	err := l.db.Update(func(tx *bolt.Tx) error {
		events, tree, runs, idem := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketTree)),
			tx.Bucket([]byte(bucketRuns)), tx.Bucket([]byte(bucketIdempotency))
		events.FillPercent, tree.FillPercent = 1.0, 1.0
		var pending map[string]auditd.Event // keys first seen in this group
		var stored []tlog.Hash
		for _, r := range group {
			r.out = make([]auditd.Event, len(r.in))
			for i, e := range r.in {
				if k := e.IdempotencyKey; k != "" {
					if first, ok := pending[k]; ok {
						r.out[i] = first
						continue
					}
					if v := idem.Get([]byte(k)); v != nil {
						first, err := getEvent(events, v)
						if err != nil {
							return fmt.Errorf("idempotency key %q: %w", k, err)
						}
						r.out[i] = first
						continue
					}
				}
				seq++
				e.Seq, e.Time, e.Mono, e.PrevHash = seq, stamp, mono, l.chain
				val := make([]byte, sha256.Size, sha256.Size+256)
				copy(val, l.chain[:])
				val = MarshalCanonical(val, &e)
				e.Hash = sha256.Sum256(val)
				val = append(val, e.Hash[:]...)
				l.chain = e.Hash

				stored = l.front.push(tlog.RecordHash(val[sha256.Size:len(val)-sha256.Size]), stored[:0])
				packed := make([]byte, 0, len(stored)*tlog.HashSize)
				for _, h := range stored {
					packed = append(packed, h[:]...)
				}
				key := seqKey(seq)
				if err := events.Put(key, val); err != nil {
					return fmt.Errorf("append event %d: %w", seq, err)
				}
				if err := tree.Put(key, packed); err != nil {
					return fmt.Errorf("append tree hashes %d: %w", seq, err)
				}
				if e.RunID != "" {
					if err := runs.Put(runKey(e.RunID, seq), nil); err != nil {
						return fmt.Errorf("index event %d: %w", seq, err)
					}
				}
				if k := e.IdempotencyKey; k != "" {
					if err := idem.Put([]byte(k), key); err != nil {
						return fmt.Errorf("index event %d: %w", seq, err)
					}
					if pending == nil {
						pending = make(map[string]auditd.Event)
					}
					pending[k] = e
				}
				r.out[i] = e
			}
		}
		if seq == l.head {
			return nil // only idempotent repeats: nothing new to sign
		}
		var err error
		latest, err = l.putCheckpoint(tx, seq, now)
		return err
	})
	if err != nil {
		// Roll the writer's state back to the last committed group.
		l.front, l.chain, l.lastHistory = front, chain, lastHistory
		for _, r := range group {
			r.out, r.err = nil, err
			close(r.done)
		}
		return
	}
	l.mu.Lock()
	l.head, l.headHash = seq, l.chain
	if latest != nil {
		l.latest = latest
	}
	l.mu.Unlock()
	for _, r := range group {
		close(r.done)
	}
}

// getEvent decodes the event stored under the 8-byte key k.
func getEvent(events *bolt.Bucket, k []byte) (auditd.Event, error) {
	var e auditd.Event
	if events == nil {
		return e, ErrNotFound
	}
	v := events.Get(k)
	if v == nil {
		return e, ErrNotFound
	}
	err := decodeRecord(v, &e)
	return e, err
}

// decodeRecord decodes a stored event record into e.
func decodeRecord(v []byte, e *auditd.Event) error {
	if len(v) < 2*sha256.Size+1 {
		return fmt.Errorf("%w: record of %d bytes", ErrCorrupt, len(v))
	}
	if err := UnmarshalCanonical(v[sha256.Size:len(v)-sha256.Size], e); err != nil {
		return err
	}
	copy(e.PrevHash[:], v)
	copy(e.Hash[:], v[len(v)-sha256.Size:])
	return nil
}

// runKey is the run index key: the run id, length-prefixed so that no run id
// is a prefix of another's keys, then the sequence number.
func runKey(runID string, seq uint64) []byte {
	k := binary.AppendUvarint(make([]byte, 0, len(runID)+12), uint64(len(runID)))
	k = append(k, runID...)
	return binary.BigEndian.AppendUint64(k, seq)
}
