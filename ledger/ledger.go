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
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
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

	// DefaultGroupDelay: see Options.GroupDelay.
	DefaultGroupDelay = 10 * time.Millisecond
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
	bucketEvents      = "ledger.events"      // seq -> PrevHash | canonical | Hash, or first|last seq -> a block of them (events.go)
	bucketTree        = "ledger.tree"        // seq -> the tree hashes of up to 8 leaves, the last seq-1
	bucketCheckpoints = "ledger.checkpoints" // tree size -> signed checkpoint note (history)
	bucketRuns        = "ledger.runs"        // uvarint(len run) | run | seq -> the run's earlier seqs in its group
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

	// GroupDelay bounds the time between two commit groups while the
	// ledger is busy (many appenders at once): the writer lets a group
	// grow, rather than pay an fsync for a few events, until 1.5 times
	// the last commit's time has passed since that one was sealed, but never
	// longer than GroupDelay. An appender on its own is never delayed.
	// Default: DefaultGroupDelay; negative turns it off.
	GroupDelay time.Duration

	// Observer, when set, is told of what every commit group made durable
	// (the service's metrics). Default: none.
	Observer Observer

	// OnStall, when set, is told when commits start to fail (a full disk
	// refuses the write, say) with the error, and with nil once one
	// succeeds again. While they fail the ledger keeps every append
	// queued, in order, and retries the write with a backoff (from 10ms up
	// to 2s): appenders wait, nothing is lost or reordered. It is called
	// on the writer goroutine and must return quickly.
	OnStall func(err error)

	// WriteFault, when set, is called before each commit group is
	// committed; an error it returns fails the commit as a disk that
	// refuses the write does. A seam for tests of a full disk.
	WriteFault func() error
}

// Observer is told of each commit group once it is durable, on the
// writer's goroutine and before any appender hears of it: it must be quick
// and must not append.
type Observer interface {
	// Committed is called with the events the group stored (idempotent
	// repeats left out, each once), and how long its transaction took,
	// fsync included. It must not keep events.
	Committed(events []*auditd.Event, took time.Duration)
}

// Ledger is the append-only event store. It is safe for concurrent use; one
// writer goroutine, started by Open and stopped by Close, owns every write
// (see writer.go for the write path).
type Ledger struct {
	db              *bolt.DB
	clock           clock.Clock
	start           time.Time
	signer          note.Signer
	vkey            string
	checkpointEvery uint64
	maxGroup        int
	groupDelay      time.Duration
	observer        Observer

	wake chan struct{} // buffered: the queue may have requests, or Close was called
	done chan struct{} // closed when the writer has stopped

	// requests are reused from one Add to the next: two allocations fewer
	// per Add (BenchmarkAppendParallel, BenchmarkLoopInMemory's allocs/req).
	requests sync.Pool

	qmu    sync.Mutex
	queue  []*request // appends waiting for the writer, in arrival order
	closed bool       // Close was called: the queue takes no more

	// Owned by the writer goroutine (and by Open before it starts).
	tip tip

	sideBuckets sync.Map // bucket names Add has found to exist

	groups, grouped atomic.Uint64 // commit groups written, and the events in them

	onStall    func(error)
	writeFault func() error

	mu         sync.RWMutex // guards what Head, Checkpoint and Stalled read
	head       uint64
	headHash   [32]byte
	latest     []byte
	stall      error     // why commits fail; nil while they succeed
	stallSince time.Time // when they started to fail
}

