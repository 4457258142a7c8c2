package fetch

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// resume picks up a run that a crash or restart left unfinished. The ledger
// is the truth: counters are recounted from it, results of the items it
// shows finished are rebuilt from their item.finished and those items
// skipped, attempts continue their numbering, and every dispatch it shows
// without an outcome is recorded as interrupted. A run the ledger shows
// finished only has its end stored.
//
// resume returns what starts the run's workers (nil when there is nothing
// left to do) and the run's dispatches and throttles, which the caller
// gives the gates before any worker starts (seedGates).
func (l *Loop) resume(ctx context.Context, id string) (launch func(), dispatched []auditd.Event, err error) {
	var rec *runRecord
	var items []auditd.Item
	err = l.cfg.DB.View(func(tx *bolt.Tx) (err error) {
		if rec, err = loadRun(tx, id); err != nil {
			return err
		}
		return forEachItem(tx, id, func(it *auditd.Item) error {
			items = append(items, *it)
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}

	ar := newActiveRun(rec)
	ar.rec.Counts = Counts{}
	byKey := make(map[string]*auditd.Item, len(items))
	for i := range items {
		byKey[items[i].Key] = &items[i]
	}
	started := false
	var fin *auditd.Event // run.finished, when the crash came after it
	queued := map[string]bool{}
	finished := map[string]bool{}
	open := map[request]auditd.Event{} // dispatches still waiting for an outcome
	err = l.cfg.Ledger.ScanRun(id, 0, func(e *auditd.Event) error {
		ar.rec.Counts.count(e)
		ar.rec.LastSeq = e.Seq
		r := request{key: e.ItemKey, page: int(e.Page)}
		switch e.Type {
		case auditd.EventRunStarted:
			started = true
		case auditd.EventRunFinished:
			f := *e
			fin = &f
		case auditd.EventItemQueued:
			queued[e.ItemKey] = true
		case auditd.EventItemFinished:
			finished[e.ItemKey] = true
			delete(ar.resumed, e.ItemKey)
			it := byKey[e.ItemKey]
			if it == nil {
				return fmt.Errorf("item.finished %d names %q, no item of the run", e.Seq, e.ItemKey)
			}
			res, err := resultOf(it, e)
			if err != nil {
				return err
			}
			lastGood := ""
			if res.Outcome == auditd.ItemSucceeded {
				lastGood = staging.RequestKey(it.SourceID, it.Method, it.Path, it.Body)
			}
			ar.finishedLocked(res, lastGood, e.Time)
		case auditd.EventDispatch:
			dispatched = append(dispatched, auditd.Event{Type: e.Type, SourceID: e.SourceID, Time: e.Time})
			ar.seenLocked(r, e.Attempt)
			open[r] = *e
		case auditd.EventThrottle:
			dispatched = append(dispatched, auditd.Event{Type: e.Type, SourceID: e.SourceID, Time: e.Time, Wait: e.Wait})
			if d, ok := open[r]; ok && d.Attempt == e.Attempt {
				delete(open, r)
			}
		case auditd.EventResponse, auditd.EventTransportError, auditd.EventInterrupted:
			if d, ok := open[r]; ok && d.Attempt == e.Attempt {
				delete(open, r)
			}
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("recount run from the ledger: %w", err)
	}
	if fin != nil {
		// The crash came after run.finished, before the store had the
		// run's end: store it, and record nothing new.
		l.log.Info("storing the end of a finished run", "run", id)
		return nil, dispatched, l.storeEnd(ar, fin)
	}

	if !started {
		// The crash came between storing the run and recording its start.
		if err := l.begin(ctx, ar, items); err != nil {
			return nil, nil, err
		}
	} else {
		if _, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunResumed, Cause: "restart"}); err != nil {
			return nil, nil, err
		}
		for _, d := range sortedDispatches(open) {
			if _, err := l.record(ctx, ar, auditd.Event{
				Type: auditd.EventInterrupted, SourceID: d.SourceID, ItemKey: d.ItemKey, Page: d.Page,
				Attempt: d.Attempt, Method: d.Method, Path: d.Path, Cause: "no outcome recorded before the restart",
			}); err != nil {
				return nil, nil, err
			}
		}
		var unqueued []auditd.Item
		for _, it := range items {
			if !queued[it.Key] {
				unqueued = append(unqueued, it)
			}
		}
		if err := l.queueItems(ctx, ar, unqueued); err != nil {
			return nil, nil, err
		}
	}
	var todo []auditd.Item
	for _, it := range items {
		if !finished[it.Key] {
			todo = append(todo, it)
		}
	}
	if err := l.saveRun(ar); err != nil {
		return nil, nil, err
	}
	l.log.Info("resuming run", "run", id, "items_left", len(todo), "interrupted", len(open))
	return func() { l.launch(ar, todo) }, dispatched, nil
}

// seedGates gives the gates what resumed runs did before the restart,
// oldest first, before any worker starts: dispatches count against their
// sources' windows (a restart within a window must not send its quota a
// second time), and a throttle's pause still in force holds again.
func (l *Loop) seedGates(events []auditd.Event) {
	slices.SortStableFunc(events, func(a, b auditd.Event) int { return a.Time.Compare(b.Time) })
	for _, e := range events {
		switch e.Type {
		case auditd.EventDispatch:
			if b, err := l.cfg.Limiter.Budget(e.SourceID); err == nil {
				b.Record(e.Time, 1)
			}
		case auditd.EventThrottle:
			if until := e.Time.Add(e.Wait); until.After(l.cfg.Clock.Now()) {
				l.cfg.Limiter.Pause(e.SourceID, until)
			}
		}
	}
}

func sortedDispatches(m map[request]auditd.Event) []auditd.Event {
	out := make([]auditd.Event, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b auditd.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
