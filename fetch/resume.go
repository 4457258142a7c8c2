package fetch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/runs"
)

// resume picks up a run that a crash or restart left unfinished. The ledger
// is the truth: counters are recounted from it, results of the items it
// shows finished are rebuilt from their item.finished and those items
// skipped, attempts continue their numbering, and every dispatch it shows
// without an outcome is recorded as interrupted. A run the ledger shows
// finished only has its end stored.
//
// resume returns what starts the run's workers (nil when there is nothing
// left to do); the caller gives the gates what was sent before the restart
// (seedGates) before it calls that.
func (l *Loop) resume(ctx context.Context, id string) (launch func(), err error) {
	live, legacy, err := l.cfg.Runs.Resume(id)
	if err != nil {
		return nil, err
	}
	if live.Run().Mode == auditd.RunProxy {
		return l.resumeProxy(ctx, live)
	}
	ar := newActiveRun(live)
	var byKey map[string]*auditd.Item
	if live.Rebuilds() {
		byKey = make(map[string]*auditd.Item, len(legacy))
		for i := range legacy {
			byKey[legacy[i].Key] = &legacy[i]
		}
	}
	// The ledger queues a run's items in the order the store holds them,
	// a page after the one before: what a crash left unqueued is the
	// store's items from the count the ledger queued on.
	q := queuedItems{sources: map[string]bool{}}
	rp, err := replay(l.cfg.Ledger, live, byKey, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventItemQueued:
			q.add(e)
		case auditd.EventItemFinished:
			delete(ar.resumed, e.ItemKey)
		case auditd.EventDispatch:
			ar.seen(request{key: e.ItemKey, page: int(e.Page)}, e.Attempt)
		case auditd.EventThrottle:
			ar.forgiven(request{key: e.ItemKey, page: int(e.Page)})
		case auditd.EventInterrupted:
			if auditd.NotSent(e) { // its fleet slot passed: not an attempt of the page's
				ar.forgiven(request{key: e.ItemKey, page: int(e.Page)})
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var items []auditd.Item
	if !rp.started {
		// The crash came between storing the run and recording its
		// start (one commit): it starts now, with all its items.
		if items, err = l.itemsFrom(id, legacy, 0, nil); err != nil {
			return nil, err
		}
		for _, it := range items {
			q.sources[it.SourceID] = true
		}
	}
	if cont, err := l.pickUp(ctx, ar, rp, items); !cont || err != nil {
		return nil, err
	}
	if rp.started {
		if err := l.queueRest(ctx, ar, legacy, &q); err != nil {
			return nil, err
		}
	}
	if err := l.cfg.Runs.Start(live); err != nil {
		return nil, err
	}
	left := live.Run().ItemCount - rp.ended
	l.log.Info("resuming run", "run", id, "items_left", left, "interrupted", len(rp.open))
	// The feeders skip the items that ended: their results are stored.
	return func() { l.launch(ar, q.sourceIDs()) }, nil
}

// queuedItems is what a batch run's item.queued events say at a restart:
// how many, the last one's key, and the sources they name.
type queuedItems struct {
	n       uint32
	last    string
	sources map[string]bool
}

func (q *queuedItems) add(e *auditd.Event) {
	q.n++
	q.last = strings.Clone(e.ItemKey) // the ledger reuses the event's memory
	if !q.sources[e.SourceID] {
		q.sources[strings.Clone(e.SourceID)] = true
	}
}

// sourceIDs returns the sources the items name, sorted.
func (q *queuedItems) sourceIDs() []string {
	return slices.Sorted(maps.Keys(q.sources))
}

// queueRest records item.queued for the items of started run ar that a
// crash left unqueued: the store's from index q.n on, a chunk at a time.
// It first checks that the ledger's items are the store's first q.n (the
// last of them has the same key), and says so when they are not rather
// than guess which are missing.
func (l *Loop) queueRest(ctx context.Context, ar *activeRun, legacy []auditd.Item, q *queuedItems) error {
	if q.n > 0 {
		at, err := l.itemsFrom(ar.id, legacy, q.n-1, func([]auditd.Item) error { return errStopItems })
		if err != nil {
			return err
		}
		if len(at) == 0 || at[0].Key != q.last {
			got := "none"
			if len(at) > 0 {
				got = strconv.Quote(at[0].Key)
			}
			return fmt.Errorf("resume run %s: the ledger's item.queued %d names %q, the store's item %d is %s", ar.id, q.n, q.last, q.n, got)
		}
	}
	_, err := l.itemsFrom(ar.id, legacy, q.n, func(chunk []auditd.Item) error {
		for _, it := range chunk {
			q.sources[it.SourceID] = true
		}
		return l.queueItems(ctx, ar, chunk)
	})
	return err
}

// errStopItems ends itemsFrom after its first chunk.
var errStopItems = errors.New("stop")

// itemsFrom reads run id's items from index from on, in submission order,
// from legacy (the items of a run an earlier build stored, Runs.Resume's)
// or else the store, resumeChunk at a time. With each it hands each chunk
// on and keeps none (errStopItems from it stops the read, and itemsFrom
// returns that chunk); without it returns them all.
func (l *Loop) itemsFrom(id string, legacy []auditd.Item, from uint32, each func([]auditd.Item) error) ([]auditd.Item, error) {
	var all []auditd.Item
	for {
		var chunk []auditd.Item
		if legacy != nil {
			chunk = legacy[min(int(from), len(legacy)):]
		} else {
			var err error
			if chunk, err = l.cfg.Runs.ItemsAt(id, from, resumeChunk); err != nil {
				return nil, fmt.Errorf("items of run %s: %w", id, err)
			}
		}
		if len(chunk) == 0 {
			return all, nil
		}
		if each == nil {
			all = append(all, chunk...)
		} else if err := each(chunk); errors.Is(err, errStopItems) {
			return chunk, nil
		} else if err != nil {
			return nil, err
		}
		if legacy != nil {
			return all, nil
		}
		from += uint32(len(chunk))
	}
}

// resumeChunk is how many of a run's items a resume reads at a time (a
// variable for tests).
var resumeChunk = 1000

// pickUp does what resuming a run of either mode starts with, once its
// events are replayed (rp): a run the ledger shows finished has its end
// stored and no more (cont is false); a run whose start was never recorded
// starts now, with items; a started one records its restart. The caller
// then does what its mode does for a started run.
func (l *Loop) pickUp(ctx context.Context, ar *activeRun, rp *replayed, items []auditd.Item) (cont bool, err error) {
	switch {
	case rp.fin != nil:
		// The crash came after run.finished, before the store had the
		// run's end: store it, and record nothing new.
		l.log.Info("storing the end of a finished run", "run", ar.id)
		return false, l.storeEnd(ar, rp.fin)
	case !rp.started:
		// The crash came between storing the run and recording its start.
		return true, l.begin(ctx, ar, items)
	}
	return true, l.recordRestart(ctx, ar, rp.open)
}

// replayed is what a run's events say of it at a restart.
type replayed struct {
	started bool
	fin     *auditd.Event            // run.finished, when the crash came after it
	ended   int                      // item.finished events
	open    map[request]auditd.Event // dispatches still waiting for an outcome
}

// replay reads run live's events back from the ledger, counting them into
// live. For a run whose results are rebuilt from the ledger
// (Live.Rebuilds), it rebuilds the result of every item they show
// finished, the item found in items (a copy it was served from comes from
// its cache.served); any other run has them stored, and items is nil. Each
// event goes to each first, for what the run's mode keeps of it.
func replay(ledger Ledger, live *runs.Live, items map[string]*auditd.Item, each func(e *auditd.Event) error) (*replayed, error) {
	rp := &replayed{open: map[request]auditd.Event{}}
	rebuild := live.Rebuilds()
	cached := map[string]*auditd.CachedCopy{}
	err := ledger.ScanRun(live.ID(), 0, func(e *auditd.Event) error {
		live.Count(*e)
		if err := each(e); err != nil {
			return err
		}
		r := request{key: e.ItemKey, page: int(e.Page)}
		switch e.Type {
		case auditd.EventRunStarted:
			rp.started = true
		case auditd.EventRunFinished:
			f := *e
			rp.fin = &f
		case auditd.EventCacheServed:
			if !rebuild {
				break
			}
			c, err := auditd.ParseCacheDetail(e.Detail)
			if err != nil {
				return fmt.Errorf("cache.served %d of %s: %w", e.Seq, e.ItemKey, err)
			}
			cached[e.ItemKey] = c
		case auditd.EventItemFinished:
			rp.ended++
			if !rebuild {
				break
			}
			it := items[e.ItemKey]
			if it == nil {
				return fmt.Errorf("item.finished %d names %q, no item of the run", e.Seq, e.ItemKey)
			}
			res, err := resultOf(it, e)
			if err != nil {
				return err
			}
			if res.Outcome == auditd.ItemCached {
				res.Cached = cached[e.ItemKey]
			}
			delete(cached, e.ItemKey)
			live.Rebuilt(e.ItemKey, res)
		case auditd.EventDispatch:
			rp.open[r] = *e
		case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
			if d, ok := rp.open[r]; ok && d.Attempt == e.Attempt {
				delete(rp.open, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("recount run from the ledger: %w", err)
	}
	return rp, nil
}

// seedGates gives the gates what was sent before this start, oldest first,
// before any worker starts: every dispatch still inside its source's window
// counts against it, so that a restart does not send a window's quota a
// second time, and a throttle's pause still in force holds again. That
// covers every run, not only those resumed: a run that finished just
// before a restart used the same windows as one submitted just after it.
// The ledger is read back as far as the longest window, Retry-After cap or
// backoff of any source (seedHorizon).
func (g *gates) seedGates() error {
	now := g.clock.Now()
	from, err := g.ledger.SeqAt(now.Add(-g.seedHorizon()))
	if err != nil {
		return fmt.Errorf("find the events to seed the gates from: %w", err)
	}
	return g.ledger.Scan(from, 0, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventDispatch:
			if b, err := g.limiter.Budget(e.SourceID); err == nil {
				b.Record(e.Time, auditd.DispatchCost(e))
			}
		case auditd.EventThrottle:
			if until := e.Time.Add(e.Wait); until.After(now) {
				g.limiter.Pause(e.SourceID, until)
			}
		}
		return nil
	})
}

// seedHorizon is how far back a dispatch or a throttle can still hold a
// gate: the longest window (configured or learned) and Retry-After cap of
// the registered sources, and the own backoff's longest wait.
func (g *gates) seedHorizon() time.Duration {
	horizon := limiter.DefaultBackoffMax
	for _, src := range g.registry.ListSources() {
		retryCap := src.RetryCap.D()
		if retryCap == 0 {
			retryCap = limiter.DefaultRetryCap
		}
		horizon = max(horizon, retryCap)
		if b, err := g.limiter.Budget(src.ID); err == nil {
			_, window, _, ceilingWindow := b.Limits()
			horizon = max(horizon, window, ceilingWindow)
		}
	}
	return horizon
}

func sortedDispatches(m map[request]auditd.Event) []auditd.Event {
	out := make([]auditd.Event, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b auditd.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
