package ledger

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// The write path, in order:
//
//  1. Add queues a request (Append and AppendBatch then wait for it).
//  2. The writer goroutine (run) takes queued requests and prepares them
//     into the pending batch as they come (prepare): it hands out sequence
//     numbers, encodes and hashes the records and extends the tree, all
//     outside any transaction.
//  3. When no batch is being committed, the writer seals the pending one
//     (seal: the checkpoint it will sign) and commits it on its own
//     goroutine (write): one fsynced bbolt transaction with the puts and
//     the signed checkpoint, then it answers the batch's requests.
//  4. While that fsync runs, the writer prepares the next batch from the
//     appends that arrive meanwhile, so each commit takes everything that
//     waited for the one before, already prepared.
//
// Batches commit one at a time, in order. A batch is prepared on top of the
// one being committed. If that one cannot be built (a put bbolt refuses),
// the pending one fails with it and the writer goes back to the last
// committed state, so no gap is left. If it was built but the disk refused
// to write it (full, say), the writer goes back the same way, puts both
// batches' requests back at the head of the queue and, after a backoff,
// prepares and writes them again: their appenders wait, and nothing added
// after them is stored before them (Options.OnStall).

// maxKeptScratch is the most buffer space a batch keeps for the next one; a
// batch of unusually large events gets its own, then drops it.
const maxKeptScratch = 4 << 20

// treeEntryLeaves is how many leaves at most share a tree bucket entry
// (see doc.go). One entry per event costs a Put each; one per batch is a
// value of tens of KiB on overflow pages, which bbolt copies again when the
// next batch adds to its leaf. Eight leaves' hashes, about 500 bytes, pack
// seven entries to a 4 KiB page.
const treeEntryLeaves = 8

// tip is where the writer has got to: the last sequence number handed out,
// and the chain and tree after it.
type tip struct {
	seq         uint64
	chain       [32]byte
	front       frontier
	lastHistory uint64 // size of the last checkpoint kept in the history
}

func (t *tip) clone() tip {
	c := *t
	c.front = t.front.clone()
	return c
}

// tree is what a checkpoint of the tip says.
func (t *tip) tree(origin string, now time.Time) SignedTree {
	return SignedTree{Origin: origin, Size: t.seq, Root: t.front.root(), Time: now.UTC(), Chain: t.chain}
}

// batch is one commit group, prepared before its transaction.
//
// bbolt keeps the key and value slices given to Put until the transaction
// ends, so they are cut from buf and hashes, which are only rewound (reset)
// once the batch has been written. When an append outgrows one of them the
// slices already cut stay in the old array, untouched.
type batch struct {
	reqs   []*request
	events int // events requested, for MaxGroup
	before tip // the writer's tip before this batch, to roll back to

	records []kv                    // events bucket
	tree    []kv                    // tree bucket
	idem    []kv                    // idempotency bucket
	keys    map[string]auditd.Event // idempotency keys first seen in this batch
	runs    runIndex

	checkpoint SignedTree // set by seal
	history    bool       // keep the checkpoint in the history too

	buf    []byte      // backs the keys and values of records
	blocks []byte      // backs the blocks write packs records into
	hashes []byte      // backs the values of tree
	entry  int         // where the tree entry being built starts in hashes
	stored []tlog.Hash // what one leaf completed
	leaf   leafHasher

	observed []*auditd.Event // backs what observe hands the Observer
}

type kv struct{ key, val []byte }

func (b *batch) reset() {
	if cap(b.buf) > maxKeptScratch || cap(b.blocks) > maxKeptScratch || cap(b.hashes) > maxKeptScratch {
		*b = batch{}
		return
	}
	clear(b.reqs) // let the requests go
	clear(b.keys)
	b.runs.reset()
	*b = batch{
		reqs: b.reqs[:0], records: b.records[:0], tree: b.tree[:0], idem: b.idem[:0], keys: b.keys, runs: b.runs,
		buf: b.buf[:0], blocks: b.blocks[:0], hashes: b.hashes[:0], stored: b.stored[:0], leaf: b.leaf,
		observed: b.observed[:0],
	}
}

