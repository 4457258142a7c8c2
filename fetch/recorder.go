package fetch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/staging"
)

// recorder writes the loop's records to the ledger: a run's events, each
// counted into the live run once durable, whether the caller waits for
// them (record, recordBatch) or posts them (post); and, under a source's
// send lock, the dispatch, throttle and breaker records whose order against
// each other the reconciliation relies on.
type recorder struct {
	ledger   Ledger
	staging  *staging.Store
	limiter  *limiter.Limiter
	registry *registry.Registry
	clock    clock.Clock
	log      *slog.Logger

	mu        sync.Mutex
	sendLocks map[string]*sync.Mutex // per source, or gateway group: orders dispatch and breaker events

	// ended counts the items ended, for compactEvery; compacting is true
	// while a compaction of staging runs, and compactions waits for it.
	compactEvery int64
	ended        atomic.Int64
	compacting   atomic.Bool
	compactions  sync.WaitGroup

	// eventBufs hold a request's records (*[2]auditd.Event) until the
	// ledger has told their outcome: a dispatch, a response and an item's
	// end are allocations of nearly 600 bytes each otherwise
	// (BenchmarkLoopInMemory: 2.4 allocs/req and 2 GC cycles a run fewer).
	eventBufs sync.Pool
}

// eventBuf returns a buffer for up to two events.
func (r *recorder) eventBuf() *[2]auditd.Event {
	if b, ok := r.eventBufs.Get().(*[2]auditd.Event); ok {
		return b
	}
	return new([2]auditd.Event)
}

// freeEventBuf returns b, whose events the ledger is done with, to the
// pool. Whoever takes it next sets each event it uses whole.
func (r *recorder) freeEventBuf(b *[2]auditd.Event) {
	r.eventBufs.Put(b)
}

// recordBatch records events for run ar in one commit group and counts
// them. It returns once all are durable, and leaves them as stored.
func (r *recorder) recordBatch(ctx context.Context, ar *activeRun, events []auditd.Event) error {
	for i := range events {
		events[i].RunID = ar.id
	}
	f, err := r.ledger.Add(events)
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(events), err)
	}
	ar.live.Count(events...)
	return nil
}

// post records the first n events of buf for run ar, with puts in the same
// transaction, without waiting for them to be durable: for what has
// already happened when nothing the caller does next depends on the record
// (a response, an item's end). It takes buf over, and frees it once the
// ledger has told the outcome. Whatever the run records after post
// returns is stored after them; a run's run.finished therefore waits for
// all of them. When they end an item (res is not nil, and the last event
// is its item.finished), res is stored as the item's result in the same
// commit (runs.ResultPut); a proxied request's item is stored so with its
// item.queued. Once they are durable they are counted, and staging learns
// that the puts are stored (a last-good record among them makes its copy
// usable by every run). A failure is logged, as mustRecord logs it: the
// record describes something that happened, and the reconciliation will
// show the gap.
func (r *recorder) post(ar *activeRun, buf *[2]auditd.Event, n int, puts []auditd.Put, res *auditd.ItemResult) {
	events := buf[:n]
	for i := range events {
		events[i].RunID = ar.id
	}
	puts = append(puts, queuedPuts(ar, events)...)
	typ, item := events[0].Type, events[0].ItemKey
	if res != nil {
		puts = append(puts, ar.live.ResultPut(item, res)) // stored with its item.finished
	}
	f, err := r.ledger.Add(events, puts...)
	if err != nil {
		r.freeEventBuf(buf)
		r.postFailed(ar, typ, item, puts, err)
		return
	}
	ar.posts.Add(1)
	f.Then(func(stored []auditd.Event, err error) {
		defer ar.posts.Done()
		defer r.freeEventBuf(buf)
		if err != nil {
			r.postFailed(ar, typ, item, puts, err)
			return
		}
		ar.live.Count(stored...)
		if len(puts) > 0 {
			r.staging.Stored(puts) // a new last good copy is usable from now on
		}
		if res != nil && r.ended.Add(1)%r.compactEvery == 0 {
			r.compactStaging()
		}
	})
}

// compactStaging moves, in the background, the payloads and last good
// copies staging keeps since its last compaction to their indexes
// (staging.Store.Compact), unless a compaction is running. Staging keeps
// them, in its spool and in memory, until then: at every run's end alone
// that would be a share of every item of a long run.
func (r *recorder) compactStaging() {
	if !r.compacting.CompareAndSwap(false, true) {
		return
	}
	r.compactions.Add(1)
	go func() {
		defer r.compactions.Done()
		defer r.compacting.Store(false)
		if _, err := r.staging.Compact(); err != nil {
			r.log.Error("compact staged payloads", "err", err)
		}
	}()
}

// queuedPuts are what store the items of a proxy-mode run ar whose
// item.queued is among events, for the ledger's commit of them
// (runs.Live.QueuedPuts).
func queuedPuts(ar *activeRun, events []auditd.Event) []auditd.Put {
	if ar.proxy == nil {
		return nil
	}
	var puts []auditd.Put
	for i := range events {
		if events[i].Type == auditd.EventItemQueued {
			puts = append(puts, ar.live.QueuedPuts(events[i].ItemKey)...)
		}
	}
	return puts
}

// postFailed logs a post that failed, and tells staging that its puts were
// never stored: a payload's spool entry among them is not to be looked for.
func (r *recorder) postFailed(ar *activeRun, typ auditd.EventType, item string, puts []auditd.Put, err error) {
	r.log.Error("ledger append failed", "run", ar.id, "type", typ, "item", item, "err", err)
	for _, p := range puts {
		r.staging.Unspool(p)
	}
}

