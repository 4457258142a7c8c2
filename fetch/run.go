package fetch

import (
	"cmp"
	"context"
	"fmt"
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
	// feed feeds a batch run's workers (launch); adding serialises the
	// pages added to an open one (AddItems).
	feed   *batchFeed
	ctx    context.Context // the run's: ends when it is cancelled or the loop shuts down
	adding sync.Mutex
}

// runCtx returns the run's context.
func (ar *activeRun) runCtx() context.Context {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.ctx
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
// page, and all of them together; and of each page, the dispatches a
// refusal answered that spent none of its attempts (forgive).
type itemAttempts struct {
	total int
	pages []uint32
	free  []uint32
}

// charged is how many of a page's attempts count against its MaxAttempts.
func (ia *itemAttempts) charged(page int) int {
	n := ia.spent(page)
	if page < len(ia.free) {
		n -= int(ia.free[page])
	}
	return n
}

// forgive takes a dispatch of a page off what counts against its
// MaxAttempts: a refusal that showed only a window or quota spent.
func (ia *itemAttempts) forgive(page int) {
	for len(ia.free) <= page {
		ia.free = append(ia.free, 0)
	}
	ia.free[page]++
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

// forgiven forgives request r's throttle recorded by an earlier life of
// the run, before any worker starts: whether it only showed a spent window
// is the registry's memory of the episode, which a restart does not keep,
// and the refusal bound (RefusalBound) still ends a page refused for good.
func (ar *activeRun) forgiven(r request) {
	if ia := ar.resumed[r.key]; ia != nil {
		ia.forgive(r.page)
	}
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

// feedChunk is how many of a run's items a feeder reads from the store at
// a time.
const feedChunk = 256

// batchFeed feeds a batch run's workers: per source, a feeder reads the
// run's items from the store a chunk at a time (runs.Store.Todo), so that
// what the loop holds of a run is bounded by the requests in flight, not
// by the run's size. An open run's feeders wait for its next page.
type batchFeed struct {
	workers sync.WaitGroup // every worker of the run, and the open run's hold

	mu      sync.Mutex
	queued  uint32          // items with their item.queued recorded: the feeders read up to here
	open    bool            // more pages may come
	sources map[string]bool // sources with a feeder
	wake    chan struct{}   // closed, and replaced, when items are queued or the run closes
	closed  chan struct{}   // closed when the open run closes
	// lastPage is when the open run was launched or last took a page;
	// reason, why it closed when it did so by itself (run.finished's).
	lastPage time.Time
	reason   string
}

// state returns how far the feeders may read, whether more may come, and
// what tells them when either changes.
func (f *batchFeed) state() (queued uint32, open bool, wake <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.queued, f.open, f.wake
}

// poke wakes the feeders; the caller holds f.mu.
func (f *batchFeed) poke() {
	close(f.wake)
	f.wake = make(chan struct{})
}

// launch starts the run's workers: per source, as many as its concurrency
// allows, each taking the source's items in submission order from the
// source's feeder. Sources do not wait for each other. The run ends once
// every item has, and, when it is open, once it is finished.
func (l *Loop) launch(ar *activeRun, sources []string) {
	ctx, cancel := context.WithCancel(l.ctx)
	ar.recordCtx = context.WithoutCancel(ctx)
	run := ar.live.Run()
	feed := &batchFeed{queued: uint32(run.ItemCount), open: run.Open, sources: map[string]bool{},
		wake: make(chan struct{}), closed: make(chan struct{}), lastPage: l.cfg.Clock.Now()}
	ar.mu.Lock()
	ar.cancel, ar.ctx, ar.feed = cancel, ctx, feed
	ar.mu.Unlock()
	l.mu.Lock()
	l.active[ar.id] = ar
	l.mu.Unlock()

	if feed.open {
		feed.workers.Add(1)
		go func() {
			defer feed.workers.Done()
			l.holdOpen(ctx, ar, feed, cmp.Or(run.IdleTimeout.D(), l.cfg.OpenIdleTimeout))
		}()
	}
	feed.mu.Lock()
	for _, id := range sources {
		l.feedSource(ctx, ar, feed, id)
	}
	feed.mu.Unlock()
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer cancel()
		feed.workers.Wait()
		if l.ctx.Err() != nil && !ar.isCancelled() {
			return // shutdown, not the end of the run
		}
		if err := l.finish(ar.recordCtx, ar); err != nil {
			l.log.Error("finish run", "run", ar.id, "err", err)
		}
	}()
}

// holdOpen keeps open batch run ar from ending until it is closed, or
// cancelled, or the loop stops; it closes the run itself once no page has
// come for idle, and says so in the run's end (endReason).
func (l *Loop) holdOpen(ctx context.Context, ar *activeRun, feed *batchFeed, idle time.Duration) {
	for {
		feed.mu.Lock()
		idleFor := l.cfg.Clock.Now().Sub(feed.lastPage)
		feed.mu.Unlock()
		if idleFor >= idle {
			if _, err := l.closeBatch(ctx, ar); err == nil {
				feed.mu.Lock()
				feed.reason = fmt.Sprintf("idle for %v: no page within the run's idle timeout", idle)
				feed.mu.Unlock()
				return
			} else if auditd.ErrorCode(err) != auditd.ECONFLICT {
				// The store refused the close: try again after a while.
				l.log.Error("close idle open run", "run", ar.id, "err", err)
				idleFor = idle - min(idle, minRecordBackoff<<10)
			}
		}
		timer := l.cfg.Clock.NewTimer(idle - idleFor)
		select {
		case <-feed.closed:
		case <-ctx.Done():
		case <-timer.C():
		}
		timer.Stop()
		select {
		case <-feed.closed:
			return
		case <-ctx.Done():
			return
		default:
		}
	}
}

// endReason is why the run ended, for its run.finished: who finished a
// proxy run or why it ended by itself, an open batch run's idle timeout;
// empty when its items ended.
func (ar *activeRun) endReason() string {
	ar.mu.Lock()
	feed := ar.feed
	ar.mu.Unlock()
	if feed == nil {
		return ar.proxy.endReason()
	}
	feed.mu.Lock()
	defer feed.mu.Unlock()
	return feed.reason
}

// feedSource starts the feeder and the workers of a source of run ar, once;
// the caller holds feed.mu.
func (l *Loop) feedSource(ctx context.Context, ar *activeRun, feed *batchFeed, sourceID string) {
	if feed.sources[sourceID] {
		return
	}
	feed.sources[sourceID] = true
	n := l.cfg.Concurrency
	if src, err := l.cfg.Registry.GetSource(sourceID); err == nil && src.Concurrency > 0 {
		n = src.Concurrency
	}
	q := make(chan auditd.Item, n)
	for range n {
		feed.workers.Add(1)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer feed.workers.Done()
			for it := range q {
				if ctx.Err() != nil && !ar.isCancelled() {
					return // shutting down: the item resumes at the next start
				}
				l.doItem(ctx, ar, &it)
			}
		}()
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(q)
		l.feed(ctx, ar, feed, sourceID, q)
	}()
}

// feed sends q the items of source sourceID of run ar that have not ended,
// in submission order, as they are queued, until there are no more: the
// run is not open, or it was cancelled, and every item queued was sent. A
// shutdown stops it at once; a cancelled run's items are all sent, each
// to end cancelled.
func (l *Loop) feed(ctx context.Context, ar *activeRun, feed *batchFeed, sourceID string, q chan<- auditd.Item) {
	stopped := func() bool { return ctx.Err() != nil && !ar.isCancelled() }
	from := uint32(0)
	for failures := 0; !stopped(); {
		upTo, open, wake := feed.state()
		items, next, err := l.cfg.Runs.Todo(ar.id, sourceID, from, upTo, feedChunk)
		if err != nil {
			if !l.pauseAfter(l.ctx, ar, "read the run's items", &failures, err) {
				return
			}
			continue
		}
		failures = 0
		for _, it := range items {
			select {
			case q <- it:
			case <-ctx.Done():
				if stopped() {
					return // the workers have stopped too
				}
				q <- it // cancelled: the workers end every item
			}
		}
		if next > from {
			from = next
			continue
		}
		if !open || ctx.Err() != nil {
			return
		}
		select {
		case <-wake:
		case <-ctx.Done():
		}
	}
}

// AddItems adds a page of items to open batch run id, on behalf of
// principal: validated as a submit's are (keys unique in the run, known
// sources, paths), stored, each item.queued recorded, and then fed to the
// run's workers. It returns the run. A run that is not an open batch run
// is a conflict; nothing is stored or recorded when the page is refused.
func (l *Loop) AddItems(ctx context.Context, id string, items []auditd.Item) (auditd.RunView, error) {
	if err := l.checkItems(items); err != nil {
		return auditd.RunView{}, err
	}
	ar, feed, err := l.addingTo(ctx, id)
	if err != nil {
		return auditd.RunView{}, err
	}
	defer ar.adding.Unlock()
	if err := l.cfg.Runs.AddItems(ar.live, items); err != nil {
		return auditd.RunView{}, err
	}
	fresh, err := l.startSources(ctx, ar, feed, sourcesOf(items))
	if err != nil {
		return auditd.RunView{}, err
	}
	if err := l.queueItems(ar.recordCtx, ar, items); err != nil {
		return auditd.RunView{}, err
	}
	l.feedQueued(ar, feed, uint32(ar.live.Run().ItemCount), fresh)
	return l.cfg.Runs.Run(ctx, id)
}

// addingTo opens run id, an open batch run, for a page of items: it
// returns the run and its feed with the run's add lock held (one page at
// a time: the feeders read up to the last page queued), which the caller
// unlocks; a cancelled run takes no page.
func (l *Loop) addingTo(ctx context.Context, id string) (*activeRun, *batchFeed, error) {
	ar, err := l.openBatchRun(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	ar.mu.Lock()
	feed := ar.feed
	ar.mu.Unlock()
	ar.adding.Lock()
	if ar.isCancelled() {
		ar.adding.Unlock()
		return nil, nil, auditd.Errorf(auditd.ECONFLICT, "Run %s is cancelled: it takes no more items.", id)
	}
	return ar, feed, nil
}

// openBatchRun returns active run id, an open batch run, for a page of
// items; a conflict when it is not one.
func (l *Loop) openBatchRun(ctx context.Context, id string) (*activeRun, error) {
	ar := l.activeRun(id)
	if ar == nil || ar.proxy != nil {
		v, err := l.cfg.Runs.Run(ctx, id)
		if err != nil {
			return nil, err
		}
		if v.Mode == auditd.RunProxy || !v.Open || v.Status.Terminal() {
			return nil, auditd.Errorf(auditd.ECONFLICT, "Run %s takes no more items: only an open batch run does, until it is finished.", id)
		}
		return nil, auditd.Errorf(auditd.EUNAVAILABLE, "Run %s is not active (auditd is starting or shutting down); retry.", id)
	}
	return ar, nil
}

// checkItems redacts and validates a page of items (keys unique within
// it, known sources, paths) and fills in their methods.
func (l *Loop) checkItems(items []auditd.Item) error {
	redactItems(l.cfg.Registry, items)
	if err := validateRun(&l.gates, auditd.NewRun{Items: items}); err != nil {
		return err
	}
	for i := range items {
		items[i].Method = itemMethod(items[i].Method)
	}
	return nil
}

// startSources snapshots in the registry, for run ar, those of sources
// that are new to it, and returns them, for feedQueued to feed.
func (l *Loop) startSources(ctx context.Context, ar *activeRun, feed *batchFeed, sources []string) ([]string, error) {
	var fresh []string
	feed.mu.Lock()
	for _, src := range sources {
		if !feed.sources[src] {
			fresh = append(fresh, src)
		}
	}
	feed.mu.Unlock()
	if len(fresh) > 0 {
		if err := l.cfg.Registry.StartRun(ctx, ar.id, fresh); err != nil {
			return nil, fmt.Errorf("snapshot registry: %w", err)
		}
	}
	return fresh, nil
}

// feedQueued lets run ar's feeders read its items up to index queued
// (their item.queued recorded), starting a feeder for each source of
// fresh.
func (l *Loop) feedQueued(ar *activeRun, feed *batchFeed, queued uint32, fresh []string) {
	feed.mu.Lock()
	defer feed.mu.Unlock()
	feed.queued = queued
	feed.lastPage = l.cfg.Clock.Now()
	runCtx := ar.runCtx()
	for _, src := range fresh {
		l.feedSource(runCtx, ar, feed, src)
	}
	feed.poke()
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
	ev, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(status), Reason: ar.endReason()})
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