// run is the writer. It prepares queued appends into the pending batch and
// commits one batch at a time, until Close; appends queued before Close are
// committed first.
// writer is the state of the goroutine that writes the ledger's commit
// groups (Ledger.run): the batch being filled, the one being written, and
// the timers that make a batch wait to grow or a refused one wait to be
// written again.
type writer struct {
	pending  *batch
	inflight *batch     // being written
	spare    *batch     // written, kept for its buffers
	written  chan error // the outcome of writing inflight
	closed   bool

	sealed  time.Time        // when the last batch was sealed
	took    time.Duration    // from then until it was written
	busy    bool             // it held at least busyRequests requests
	linger  *time.Timer      // armed while a batch waits to grow
	lingerC <-chan time.Time // linger's channel while armed

	backoff time.Duration    // since the last write the disk refused; 0 when writing
	retry   *time.Timer      // armed while a refused batch waits to be written again
	retryC  <-chan time.Time // retry's channel while armed
}

func (l *Ledger) run() {
	defer close(l.done)
	w := &writer{pending: &batch{}, spare: &batch{}, written: make(chan error)}
	var group []*request
	for {
		group, w.closed = l.take(group[:0], l.maxGroup-w.pending.events, len(w.pending.reqs) == 0)
		for _, r := range group {
			l.prepare(w.pending, r, w.inflight)
		}
		clear(group)
		if w.closed && w.retryC != nil {
			w.retry.Stop()
			w.retryC = nil // closing: one last try, then the appends fail
		}
		if w.inflight == nil && w.retryC == nil && len(w.pending.reqs) > 0 && l.sealOrLinger(w) {
			continue
		}
		if w.inflight == nil && w.closed && len(w.pending.reqs) == 0 {
			return // and the queue is empty: take had room for all of it
		}
		select {
		case <-l.wake:
		case <-w.lingerC:
			w.lingerC = nil
		case <-w.retryC:
			w.retryC = nil
		case err := <-w.written:
			l.wrote(w, err)
		}
	}
}

// sealOrLinger starts writing the pending batch when it has waited long
// enough to grow, and reports whether it did; otherwise it arms the linger
// timer.
func (l *Ledger) sealOrLinger(w *writer) bool {
	wait := l.lingerFor(w.pending, w.busy, w.sealed, w.took, w.closed)
	if wait <= 0 {
		if w.lingerC != nil {
			w.linger.Stop()
			w.lingerC = nil
		}
		l.seal(w.pending)
		w.sealed, w.busy = time.Now(), len(w.pending.reqs) >= busyRequests
		w.inflight, w.pending, w.spare = w.pending, w.spare, nil
		go func(b *batch) { w.written <- l.write(b) }(w.inflight)
		return true
	}
	if w.lingerC == nil {
		w.linger = resetTimer(w.linger, wait)
		w.lingerC = w.linger.C
	}
	return false
}

// wrote takes the outcome of writing the inflight batch.
func (l *Ledger) wrote(w *writer, err error) {
	w.took = time.Since(w.sealed)
	var failed *writeError
	switch {
	case err == nil:
		if w.backoff > 0 {
			w.backoff = 0
			l.stalled(nil)
		}
	case errors.As(err, &failed) && !w.closed:
		// The disk refused the write (full, say): put the batch and the
		// one prepared on top of it back at the head of the queue, to be
		// prepared again (stamped anew) and written once the backoff has
		// passed. Nothing is answered, so appenders wait, and nothing
		// added later can be stored before them.
		l.tip = w.inflight.before
		l.requeue(w.inflight.reqs, w.pending.reqs)
		w.pending.reset()
		w.backoff = min(max(2*w.backoff, minRetry), maxRetry)
		w.retry = resetTimer(w.retry, w.backoff)
		w.retryC = w.retry.C
		l.stalled(failed.err)
	default:
		// The batch could not be built in a transaction, or the ledger is
		// closing: it fails, and pending, prepared on top of it, with it.
		l.tip = w.inflight.before
		if failed != nil {
			err = failed.err
		}
		l.answer(w.inflight.reqs, err)
		l.answer(w.pending.reqs, fmt.Errorf("previous commit group failed: %w", err))
		w.pending.reset()
	}
	w.inflight.reset()
	w.spare, w.inflight = w.inflight, nil
}

