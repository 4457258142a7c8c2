package fetch

import (
	"context"
	"encoding/hex"
	"sync"

	"github.com/auditd/auditd"
)

// activeRun is a run the loop is working on.
type activeRun struct {
	mu        sync.Mutex
	rec       runRecord
	attempts  map[request]uint32       // last attempt number of each request
	items     map[string]*itemAttempts // per unfinished item, for its result
	cancel    context.CancelFunc
	cancelled bool
}

// itemAttempts counts an unfinished item's dispatches over all its pages.
type itemAttempts struct {
	total int
	pages int // pages tried: requests {key, 0..pages-1} may be in attempts
}

// request identifies one request of a run: an item's page.
type request struct {
	key  string
	page int
}

func newActiveRun(rec *runRecord) *activeRun {
	return &activeRun{rec: *rec, attempts: map[request]uint32{}, items: map[string]*itemAttempts{}}
}

// nextAttempt numbers the next dispatch of a request, without gaps.
func (ar *activeRun) nextAttempt(r request) uint32 {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ar.attempts[r]++
	ar.noteLocked(r, 1)
	return ar.attempts[r]
}

// unspend takes back an attempt number that was never sent.
func (ar *activeRun) unspend(r request) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ar.attempts[r]--
	ar.noteLocked(r, -1)
}

// noteLocked counts n more dispatches of r towards its item; ar.mu is held.
func (ar *activeRun) noteLocked(r request, n int) {
	ia := ar.items[r.key]
	if ia == nil {
		ia = &itemAttempts{}
		ar.items[r.key] = ia
	}
	ia.total += n
	ia.pages = max(ia.pages, r.page+1)
}

// forget drops what is kept of a finished item and returns its dispatches.
func (ar *activeRun) forget(key string) int {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.forgetLocked(key)
}

func (ar *activeRun) forgetLocked(key string) int {
	ia := ar.items[key]
	if ia == nil {
		return 0
	}
	for p := range ia.pages {
		delete(ar.attempts, request{key: key, page: p})
	}
	delete(ar.items, key)
	return ia.total
}

// launch starts the run's workers: per source, as many as its concurrency
// allows, each taking the source's items in submission order. Sources do not
// wait for each other.
func (l *Loop) launch(ar *activeRun, items []auditd.Item) {
	ctx, cancel := context.WithCancel(l.ctx)
	ar.mu.Lock()
	ar.cancel = cancel
	ar.mu.Unlock()
	l.mu.Lock()
	l.active[ar.rec.ID] = ar
	l.mu.Unlock()

	perSource := map[string]int{}
	var order []string
	for _, it := range items {
		if perSource[it.SourceID] == 0 {
			order = append(order, it.SourceID)
		}
		perSource[it.SourceID]++
	}
	queues := make(map[string]chan auditd.Item, len(order))
	for _, id := range order {
		queues[id] = make(chan auditd.Item, perSource[id])
	}
	for _, it := range items {
		queues[it.SourceID] <- it
	}
	var workers sync.WaitGroup
	for _, id := range order {
		close(queues[id])
		n := l.cfg.Concurrency
		if src, err := l.cfg.Registry.GetSource(id); err == nil && src.Concurrency > 0 {
			n = src.Concurrency
		}
		n = min(n, len(queues[id]))
		for range n {
			workers.Add(1)
			l.wg.Add(1)
			go func(q <-chan auditd.Item) {
				defer l.wg.Done()
				defer workers.Done()
				for it := range q {
					if ctx.Err() != nil && !ar.isCancelled() {
						return // shutting down: the item resumes at the next start
					}
					l.doItem(ctx, ar, &it)
				}
			}(queues[id])
		}
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer cancel()
		workers.Wait()
		if l.ctx.Err() != nil && !ar.isCancelled() {
			return // shutdown, not the end of the run
		}
		if err := l.finish(context.WithoutCancel(ctx), ar); err != nil {
			l.log.Error("finish run", "run", ar.rec.ID, "err", err)
		}
	}()
}

func (ar *activeRun) isCancelled() bool {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.cancelled
}

// finish records the end of a run: a registry snapshot and run.finished with
// the terminal status.
func (l *Loop) finish(ctx context.Context, ar *activeRun) error {
	var sources []string
	ar.mu.Lock()
	for id := range ar.rec.Counts.BySource {
		sources = append(sources, id)
	}
	c := ar.rec.Counts
	status := auditd.RunSucceeded
	switch {
	case ar.cancelled:
		status = auditd.RunCancelled
	case c.Failed+c.Shed > 0:
		status = auditd.RunPartial
	}
	ar.mu.Unlock()
	if err := l.cfg.Registry.EndRun(ctx, ar.rec.ID, sortedStrings(sources)); err != nil {
		return err
	}
	ev, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(status)})
	if err != nil {
		return err
	}
	ar.mu.Lock()
	ar.rec.Status = status
	ar.rec.FinishedAt = ev.Time
	ar.rec.HeadAtEnd = hex.EncodeToString(ev.Hash[:])
	ar.mu.Unlock()
	if err := l.saveRun(ar); err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.active, ar.rec.ID)
	l.mu.Unlock()
	return nil
}

// Cancel stops a run: items not yet finished end as failed ("cancelled") and
// the run ends cancelled. Cancelling a finished run is a conflict.
func (l *Loop) Cancel(ctx context.Context, id string) (RunView, error) {
	l.mu.Lock()
	ar := l.active[id]
	l.mu.Unlock()
	if ar == nil {
		v, err := l.Run(id)
		if err != nil {
			return v, err
		}
		return v, auditd.Errorf(auditd.ECONFLICT, "run %s is %s", id, v.Status)
	}
	ar.mu.Lock()
	ar.cancelled = true
	cancel := ar.cancel
	ar.mu.Unlock()
	cancel()
	return l.view(ar), nil
}