// queueItems records item.queued for items, a commit group at a time.
func (r *recorder) queueItems(ctx context.Context, ar *activeRun, items []auditd.Item) error {
	batch := make([]auditd.Event, 0, min(len(items), queueBatch))
	flush := func() error {
		if err := r.recordBatch(ctx, ar, batch); err != nil {
			return err
		}
		batch = batch[:0]
		return nil
	}
	for i := range items {
		it := &items[i]
		// Path is redacted already (Submit), or was when stored (resume).
		batch = append(batch, auditd.Event{
			Type: auditd.EventItemQueued, RunID: ar.id, SourceID: it.SourceID, ItemKey: it.Key,
			Method: it.Method, Path: it.Path,
		})
		if len(batch) == queueBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

// record records e for run ar and counts it. It returns once e is durable,
// with e as stored.
func (r *recorder) record(ctx context.Context, ar *activeRun, e auditd.Event) (auditd.Event, error) {
	events := []auditd.Event{e}
	events[0].RunID = ar.id
	f, err := r.ledger.Add(events)
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return auditd.Event{}, fmt.Errorf("append %s: %w", e.Type, err)
	}
	ar.live.Count(events...)
	return events[0], nil
}

// queueDispatch checks, under the source's send lock, that the request p
// admitted may still go, and adds its dispatch record, e, to the ledger. The send lock
// orders dispatch records against breaker and throttle records: a dispatch
// is on record either before a throttle or after its pause is in force.
// Holding it while the dispatch is added is enough for that, since the
// ledger stores e before anything added after it; the wait for e's commit
// group, the longest part of a dispatch, is the caller's, outside the
// lock, so that the source's other requests can share the group.
func (r *recorder) queueDispatch(ar *activeRun, sourceID string, p *limiter.Permit, e []auditd.Event) (auditd.Future, error) {
	mu := r.sendLock(sourceID)
	mu.Lock()
	defer mu.Unlock()
	if st, err := r.limiter.State(sourceID); err == nil {
		if !p.Probe && st.Breaker != limiter.BreakerClosed {
			p.Release()
			return nil, errBreakerOpened
		}
		if st.PausedUntil.After(r.clock.Now()) {
			p.Release()
			return nil, errPausedMeanwhile
		}
	}
	f, err := r.ledger.Add(e, queuedPuts(ar, e)...)
	if err != nil {
		p.Release()
		return nil, fmt.Errorf("append %s: %w", auditd.EventDispatch, err)
	}
	return f, nil
}

// recordThrottle records a throttle and pauses the source from that record
// on, under the source's send lock, so no dispatch recorded after it can
// carry a time inside [throttle.Time, throttle.Time+Wait). It returns the
// throttle's recorded time (zero when it could not be recorded).
func (r *recorder) recordThrottle(ctx context.Context, ar *activeRun, e auditd.Event) time.Time {
	mu := r.sendLock(e.SourceID)
	mu.Lock()
	defer mu.Unlock()
	ev := r.mustRecord(ctx, ar, e)
	r.limiter.Pause(e.SourceID, ev.Time.Add(e.Wait))
	return ev.Time
}

// recordBreaker records breaker transitions under the source's send lock.
func (r *recorder) recordBreaker(ctx context.Context, ar *activeRun, it *auditd.Item, ts []limiter.Transition) {
	if len(ts) == 0 {
		return
	}
	mu := r.sendLock(it.SourceID)
	mu.Lock()
	defer mu.Unlock()
	r.recordTransitions(ctx, ar, it, ts)
}

func (r *recorder) recordTransitions(ctx context.Context, ar *activeRun, it *auditd.Item, ts []limiter.Transition) {
	for _, t := range ts {
		r.mustRecord(ctx, ar, breakerEvent(it, t))
	}
}

// mustRecord appends an event that describes something that already
// happened. If the ledger cannot take it the service cannot keep its
// promise, so the error is logged loudly; the reconciliation will show the gap.
func (r *recorder) mustRecord(ctx context.Context, ar *activeRun, e auditd.Event) auditd.Event {
	got, err := r.record(ctx, ar, e)
	if err != nil {
		r.log.Error("ledger append failed", "run", ar.id, "type", e.Type, "err", err)
	}
	return got
}

// sendLock returns the lock that orders a source's dispatch, throttle and
// breaker records: a request admitted just before another worker opens the
// breaker or pauses the source must not be recorded as dispatched after it.
// Members of a gateway group share one lock, as they share one pause.
func (r *recorder) sendLock(sourceID string) *sync.Mutex {
	key := sourceID
	if lim, err := r.registry.Limits(sourceID); err == nil && lim.Group != "" {
		key = "group:" + lim.Group
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	m := r.sendLocks[key]
	if m == nil {
		m = &sync.Mutex{}
		r.sendLocks[key] = m
	}
	return m
}

// recordRestart records that a started run resumes after a restart: its
// run.resumed, then a dispatch.interrupted for each dispatch in open, which
// had no outcome recorded before the restart.
func (r *recorder) recordRestart(ctx context.Context, ar *activeRun, open map[request]auditd.Event) error {
	if _, err := r.record(ctx, ar, auditd.Event{Type: auditd.EventRunResumed, Reason: "restart"}); err != nil {
		return err
	}
	for _, d := range sortedDispatches(open) {
		if _, err := r.record(ctx, ar, auditd.Event{
			Type: auditd.EventInterrupted, SourceID: d.SourceID, ItemKey: d.ItemKey, Page: d.Page,
			Attempt: d.Attempt, Method: d.Method, Path: d.Path, Reason: "no outcome recorded before the restart",
		}); err != nil {
			return err
		}
	}
	return nil
}