// resetTimer arms t (made on first use) to fire after d.
func resetTimer(t *time.Timer, d time.Duration) *time.Timer {
	if t == nil {
		return time.NewTimer(d)
	}
	t.Reset(d)
	return t
}

// Retries of a commit group the disk refused start at minRetry apart and
// double up to maxRetry.
const (
	minRetry = 10 * time.Millisecond
	maxRetry = 2 * time.Second
)

// writeError is a commit group that was built but could not be written:
// the fsynced commit (or Options.WriteFault) failed. Such a group is
// retried; one that could not be built fails its appenders.
type writeError struct{ err error }

func (e *writeError) Error() string { return e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// requeue puts the requests of failed batches back at the head of the
// queue, in order, ahead of those that came since.
func (l *Ledger) requeue(batches ...[]*request) {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	var back []*request
	for _, reqs := range batches {
		back = append(back, reqs...)
	}
	l.queue = append(back, l.queue...)
}

// stalled notes that writes fail with err, or succeed again (nil), and
// tells Options.OnStall when that changes.
func (l *Ledger) stalled(err error) {
	l.mu.Lock()
	was := l.stall
	l.stall = err
	if err != nil && was == nil {
		l.stallSince = time.Now()
	}
	l.mu.Unlock()
	if l.onStall != nil && (err == nil) != (was == nil) {
		l.onStall(err)
	}
}

// busyRequests is how many requests a commit group must hold for the
// writer to count the ledger as busy, and let the next group linger.
const busyRequests = 16

// lingerFor says how long the pending batch b should wait for more appends
// before it is sealed: under load (the last group, sealed at sealed and
// written took later, was busy) a group is sealed no sooner than one and
// a half times took after that seal, and no later than GroupDelay after
// it, so that each fsync carries more events; otherwise at once: an
// appender alone never waits, nor does a batch of a quarter of MaxGroup
// (an fsync's share per event is small by then, and appenders that all
// wait for the group being written come back together: the next batch
// should start while it is written), nor the last batch before Close.
//
// The bound follows the disk's pace. The group grows while the one
// before it is written anyway; lingering half as long again cuts the
// fsyncs per event by a third. A fixed GroupDelay on a disk that commits
// in under a millisecond held every waiting appender (a proxied request's
// dispatch, say) for many fsyncs' time, and twice the commit's time left
// the writer idle, with every appender waiting, a third of the time
// (BenchmarkProxyThroughput, docs/bench/proxy.md).
//
// This is wall time, not the ledger's clock: it paces fsyncs and records
// nothing, and a fake clock must not be able to hold a commit back.
func (l *Ledger) lingerFor(b *batch, busy bool, sealed time.Time, took time.Duration, closed bool) time.Duration {
	if !busy || closed || l.groupDelay <= 0 || b.events >= l.maxGroup/4 {
		return 0
	}
	return min(l.groupDelay, took+took/2) - time.Since(sealed)
}

// take moves into group the requests at the head of the queue that fit in
// room events (the first one in any case when first is set, so that no
// request is too large to ever be taken), and says whether Close was
// called. The queue keeps its array: appenders need not grow a new one for
// every batch.
func (l *Ledger) take(group []*request, room int, first bool) ([]*request, bool) {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	n := 0
	for n < len(l.queue) && (len(l.queue[n].events) <= room || first && n == 0) {
		room -= len(l.queue[n].events)
		n++
	}
	group = append(group, l.queue[:n]...)
	rest := copy(l.queue, l.queue[n:])
	clear(l.queue[rest:])
	l.queue = l.queue[:rest]
	return group, l.closed
}

// prepare adds r to b: it resolves r's idempotency keys, hands out sequence
// numbers and builds every record, hash and index entry, moving the tip on.
// inflight, when not nil, is the batch being written before b.
func (l *Ledger) prepare(b *batch, r *request, inflight *batch) {
	firsts, err := l.storedFirsts(r, b, inflight)
	if err != nil {
		l.answer([]*request{r}, err)
		return
	}
	if len(b.reqs) == 0 {
		b.before = l.tip.clone()
	}
	b.reqs = append(b.reqs, r)
	b.events += len(r.events)
	now := l.clock.Now()
	stamp := time.Unix(0, now.UnixNano()).UTC() // what decoding gives back
	mono := now.Sub(l.start)
	repeats := 0
	for i := range r.events {
		e := &r.events[i]
		if k := e.IdempotencyKey; k != "" {
			if first, ok := b.firstWithKey(k, inflight, firsts); ok {
				*e = first
				repeats++
				continue
			}
		}
		l.tip.seq++
		e.Seq, e.Time, e.Mono, e.PrevHash = l.tip.seq, stamp, mono, l.tip.chain
		key, canonical := b.record(e)
		l.tip.chain = e.Hash
		b.pushLeaf(&l.tip.front, b.leaf.hash(canonical))
		if e.Seq%treeEntryLeaves == 0 {
			b.tree = append(b.tree, kv{key, b.treeEntry()})
		}
		b.runs.add(e.RunID, e.Seq)
		if k := e.IdempotencyKey; k != "" {
			b.idem = append(b.idem, kv{[]byte(k), key})
			if b.keys == nil {
				b.keys = make(map[string]auditd.Event)
			}
			b.keys[k] = *e
		}
	}
	if repeats == len(r.events) {
		// An Add repeated whole: its puts were stored with the events the
		// first time, and must not overwrite what came since.
		r.puts = nil
	}
}

// storedFirsts looks up the committed events under r's idempotency keys
// that neither b nor inflight holds, in one read transaction, and only when
// r has such keys.
func (l *Ledger) storedFirsts(r *request, b, inflight *batch) (map[string]auditd.Event, error) {
	var keys []string
	for i := range r.events {
		if k := r.events[i].IdempotencyKey; k != "" {
			if _, ok := b.firstWithKey(k, inflight, nil); !ok {
				keys = append(keys, k)
			}
		}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	firsts := make(map[string]auditd.Event)
	err := l.db.View(func(tx *bolt.Tx) error {
		events, idem := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketIdempotency))
		for _, k := range keys {
			if v := idem.Get([]byte(k)); v != nil {
				if len(v) != 8 {
					return fmt.Errorf("idempotency key %q: %w: malformed entry", k, ErrCorrupt)
				}
				first, err := getEventAt(events, binary.BigEndian.Uint64(v))
				if err != nil {
					return fmt.Errorf("idempotency key %q: %w", k, err)
				}
				firsts[k] = first
			}
		}
		return nil
	})
	return firsts, err
}

