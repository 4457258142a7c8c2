package fetch

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/auditd/auditd"
)

// AddItemsStream adds to open batch run id a page too large to hold in
// memory (an NDJSON body streamed in): next yields its items a chunk at a
// time, and io.EOF after the last. Each chunk is validated as AddItems
// validates a page (its index i naming an item as "items[i]", within the
// chunk) and stored pending (runs.PendingPage); at the end the page is
// committed, whole, and its items' item.queued recorded and fed to the
// workers a chunk at a time. If a chunk is refused, or next fails,
// nothing of the page is kept or recorded. The run takes no other page
// meanwhile.
func (l *Loop) AddItemsStream(ctx context.Context, id string, next func() ([]auditd.Item, error)) (auditd.RunView, error) {
	ar, feed, err := l.addingTo(ctx, id)
	if err != nil {
		return auditd.RunView{}, err
	}
	defer ar.adding.Unlock()
	page, err := l.cfg.Runs.BeginItems(ar.live)
	if err != nil {
		return auditd.RunView{}, err
	}
	sources := map[string]bool{}
	for {
		items, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err == nil {
			err = l.checkItems(items)
		}
		if err == nil {
			err = page.Add(items)
		}
		if err != nil {
			if aerr := page.Abort(); aerr != nil {
				l.log.Error("abort a streamed page", "run", id, "err", aerr)
			}
			return auditd.RunView{}, err
		}
		for i := range items {
			sources[items[i].SourceID] = true
		}
		// A page coming in is not idle (holdOpen).
		feed.mu.Lock()
		feed.lastPage = l.cfg.Clock.Now()
		feed.mu.Unlock()
	}
	if page.Len() == 0 {
		page.Abort()
		return auditd.RunView{}, &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: "the page holds no items"}
	}
	from, n := page.From(), page.Len()
	if err := page.Commit(); err != nil {
		return auditd.RunView{}, err
	}
	list := make([]string, 0, len(sources))
	for src := range sources {
		list = append(list, src)
	}
	fresh, err := l.startSources(ctx, ar, feed, list)
	if err != nil {
		return auditd.RunView{}, err
	}
	// Queued a commit group at a time, read back from the store: the
	// page is the run's now, and a restart queues what is left (resume).
	end := from + uint32(n)
	for at := from; at < end; {
		items, err := l.cfg.Runs.ItemsAt(id, at, min(queueBatch, int(end-at)))
		if err != nil {
			return auditd.RunView{}, err
		}
		if len(items) == 0 {
			return auditd.RunView{}, fmt.Errorf("run %s: no item %d in a committed page", id, at)
		}
		if err := l.queueItems(ar.recordCtx, ar, items); err != nil {
			return auditd.RunView{}, err
		}
		at += uint32(len(items))
		l.feedQueued(ar, feed, at, fresh)
		fresh = nil
	}
	return l.cfg.Runs.Run(ctx, id)
}
