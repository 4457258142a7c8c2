package fetch

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// resume picks up a run that a crash or restart left unfinished. The ledger
// is the truth: counters are recounted from it, items it shows finished are
// skipped, attempts continue their numbering, and every dispatch it shows
// without an outcome is recorded as interrupted.
func (l *Loop) resume(ctx context.Context, id string) error {
	var rec *runRecord
	var items []auditd.Item
	err := l.cfg.DB.View(func(tx *bolt.Tx) (err error) {
		if rec, err = loadRun(tx, id); err != nil {
			return err
		}
		return forEachItem(tx, id, func(_ uint32, it *auditd.Item) error {
			items = append(items, *it)
			return nil
		})
	})
	if err != nil {
		return err
	}

	ar := newActiveRun(rec)
	ar.rec.Counts = Counts{}
	started := false
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
		case auditd.EventItemQueued:
			queued[e.ItemKey] = true
		case auditd.EventItemFinished:
			finished[e.ItemKey] = true
			ar.forgetLocked(e.ItemKey)
		case auditd.EventDispatch:
			ar.attempts[r] = max(ar.attempts[r], e.Attempt)
			ar.noteLocked(r, 1)
			open[r] = *e
		case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
			if d, ok := open[r]; ok && d.Attempt == e.Attempt {
				delete(open, r)
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("recount run from the ledger: %w", err)
	}

	if !started {
		// The crash came between storing the run and recording its start.
		if err := l.begin(ctx, ar, items); err != nil {
			return err
		}
	} else {
		if _, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunResumed, Cause: "restart"}); err != nil {
			return err
		}
		for _, d := range sortedDispatches(open) {
			if _, err := l.record(ctx, ar, auditd.Event{
				Type: auditd.EventInterrupted, SourceID: d.SourceID, ItemKey: d.ItemKey, Page: d.Page,
				Attempt: d.Attempt, Method: d.Method, Path: d.Path, Cause: "no outcome recorded before the restart",
			}); err != nil {
				return err
			}
		}
		var unqueued []auditd.Item
		for _, it := range items {
			if !queued[it.Key] {
				unqueued = append(unqueued, it)
			}
		}
		if err := l.queueItems(ctx, ar, unqueued); err != nil {
			return err
		}
	}
	var todo []auditd.Item
	for _, it := range items {
		if !finished[it.Key] {
			todo = append(todo, it)
		}
	}
	if err := l.saveRun(ar); err != nil {
		return err
	}
	l.log.Info("resuming run", "run", id, "items_left", len(todo), "interrupted", len(open))
	l.launch(ar, todo)
	return nil
}

func sortedDispatches(m map[request]auditd.Event) []auditd.Event {
	out := make([]auditd.Event, 0, len(m))
	for _, e := range m {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b auditd.Event) int { return cmp.Compare(a.Seq, b.Seq) })
	return out
}