// firstWithKey returns the first event appended with idempotency key k, if
// b, inflight or the committed events (firsts) hold it.
func (b *batch) firstWithKey(k string, inflight *batch, firsts map[string]auditd.Event) (auditd.Event, bool) {
	if e, ok := b.keys[k]; ok {
		return e, true
	}
	if inflight != nil {
		if e, ok := inflight.keys[k]; ok {
			return e, true
		}
	}
	e, ok := firsts[k]
	return e, ok
}

// record encodes e, whose Seq and PrevHash are set, sets e.Hash, adds its
// record to b and returns its events bucket key and the canonical encoding.
func (b *batch) record(e *auditd.Event) (key, canonical []byte) {
	start := len(b.buf)
	b.buf = binary.BigEndian.AppendUint64(b.buf, e.Seq)
	b.buf = append(b.buf, e.PrevHash[:]...)
	b.buf = MarshalCanonical(b.buf, e)
	e.Hash = sha256.Sum256(b.buf[start+8:])
	b.buf = append(b.buf, e.Hash[:]...)
	end := len(b.buf)
	key, val := b.buf[start:start+8:start+8], b.buf[start+8:end:end]
	b.records = append(b.records, kv{key, val})
	return key, val[sha256.Size : len(val)-sha256.Size]
}

// pushLeaf pushes leaf onto front and adds the hashes it completed to the
// tree entry being built.
func (b *batch) pushLeaf(front *frontier, leaf tlog.Hash) {
	b.stored = front.push(leaf, b.stored[:0])
	for _, h := range b.stored {
		b.hashes = append(b.hashes, h[:]...)
	}
}

// treeEntry returns the tree entry built since the last call.
func (b *batch) treeEntry() []byte {
	start, end := b.entry, len(b.hashes)
	b.entry = end
	return b.hashes[start:end:end]
}

