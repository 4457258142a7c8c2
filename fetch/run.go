package fetch

import (
	"context"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// activeRun is a run the loop is working on.
type activeRun struct {
	mu  sync.Mutex
	rec runRecord
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
	posts     sync.WaitGroup // records posted and not yet durable (Loop.post)
	ended     chan struct{}  // closed once the run's end is stored (storeEnd)

	// What finished items leave, kept here until the run ends and stores
	// them all in one transaction with its final record (storeEnd). The
	// ledger holds the same facts as they happen, so a restart rebuilds
	// both from it (resume).
	results  map[string]*ItemResult // item key -> how it ended
	lastGood map[string]goodCopy    // request key -> its newest good payload in this run
}

// goodCopy is a payload fetched by a run: what the last-good index learns
// when the run ends.
type goodCopy struct {
	sum string
	at  time.Time // when its item finished
}

// job is an item being done, with what its worker alone keeps of it.
type job struct {
	*auditd.Item
	attempts *itemAttempts
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

func newActiveRun(rec *runRecord) *activeRun {
	return &activeRun{rec: *rec, ended: make(chan struct{}), resumed: map[string]*itemAttempts{},
		results: make(map[string]*ItemResult, rec.ItemCount), lastGood: make(map[string]goodCopy, rec.ItemCount)}
}

// count counts events the run recorded, once they are durable. Records
// posted by different workers become durable in an order of their own, so
// LastSeq is the largest seen.
func (ar *activeRun) count(events []auditd.Event) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	for i := range events {
		ar.countLocked(&events[i])
	}
}

func (ar *activeRun) countOne(e *auditd.Event) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ar.countLocked(e)
}

func (ar *activeRun) countLocked(e *auditd.Event) {
	ar.rec.Counts.count(e)
	ar.rec.LastSeq = max(ar.rec.LastSeq, e.Seq)
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

// seenLocked counts a dispatch of request r recorded by an earlier life of
// the run; ar.mu is held.
func (ar *activeRun) seenLocked(r request, attempt uint32) {
	ia := ar.resumed[r.key]
	if ia == nil {
		ia = &itemAttempts{}
		ar.resumed[r.key] = ia
	}
	ia.seen(r.page, attempt)
}

// finished keeps how an item ended, and its payload as its request's newest
// good copy when lastGood is set.
func (ar *activeRun) finished(res *ItemResult, lastGood string, at time.Time) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	ar.finishedLocked(res, lastGood, at)
}

func (ar *activeRun) finishedLocked(res *ItemResult, lastGood string, at time.Time) {
	ar.results[res.Key] = res
	if lastGood != "" && res.PayloadHash != "" {
		ar.lastGood[lastGood] = goodCopy{sum: res.PayloadHash, at: at}
	}
}

// result returns how an item of the run ended, if it has.
func (ar *activeRun) result(key string) (*ItemResult, bool) {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	res, ok := ar.results[key]
	return res, ok
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
		if err := l.finish(ar.recordCtx, ar); err != nil {
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
// the terminal status; then it stores the run's end (storeEnd).
func (l *Loop) finish(ctx context.Context, ar *activeRun) error {
	// The items' ends are counted, and their results kept, once durable.
	ar.posts.Wait()
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
	return l.storeEnd(ar, &ev)
}

// storeEnd stores what a run leaves, in one transaction: every item's
// result, in key order (a run's keys are new, so this appends), the newest
// good copy of each request it fetched into the last-good index, and its
// terminal record, which run.finished (fin) completes. Then the run leaves
// the active set. A crash before this commits leaves the run unfinished in
// the store; resume sees run.finished in the ledger and stores its end.
func (l *Loop) storeEnd(ar *activeRun, fin *auditd.Event) error {
	// The run's payloads move from the spool to the payload bucket, many
	// to a commit (see staging.Store). Payloads are found either way, so a
	// failure here costs nothing but the spool's size.
	if _, err := l.cfg.Staging.Compact(); err != nil {
		l.log.Error("compact staged payloads", "run", ar.rec.ID, "err", err)
	}
	ar.mu.Lock()
	rec := ar.rec
	rec.Counts = ar.rec.Counts.clone()
	rec.Status = auditd.RunStatus(fin.Outcome)
	rec.FinishedAt = fin.Time
	rec.HeadAtEnd = hex.EncodeToString(fin.Hash[:])
	results := make([]*ItemResult, 0, len(ar.results)) // stored once, never changed
	for _, res := range ar.results {
		results = append(results, res)
	}
	type keyedCopy struct {
		key string
		goodCopy
	}
	copies := make([]keyedCopy, 0, len(ar.lastGood))
	for k, c := range ar.lastGood {
		copies = append(copies, keyedCopy{k, c})
	}
	ar.mu.Unlock()
	slices.SortFunc(results, func(a, b *ItemResult) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(copies, func(a, b keyedCopy) int { return strings.Compare(a.key, b.key) })

	err := l.cfg.DB.Update(func(tx *bolt.Tx) error {
		if err := putResults(tx, rec.ID, results); err != nil {
			return err
		}
		for _, c := range copies {
			if err := l.cfg.Staging.PutLastGood(tx, c.key, c.sum, c.at); err != nil {
				return err
			}
		}
		return saveRun(tx, &rec)
	})
	if err != nil {
		return fmt.Errorf("store the end of run %s: %w", rec.ID, err)
	}
	// Views show the run ended only now that the store has all of its end.
	ar.mu.Lock()
	ar.rec.Status, ar.rec.FinishedAt, ar.rec.HeadAtEnd = rec.Status, rec.FinishedAt, rec.HeadAtEnd
	ar.mu.Unlock()
	close(ar.ended)
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