// BoltOptions are the options auditd opens its bbolt file with (main does;
// so do benchmarks that claim to measure the production parts). The file
// is mapped 1 GiB up front: bbolt grows it by remapping, a remap waits for
// every open read transaction and copies every node the writing
// transaction holds, and a ledger under a gigabyte then never remaps.
// Mapping is address space, not memory. Another process holding the file
// makes Open fail within a second instead of hanging.
func BoltOptions(readOnly bool) *bolt.Options {
	return &bolt.Options{Timeout: time.Second, ReadOnly: readOnly, InitialMmapSize: 1 << 30}
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
		groupDelay:      opts.GroupDelay,
		observer:        opts.Observer,
		onStall:         opts.OnStall,
		writeFault:      opts.WriteFault,
		wake:            make(chan struct{}, 1),
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
	if l.groupDelay == 0 {
		l.groupDelay = DefaultGroupDelay
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
		seq, rec, err := lastRecord(tx.Bucket([]byte(bucketEvents)))
		if err != nil {
			return fmt.Errorf("last event: %w", err)
		}
		if rec != nil {
			if len(rec) < 2*sha256.Size+1 {
				return fmt.Errorf("%w: last event record malformed", ErrCorrupt)
			}
			l.head = seq
			copy(l.headHash[:], rec[len(rec)-sha256.Size:])
		}
		if k, _ := tx.Bucket([]byte(bucketTree)).Cursor().Last(); l.head > 0 && (k == nil || binary.BigEndian.Uint64(k) != l.head) {
			return fmt.Errorf("%w: tree does not end at event %d", ErrCorrupt, l.head)
		}
		if k, _ := tx.Bucket([]byte(bucketCheckpoints)).Cursor().Last(); k != nil {
			l.tip.lastHistory = binary.BigEndian.Uint64(k)
		}
		l.latest = bytes.Clone(tx.Bucket([]byte(bucketMeta)).Get([]byte(metaCheckpoint)))
		l.tip.front, err = loadFrontier(treeReader{tx.Bucket([]byte(bucketTree))}, l.head)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l.tip.seq, l.tip.chain = l.head, l.headHash

	if l.signer, l.vkey, err = loadKey(keyDir, l.head == 0); err != nil {
		return nil, fmt.Errorf("open ledger: %w", err)
	}
	l.start = l.clock.Now()
	if l.latest == nil && l.head == 0 {
		// A new ledger starts with a signed empty tree, so Checkpoint
		// always has something to hand out.
		err := l.db.Update(func(tx *bolt.Tx) (err error) {
			l.latest, err = l.putCheckpoint(tx, l.tip.tree(l.signer.Name(), l.start), true)
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
		if t.Size != l.head || t.Root != l.tip.front.root() || t.Chain != l.headHash {
			return nil, fmt.Errorf("open ledger: %w: latest checkpoint (size %d) does not match the head (%d); run auditd verify", ErrCorrupt, t.Size, l.head)
		}
	}

	go l.run()
	return l, nil
}

// putCheckpoint signs t and stores it as the latest checkpoint, and in the
// history too when history is set.
func (l *Ledger) putCheckpoint(tx *bolt.Tx, t SignedTree, history bool) ([]byte, error) {
	msg, err := note.Sign(&note.Note{Text: t.format()}, l.signer)
	if err != nil {
		return nil, fmt.Errorf("sign checkpoint %d: %w", t.Size, err)
	}
	if err := tx.Bucket([]byte(bucketMeta)).Put([]byte(metaCheckpoint), msg); err != nil {
		return nil, fmt.Errorf("store checkpoint %d: %w", t.Size, err)
	}
	if history {
		b := tx.Bucket([]byte(bucketCheckpoints))
		b.FillPercent = 1.0
		if err := b.Put(seqKey(t.Size), msg); err != nil {
			return nil, fmt.Errorf("store checkpoint %d: %w", t.Size, err)
		}
	}
	return msg, nil
}

// Close stops accepting appends, commits those already queued, and waits
// for the writer to stop or for ctx to end. It does not close db.
func (l *Ledger) Close(ctx context.Context) error {
	l.qmu.Lock()
	l.closed = true
	l.qmu.Unlock()
	l.signal()
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("close ledger: %w", ctx.Err())
	}
}

// Stats is what the writer has done since Open.
type Stats struct {
	Groups uint64 // commit groups written: bbolt transactions, each one fsync
	Events uint64 // events they recorded
}

// Stats returns what the writer has done since Open.
func (l *Ledger) Stats() Stats {
	return Stats{Groups: l.groups.Load(), Events: l.grouped.Load()}
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

// Stalled returns why commits fail while they do (see Options.OnStall),
// a nil error while they succeed, and when they last started to fail (kept
// once they succeed again, so that a caller can tell a stall came and went
// while it waited; zero if they never failed).
func (l *Ledger) Stalled() (since time.Time, err error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.stallSince, l.stall
}

// Checkpoint returns the latest signed checkpoint note; it covers every
// event Append has acknowledged.
func (l *Ledger) Checkpoint() ([]byte, error) {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return bytes.Clone(l.latest), nil
}

// Add queues events to be stored in order, in one commit group, with puts
// in the same bbolt transaction, and returns without waiting: the Future
// tells when they are durable. Whatever is added or appended after Add
// returns is stored after events; so a caller that orders its records
// under a lock of its own need hold it only while it adds, not while the
// group is written (the fetch loop adds a dispatch under its source's send
// lock and waits outside it).
//
// Add takes events over: the ledger fills in Seq, Time, Mono, PrevHash and
// Hash in place, and, for an idempotency key appended before, leaves the
// first event with that key. The caller must not touch events until the
// Future has told the outcome, nor ever again if it stopped waiting first.
//
// Puts are the state the events describe (a staged payload with its
// payload.staged), on disk exactly when they are, never before or without
// them; they are applied after the group's events, in the order the adds
// came. Add refuses (EINVALID) what would fail a commit group: an invalid
// event, no event, a put into one of the ledger's own buckets, into a
// bucket that does not exist, or with a key or value bbolt would refuse.
// After Close it fails with ErrClosed.
func (l *Ledger) Add(events []auditd.Event, puts ...auditd.Put) (auditd.Future, error) {
	if len(events) == 0 {
		return nil, auditd.Errorf(auditd.EINVALID, "an add needs an event")
	}
	for i := range events {
		if err := validate(&events[i]); err != nil {
			return nil, err
		}
	}
	if err := l.checkPuts(puts); err != nil {
		return nil, err
	}
	r := l.request()
	r.events, r.puts = events, puts
	if err := l.enqueue(r); err != nil {
		r.recycle()
		return nil, err
	}
	return r, nil
}

// request returns a request from the pool.
func (l *Ledger) request() *request {
	r, _ := l.requests.Get().(*request)
	if r == nil {
		r = &request{l: l, done: make(chan struct{}, 1)}
	}
	return r
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
	if err := ctx.Err(); err != nil {
		return auditd.Event{}, err
	}
	if err := validate(&e); err != nil {
		return auditd.Event{}, err
	}
	// The event is stored in the request's own array, not a slice of its
	// own: an event is 600 bytes (BenchmarkAppendParallel).
	r := l.request()
	r.one[0] = e
	r.events = r.one[:]
	if err := l.enqueue(r); err != nil {
		r.recycle()
		return auditd.Event{}, err
	}
	if err := r.wait(ctx); err != nil {
		return auditd.Event{}, err // r stays out of the pool: the writer may not be done with it
	}
	stored, err := r.one[0], r.err
	r.one[0] = auditd.Event{}
	r.recycle()
	if err != nil {
		return auditd.Event{}, err
	}
	return stored, nil
}

// AppendBatch records events in order in one commit group and returns them
// as stored: all are durable together, or none is. It leaves events as
// they were.
func (l *Ledger) AppendBatch(ctx context.Context, events []auditd.Event) ([]auditd.Event, error) {
	if len(events) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	stored := slices.Clone(events)
	f, err := l.Add(stored)
	if err != nil {
		return nil, err
	}
	if err := f.Wait(ctx); err != nil {
		return nil, err
	}
	return stored, nil
}

// request is one Add, from its queueing until its commit group is decided:
// the Future Add returns. Once the outcome is told (Wait returns it, or
// Then's function has run) it goes back to the ledger's pool.
type request struct {
	l      *Ledger
	events []auditd.Event // the caller's, stored in place (or one, for Append)
	one    [1]auditd.Event
	puts   []auditd.Put
	err    error
	done   chan struct{} // buffered: the decision, unless Then took it

	mu   sync.Mutex
	then func([]auditd.Event, error) // set by Then while undecided
	told bool                        // decided
}

// Wait waits until the events are durable, or ctx ends. A nil error leaves
// the events given to Add as stored. If ctx ends first, the events may
// still be recorded.
func (r *request) Wait(ctx context.Context) error {
	if err := r.wait(ctx); err != nil {
		return err // r stays out of the pool: the writer may not be done with it
	}
	err := r.err
	r.recycle()
	return err
}

// wait waits until r is decided, or returns ctx's error.
func (r *request) wait(ctx context.Context) error {
	done := ctx.Done()
	if done == nil {
		// A context that never ends (the fetch loop records with
		// context.WithoutCancel): a receive, not a select
		// (BenchmarkAppendParallel).
		<-r.done
		return nil
	}
	select {
	case <-r.done:
		return nil
	case <-done:
		return ctx.Err()
	}
}

// Then hands the outcome to fn once the commit group is decided: the
// events as stored, or the error that kept them out (and no events). fn
// runs on the ledger's commit goroutine, or at once on the caller's when
// the group was decided before Then was called; it must be quick, must not
// add or append (it would wait for itself), and must not keep the slice.
func (r *request) Then(fn func(stored []auditd.Event, err error)) {
	r.mu.Lock()
	if !r.told {
		r.then = fn
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	<-r.done // decided before Then was called
	fn(r.outcome())
	r.recycle()
}

// decide tells the outcome, err or the events stored, to whoever waits.
func (r *request) decide(err error) {
	r.mu.Lock()
	r.err, r.told = err, true
	fn := r.then
	r.mu.Unlock()
	if fn == nil {
		r.done <- struct{}{}
		return
	}
	fn(r.outcome())
	r.recycle()
}

// recycle puts r back in its ledger's pool. It clears what r refers to,
// one by one: clearing r whole would clear its array of one event too, on
// every Add (BenchmarkLoopInMemory).
func (r *request) recycle() {
	r.events, r.puts, r.err, r.then, r.told = nil, nil, nil, nil, false
	r.l.requests.Put(r)
}

func (r *request) outcome() ([]auditd.Event, error) {
	if r.err != nil {
		return nil, r.err
	}
	return r.events, nil
}

// checkPuts refuses puts that would fail their commit group: an empty or
// oversized key, an oversized value, a ledger bucket, a bucket that does
// not exist. Buckets found once are remembered; none is ever deleted.
func (l *Ledger) checkPuts(puts []auditd.Put) error {
	var missing []string
	for _, p := range puts {
		switch {
		case len(p.Key) == 0 || len(p.Key) > bolt.MaxKeySize:
			return auditd.Errorf(auditd.EINVALID, "put into %s: key of %d bytes", p.Bucket, len(p.Key))
		case len(p.Value) > bolt.MaxValueSize:
			return auditd.Errorf(auditd.EINVALID, "put into %s: value of %d bytes", p.Bucket, len(p.Value))
		case bytes.HasPrefix(p.Bucket, []byte("ledger.")):
			return auditd.Errorf(auditd.EINVALID, "put into %s: the ledger's buckets take only events", p.Bucket)
		}
		if _, ok := l.sideBuckets.Load(string(p.Bucket)); !ok {
			missing = append(missing, string(p.Bucket))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return l.db.View(func(tx *bolt.Tx) error {
		for _, name := range missing {
			if tx.Bucket([]byte(name)) == nil {
				return auditd.Errorf(auditd.EINVALID, "put into %s: no such bucket", name)
			}
			l.sideBuckets.Store(name, true)
		}
		return nil
	})
}

// enqueue puts r at the end of the writer's queue.
func (l *Ledger) enqueue(r *request) error {
	l.qmu.Lock()
	if l.closed {
		l.qmu.Unlock()
		return ErrClosed
	}
	l.queue = append(l.queue, r)
	first := len(l.queue) == 1
	l.qmu.Unlock()
	if first {
		// The writer sleeps with requests queued only while it waits for
		// a batch to be written, and looks again when it is: only an
		// empty queue needs a wake-up.
		l.signal()
	}
	return nil
}

// signal wakes the writer, or leaves it a wake-up if it is busy.
func (l *Ledger) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// validate rejects what the ledger must never store. The size test counts
// only the variable-length fields: the fixed ones add well under 1 KiB.
func validate(e *auditd.Event) error {
	if e.Type == "" {
		return auditd.Errorf(auditd.EINVALID, "event type is required")
	}
	if err := e.CheckShared(); err != nil {
		return err
	}
	n := len(e.Type) + len(e.RunID) + len(e.SourceID) + len(e.ItemKey) + len(e.IdempotencyKey) +
		len(e.Method) + len(e.Path) + len(e.Gate) + len(e.RetryAfterRaw) + len(e.ErrorText) + len(e.From) + len(e.To) +
		len(e.Group) + len(e.Cause) + len(e.Snapshot) + len(e.Outcome) + len(e.Reason) + len(e.BodyError) +
		len(e.PayloadHash) + len(e.Head) + len(e.Principal) + len(e.Detail)
	if n > MaxEventSize-1024 {
		return auditd.Errorf(auditd.EINVALID, "event of %d bytes is too large", n)
	}
	return nil
}

// getEventAt decodes event seq, or returns ErrNotFound.
func getEventAt(events *bolt.Bucket, seq uint64) (auditd.Event, error) {
	var e auditd.Event
	v, err := getRecord(events, seq)
	if err != nil {
		return e, err
	}
	if err := decodeRecord(v, &e, nil); err != nil {
		return e, err
	}
	if e.Seq != seq {
		return e, fmt.Errorf("%w: event stored as %d says it is %d", ErrCorrupt, seq, e.Seq)
	}
	return e, nil
}
