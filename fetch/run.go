package fetch

import (
	"context"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/runs"
)

// activeRun is a run the loop is working on: the run as the store keeps it
// live, and what the loop keeps of it besides.
type activeRun struct {
	live *runs.Live
	// id, replay and deadline never change: read without the live run's lock.
	id       string
	replay   bool
	deadline time.Time

	mu sync.Mutex
	// resumed holds, per unfinished item, the dispatches earlier lives of
	// the run recorded (resume); the worker that takes the item up takes
	// them over (takeAttempts).
	resumed   map[string]*itemAttempts
	cancel    context.CancelFunc
	cancelled bool
	// recordCtx is the context of the run's records: the run's own without
	// its cancellation, since records must land even while the run is
	// being cancelled or the loop drains (the events describe what already
	// happened). launch sets it before any worker starts.
	recordCtx context.Context
	posts     sync.WaitGroup // records posted and not yet durable (recorder.post)
	// proxy is a proxy-mode run's own state (proxy.go); nil for a batch run.
	proxy *proxyRun
}

// job is an item being done, with what its worker alone keeps of it.
type job struct {
	*auditd.Item
	attempts *itemAttempts
	// contentType and contentEncoding are the headers its payload goes
	// with: kept with its last good copy, which is served with them
	// (a proxied request's; empty for a batch item, whose copy is sniffed).
	contentType, contentEncoding string
}

// itemAttempts counts an item's dispatches: the last attempt number of each
// page, and all of them together.
type itemAttempts struct {
	total int
	pages []uint32
}

// spent is how many attempts a page has had.
func (ia *itemAttempts) spent(page int) int {
	if page < len(ia.pages) {
		return int(ia.pages[page])
	}
	return 0
}

// next numbers the next dispatch of a page, without gaps.
func (ia *itemAttempts) next(page int) uint32 {
	n := ia.at(page)
	*n++
	ia.total++
	return *n
}

// unspend takes back an attempt number that was never sent.
func (ia *itemAttempts) unspend(page int) {
	ia.pages[page]--
	ia.total--
}

// seen counts a dispatch recorded by an earlier life of the run.
func (ia *itemAttempts) seen(page int, attempt uint32) {
	n := ia.at(page)
	*n = max(*n, attempt)
	ia.total++
}

// at is a page's last attempt number, the pages before it counted too.
func (ia *itemAttempts) at(page int) *uint32 {
	for len(ia.pages) <= page {
		ia.pages = append(ia.pages, 0)
	}
	return &ia.pages[page]
}

// request identifies one request of a run: an item's page.
type request struct {
	key  string
	page int
}

func newActiveRun(live *runs.Live) *activeRun {
	run := live.Run()
	return &activeRun{live: live, id: run.ID, replay: run.Replay, deadline: run.Deadline, resumed: map[string]*itemAttempts{}}
}

// takeAttempts hands the worker taking item key up what earlier lives of
// the run dispatched for it. The worker's copy is its own: the run keeps
// none.
func (ar *activeRun) takeAttempts(key string) itemAttempts {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ia := ar.resumed[key]
	if ia == nil {
		return itemAttempts{}
	}
	delete(ar.resumed, key)
	return *ia
}

// seen counts a dispatch of request r recorded by an earlier life of the
// run, before any worker starts.
func (ar *activeRun) seen(r request, attempt uint32) {
	ia := ar.resumed[r.key]
	if ia == nil {
		ia = &itemAttempts{}
		ar.resumed[r.key] = ia
	}
	ia.seen(r.page, attempt)
}

// launch starts the run's workers: per source, as many as its concurrency
// allows, each taking the source's items in submission order. Sources do not
// wait for each other.
func (l *Loop) launch(ar *activeRun, items []auditd.Item) {
	ctx, cancel := context.WithCancel(l.ctx)
	ar.recordCtx = context.WithoutCancel(ctx)
	ar.mu.Lock()
	ar.cancel = cancel
	ar.mu.Unlock()
	l.mu.Lock()
	l.active[ar.id] = ar
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
		if err := l.finish(ar.recordCtx, ar); err != nil {
			l.log.Error("finish run", "run", ar.id, "err", err)
		}
	}()
}

// Backoff between tries of a record or a store the disk refused.
const (
	minRecordBackoff = 50 * time.Millisecond
	maxRecordBackoff = 5 * time.Second
)