// seal ends b: its last tree entry and the checkpoint that will cover it.
func (l *Ledger) seal(b *batch) {
	if len(b.records) == 0 {
		return // only idempotent repeats: nothing new to sign
	}
	if entry := b.treeEntry(); len(entry) > 0 {
		b.tree = append(b.tree, kv{seqKey(l.tip.seq), entry})
	}
	b.checkpoint = l.tip.tree(l.signer.Name(), l.clock.Now())
	b.history = l.tip.seq-l.tip.lastHistory >= l.checkpointEvery
	if b.history {
		l.tip.lastHistory = l.tip.seq
	}
}

// write commits b in one transaction, publishes the new head and answers
// b's requests. It runs on its own goroutine, one batch at a time. On
// failure it answers nothing: run decides whether b fails or is written
// again. A *writeError is a batch built but not written.
func (l *Ledger) write(b *batch) error {
	if len(b.records) == 0 {
		// Only idempotent repeats, of events already committed (by an
		// earlier batch, written before this one) or in this batch.
		l.answer(b.reqs, nil)
		return nil
	}
	start := time.Now()
	tx, err := l.db.Begin(true)
	if err != nil {
		return err
	}
	latest, err := l.fill(tx, b)
	if err == nil && l.writeFault != nil {
		if err = l.writeFault(); err != nil {
			err = &writeError{err}
		}
	}
	if err != nil {
		tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return &writeError{err}
	}
	l.mu.Lock()
	l.head, l.headHash, l.latest = b.checkpoint.Size, b.checkpoint.Chain, latest
	l.mu.Unlock()
	l.groups.Add(1)
	l.grouped.Add(uint64(len(b.records)))
	if l.observer != nil {
		l.observe(b, time.Since(start))
	}
	l.answer(b.reqs, nil)
	return nil
}

// observe tells the observer of b's stored events: b numbers them in
// order, so an event numbered no later than one already seen is a repeat
// (of an earlier batch's, or of this one's).
func (l *Ledger) observe(b *batch, took time.Duration) {
	events := b.observed[:0]
	last := b.before.seq
	for _, r := range b.reqs {
		for i := range r.events {
			if e := &r.events[i]; e.Seq > last {
				events = append(events, e)
				last = e.Seq
			}
		}
	}
	l.observer.Committed(events, took)
	clear(events)
	b.observed = events
}

// fill puts b's records, index entries, puts and signed checkpoint in tx,
// and returns the checkpoint.
func (l *Ledger) fill(tx *bolt.Tx, b *batch) ([]byte, error) {
	events, tree, idem := tx.Bucket([]byte(bucketEvents)), tx.Bucket([]byte(bucketTree)), tx.Bucket([]byte(bucketIdempotency))
	events.FillPercent, tree.FillPercent = 1.0, 1.0
	if err := putRecords(events, b.records, &b.blocks); err != nil {
		return nil, err
	}
	for _, p := range b.tree {
		if err := tree.Put(p.key, p.val); err != nil {
			return nil, fmt.Errorf("append tree hashes to %d: %w", binary.BigEndian.Uint64(p.key), err)
		}
	}
	for _, p := range b.idem {
		if err := idem.Put(p.key, p.val); err != nil {
			return nil, fmt.Errorf("index event %d: %w", binary.BigEndian.Uint64(p.val), err)
		}
	}
	if err := b.runs.put(tx.Bucket([]byte(bucketRuns))); err != nil {
		return nil, err
	}
	for _, r := range b.reqs {
		for _, p := range r.puts {
			bucket := tx.Bucket(p.Bucket)
			if bucket == nil {
				return nil, fmt.Errorf("put into %s: no such bucket", p.Bucket)
			}
			if err := bucket.Put(p.Key, p.Value); err != nil {
				return nil, fmt.Errorf("put into %s: %w", p.Bucket, err)
			}
		}
	}
	return l.putCheckpoint(tx, b.checkpoint, b.history)
}

// answer tells the adders of reqs the outcome of their commit group: err,
// or their events as stored.
func (l *Ledger) answer(reqs []*request, err error) {
	for _, r := range reqs {
		r.decide(err)
	}
}
