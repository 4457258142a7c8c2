package fetch

import (
	"cmp"
	"context"
	"fmt"
	"slices"
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
	live, items, err := l.cfg.Runs.Resume(id)
	if err != nil {
		return nil, err
	}
	if live.Run().Mode == auditd.RunProxy {
		return l.resumeProxy(ctx, live)
	}
	ar := newActiveRun(live)
	byKey := make(map[string]*auditd.Item, len(items))
	for i := range items {
		byKey[items[i].Key] = &items[i]
	}
	queued := map[string]bool{}
	rp, err := replay(l.cfg.Ledger, live, func(key string) *auditd.Item { return byKey[key] }, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventItemQueued:
			queued[e.ItemKey] = true
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
	if cont, err := l.pickUp(ctx, ar, rp, items); !cont || err != nil {
		return nil, err
	}
	if rp.started {
		var unqueued []auditd.Item
		for _, it := range items {
			if !queued[it.Key] {
				unqueued = append(unqueued, it)
			}
		}
		if err := l.queueItems(ctx, ar, unqueued); err != nil {
			return nil, err
		}
	}
	left := 0
	for _, it := range items {
		if !rp.finished[it.Key] {
			left++
		}
	}
	if err := l.cfg.Runs.Start(live); err != nil {
		return nil, err
	}
	l.log.Info("resuming run", "run", id, "items_left", left, "interrupted", len(rp.open))
	// The feeders skip the items that ended: their results are stored.
	return func() { l.launch(ar, sourcesOf(items)) }, nil
}

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
	started  bool
	fin      *auditd.Event            // run.finished, when the crash came after it
	finished map[string]bool          // the items with an item.finished
	open     map[request]auditd.Event // dispatches still waiting for an outcome
}

// replay reads run live's events back from the ledger, counting them into
// live and rebuilding the result of every item they show finished (item
// resolves its key; a copy it was served from comes from its
// cache.served). Each event goes to each first, for what the run's mode
// keeps of it.
func replay(ledger Ledger, live *runs.Live, item func(key string) *auditd.Item, each func(e *auditd.Event) error) (*replayed, error) {
	rp := &replayed{finished: map[string]bool{}, open: map[request]auditd.Event{}}
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
			c, err := auditd.ParseCacheDetail(e.Detail)
			if err != nil {
				return fmt.Errorf("cache.served %d of %s: %w", e.Seq, e.ItemKey, err)
			}
			cached[e.ItemKey] = c
		case auditd.EventItemFinished:
			it := item(e.ItemKey)
			if it == nil {
				return fmt.Errorf("item.finished %d names %q, no item of the run", e.Seq, e.ItemKey)
			}
			rp.finished[e.ItemKey] = true
			res, err := resultOf(it, e)
			if err != nil {
				return err
			}
			if res.Outcome == auditd.ItemCached {
				res.Cached = cached[e.ItemKey]
			}
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