// pauseAfter is what a worker does when a record or store it needs has
// failed: it logs it and waits, longer with each failure in a row
// (*failures counts them), before the caller tries again. It returns false
// at once, without waiting, when ctx has ended (the loop is shutting down
// or the run was cancelled). The ledger retries a write the disk refused
// on its own (its appends then wait, and Stalled says so): this is for
// what fails all the same.
func (l *Loop) pauseAfter(ctx context.Context, ar *activeRun, what string, failures *int, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	d := minRecordBackoff << min(*failures, 10)
	d = min(d, maxRecordBackoff)
	*failures++
	l.log.Error(what+" failed: dispatching paused, will try again", "run", ar.id, "after", d, "err", err)
	return clock.Sleep(ctx, l.cfg.Clock, d) == nil
}

// Stalled is told when the ledger's commits start to fail (err) and when
// they succeed again (nil): meanwhile every record waits, so no run
// dispatches. It logs which runs are paused.
func (l *Loop) Stalled(err error) {
	l.mu.Lock()
	ids := slices.Sorted(maps.Keys(l.active))
	l.mu.Unlock()
	if err != nil {
		l.log.Error("ledger writes failing: dispatching paused until they succeed", "runs", ids, "err", err)
		return
	}
	l.log.Info("ledger writes succeed again: dispatching resumed", "runs", ids)
}

func (ar *activeRun) isCancelled() bool {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.cancelled
}

// finish records the end of a run: a registry snapshot and run.finished with
// the terminal status; then it stores the run's end (storeEnd).
func (l *Loop) finish(ctx context.Context, ar *activeRun) error {
	// The items' ends are counted, and their results kept, once durable.
	ar.posts.Wait()
	c := ar.live.Counts()
	sources := slices.Sorted(maps.Keys(c.BySource))
	status := runStatus(&c, ar.isCancelled())
	if c.Pending > 0 {
		// Every item ends with its item.finished before its worker moves
		// on; one that did not is a record the ledger refused for good.
		l.log.Error("run ends with items that have no end on record", "run", ar.id, "pending", c.Pending, "status", status)
	}
	if err := l.cfg.Registry.EndRun(ctx, ar.id, sources); err != nil {
		return err
	}
	ev, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(status), Reason: ar.proxy.endReason()})
	if err != nil {
		return err
	}
	// The run is over on record; the store must learn it too, or the run
	// stays running there (and in Wait) until the next start.
	for failures := 0; ; {
		err := l.storeEnd(ar, &ev)
		if err == nil || !l.pauseAfter(l.ctx, ar, "store the end of the run", &failures, err) {
			return err
		}
	}
}

// runStatus is the terminal status of a run whose items ended as c
// counts: succeeded only when every item succeeded or was served from
// cache. An item with no end (pending) keeps a run from succeeding.
func runStatus(c *auditd.Counts, cancelled bool) auditd.RunStatus {
	switch {
	case cancelled:
		return auditd.RunCancelled
	case c.Failed+c.Shed+c.Pending > 0:
		return auditd.RunPartial
	}
	return auditd.RunSucceeded
}

// storeEnd stores what a run leaves (runs.Store.End), after moving its
// payloads from the spool to the payload bucket, many to a commit (see
// staging.Store): payloads are found either way, so a failure to move
// them costs nothing but the spool's size. Then the run leaves the active
// set.
func (l *Loop) storeEnd(ar *activeRun, fin *auditd.Event) error {
	if _, err := l.cfg.Staging.Compact(); err != nil {
		l.log.Error("compact staged payloads", "run", ar.id, "err", err)
	}
	if err := l.cfg.Runs.End(ar.live, fin); err != nil {
		return err
	}
	l.mu.Lock()
	delete(l.active, ar.id)
	l.mu.Unlock()
	return nil
}

// Cancel stops a run: items not yet finished end as failed ("cancelled") and
// the run ends cancelled. Cancelling a finished run is a conflict.
func (l *Loop) Cancel(ctx context.Context, id string) (auditd.RunView, error) {
	ar := l.activeRun(id)
	if ar == nil {
		v, err := l.cfg.Runs.Run(ctx, id)
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
	return l.cfg.Runs.Run(ctx, id)
}

// Wait returns the view of run id once it has ended (its end is stored),
// or ctx's error when ctx ends first. A run the loop is not working on is
// returned at once: one that ended, and one a shutdown left unfinished.
func (l *Loop) Wait(ctx context.Context, id string) (auditd.RunView, error) {
	if ar := l.activeRun(id); ar != nil {
		select {
		case <-ar.live.Ended():
		case <-ctx.Done():
			return auditd.RunView{}, ctx.Err()
		}
	}
	return l.cfg.Runs.Run(ctx, id)
}

func (l *Loop) activeRun(id string) *activeRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[id]
}
