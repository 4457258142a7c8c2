package fetch

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
)

// A proxy-mode run has no items up front: each request a pipeline sends
// through the proxy route becomes one (proxy.go). It ends when asked to
// (Finish), when it has seen no request for its idle timeout, or when it
// is cancelled; the reason is recorded on its run.finished. A shutdown
// leaves it running, and the next start resumes it (resumeProxy).

// proxyRun is what the loop keeps of a proxy-mode run besides its
// activeRun.
type proxyRun struct {
	idle time.Duration

	mu        sync.Mutex
	inFlight  int                      // requests between enter and leave
	last      time.Time                // when the last request ended, or the run started
	finishing bool                     // no new requests; ends once inFlight is 0
	reason    string                   // why it ends: run.finished's Reason
	sources   map[string]bool          // sources with a run.start registry snapshot
	snapshots map[string]chan struct{} // snapshots being taken
	repeats   map[string]int           // derived item key -> how many requests took it (addProxyItem)
	wake      chan struct{}            // the run's goroutine looks again
	// ctx ends when the run is cancelled or the loop shuts down; every
	// request of the run ends with it.
	ctx context.Context
}

func newProxyRun(run auditd.Run, now time.Time) *proxyRun {
	idle := run.IdleTimeout.D()
	if idle <= 0 {
		idle = auditd.DefaultIdleTimeout
	}
	return &proxyRun{idle: idle, last: now, sources: map[string]bool{}, snapshots: map[string]chan struct{}{}, repeats: map[string]int{}, wake: make(chan struct{}, 1)}
}

// maxRepeats bounds the derived keys a proxy-mode run remembers the
// repeats of: one per distinct request otherwise, for the whole run.
const maxRepeats = 10_000

// endReason is the Reason of the run's run.finished: empty for a batch run.
func (pr *proxyRun) endReason() string {
	if pr == nil {
		return ""
	}
	pr.mu.Lock()
	defer pr.mu.Unlock()
	return pr.reason
}

func (pr *proxyRun) poke() {
	select {
	case pr.wake <- struct{}{}:
	default:
	}
}

// enter admits a request into the run, unless the run is ending or the
// loop shutting down. Every request that entered must leave.
func (l *Loop) enterProxy(ar *activeRun) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return auditd.Errorf(auditd.EUNAVAILABLE, "auditd is shutting down; retry against the restarted service")
	}
	pr := ar.proxy
	pr.mu.Lock()
	defer pr.mu.Unlock()
	if pr.finishing {
		return auditd.Errorf(auditd.ECONFLICT, "Run %s is finishing; it takes no more requests.", ar.id)
	}
	pr.inFlight++
	l.wg.Add(1)
	return nil
}

func (l *Loop) leaveProxy(ar *activeRun) {
	pr := ar.proxy
	pr.mu.Lock()
	pr.inFlight--
	pr.last = l.cfg.Clock.Now()
	if len(pr.repeats) > maxRepeats {
		// Only a hint of where a repeated request's next " #n" is: without
		// it addProxyItem finds it by trying the taken keys.
		clear(pr.repeats)
	}
	pr.mu.Unlock()
	pr.poke()
	l.wg.Done()
}

// snapshotSource records the run.start registry snapshot of a source the
// first time a request of the run uses it (a batch run takes them all at
// its start); other requests of the source wait for it.
func (ar *activeRun) snapshotSource(ctx context.Context, reg *registry.Registry, sourceID string) error {
	pr := ar.proxy
	pr.mu.Lock()
	if pr.sources[sourceID] {
		pr.mu.Unlock()
		return nil
	}
	if ch, ok := pr.snapshots[sourceID]; ok {
		pr.mu.Unlock()
		select {
		case <-ch:
			return ar.snapshotSource(ctx, reg, sourceID)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	ch := make(chan struct{})
	pr.snapshots[sourceID] = ch
	pr.mu.Unlock()
	err := reg.StartRun(ctx, ar.id, []string{sourceID})
	pr.mu.Lock()
	delete(pr.snapshots, sourceID)
	pr.sources[sourceID] = err == nil
	pr.mu.Unlock()
	close(ch)
	if err != nil {
		return fmt.Errorf("snapshot registry: %w", err)
	}
	return nil
}

// launchProxy makes a proxy-mode run active and starts the goroutine that
// ends it: when asked to, when idle for its timeout, or when cancelled.
func (l *Loop) launchProxy(ar *activeRun) {
	ctx, cancel := context.WithCancel(l.ctx)
	ar.recordCtx = context.WithoutCancel(ctx)
	ar.mu.Lock()
	ar.cancel = cancel
	ar.mu.Unlock()
	pr := ar.proxy
	pr.ctx = ctx
	l.mu.Lock()
	l.active[ar.id] = ar
	l.mu.Unlock()

	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer cancel()
		for {
			pr.mu.Lock()
			inFlight, finishing := pr.inFlight, pr.finishing
			idleFor := l.cfg.Clock.Now().Sub(pr.last)
			switch {
			case ctx.Err() != nil && ar.isCancelled():
				pr.finishing = true
				if pr.reason == "" {
					pr.reason = "cancelled"
				}
				finishing = true
			case ctx.Err() != nil:
				pr.mu.Unlock()
				return // shutdown: the run resumes at the next start
			case !finishing && inFlight == 0 && idleFor >= pr.idle:
				pr.finishing, pr.reason = true, fmt.Sprintf("idle for %v: no request within the run's idle timeout", pr.idle)
				finishing = true
			}
			pr.mu.Unlock()
			if finishing && inFlight == 0 {
				break
			}
			var timer clock.Timer
			var timerC <-chan time.Time
			if !finishing && inFlight == 0 {
				timer = l.cfg.Clock.NewTimer(pr.idle - idleFor)
				timerC = timer.C()
			}
			select {
			case <-pr.wake:
			case <-timerC:
			case <-ctx.Done():
			}
			if timer != nil {
				timer.Stop()
			}
		}
		if err := l.finish(ar.recordCtx, ar); err != nil {
			l.log.Error("finish run", "run", ar.id, "err", err)
		}
	}()
}

// Finish ends proxy-mode run id on behalf of principal: it takes no more
// requests, and once those in flight are answered its end is recorded
// (run.finished, Reason naming who finished it). It returns the finished
// run. An open batch run is closed instead (closeBatch). A batch run
// submitted whole, or a run that has ended, is a conflict.
func (l *Loop) Finish(ctx context.Context, id, principal string) (auditd.RunView, error) {
	ar := l.activeRun(id)
	if ar != nil && ar.feed != nil {
		return l.closeBatch(ctx, ar)
	}
	if ar == nil || ar.proxy == nil {
		v, err := l.cfg.Runs.Run(ctx, id)
		if err != nil {
			return v, err
		}
		if v.Mode != auditd.RunProxy {
			return v, auditd.Errorf(auditd.ECONFLICT, "Run %s is a batch run: it ends when its items do (cancel stops it).", id)
		}
		if v.Status.Terminal() {
			return v, auditd.Errorf(auditd.ECONFLICT, "Run %s is %s already.", id, v.Status)
		}
		return v, auditd.Errorf(auditd.EUNAVAILABLE, "Run %s is not active (auditd is starting or shutting down); retry.", id)
	}
	pr := ar.proxy
	pr.mu.Lock()
	if !pr.finishing {
		pr.finishing, pr.reason = true, "finished by "+principal
	}
	pr.mu.Unlock()
	pr.poke()
	return l.Wait(ctx, id)
}

// closeBatch closes open batch run ar: it takes no more pages, and ends
// once the items it has end. It returns the run as it is then, still
// running.
func (l *Loop) closeBatch(ctx context.Context, ar *activeRun) (auditd.RunView, error) {
	ar.adding.Lock() // a page being added is fed first
	defer ar.adding.Unlock()
	if !ar.live.Run().Open {
		return auditd.RunView{}, auditd.Errorf(auditd.ECONFLICT, "Run %s is a batch run submitted whole, or finished already: it ends when its items do (cancel stops it).", ar.id)
	}
	if err := l.cfg.Runs.Close(ar.live); err != nil {
		return auditd.RunView{}, err
	}
	f := ar.feed
	f.mu.Lock()
	f.open = false
	close(f.closed)
	f.poke()
	f.mu.Unlock()
	return l.cfg.Runs.Run(ctx, ar.id)
}

// proxiedDetail is the Detail of a proxied request's item.queued: the
// hash and size of the body it sent, when it sent one.
type proxiedDetail struct {
	BodySHA256 string `json:"body_sha256,omitempty"`
	BodyBytes  int    `json:"body_bytes,omitempty"`
}

// resumeProxy picks up a proxy-mode run that a crash or restart left
// unfinished. As resume does for a batch run, it recounts the run from the
// ledger, rebuilds its items (from item.queued) and their results, and
// records every dispatch without an outcome as interrupted; a proxied
// request whose item had not ended is lost with the client's connection,
// so its item ends failed. Then the run takes requests again.
func (l *Loop) resumeProxy(ctx context.Context, live *runs.Live) (func(), error) {
	id := live.ID()
	ar := newActiveRun(live)
	ar.proxy = newProxyRun(live.Run(), l.cfg.Clock.Now())
	// The items not finished, with their dispatches: every other item has
	// its result stored (a run an earlier build stored keeps them all, to
	// rebuild their results).
	type open struct {
		it         *auditd.Item
		seq        uint64 // of its item.queued
		dispatched int
	}
	pending := map[string]*open{}
	var items map[string]*auditd.Item
	if live.Rebuilds() {
		items = map[string]*auditd.Item{}
	}
	rp, err := replay(l.cfg.Ledger, live, items, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventRegistrySnapshot:
			if e.Snapshot == "run.start" {
				ar.proxy.sources[e.SourceID] = true
			}
		case auditd.EventItemQueued:
			it := &auditd.Item{Key: strings.Clone(e.ItemKey), SourceID: strings.Clone(e.SourceID), Method: e.Method, Path: strings.Clone(e.Path)}
			pending[it.Key] = &open{it: it, seq: e.Seq}
			if items != nil {
				items[it.Key] = it
			}
			if err := live.RestoreItem(*it); err != nil {
				return fmt.Errorf("item.queued %d: %w", e.Seq, err)
			}
		case auditd.EventDispatch:
			if o := pending[e.ItemKey]; o != nil {
				o.dispatched++
			}
		case auditd.EventItemFinished:
			delete(pending, e.ItemKey)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if cont, err := l.pickUp(ctx, ar, rp, nil); !cont || err != nil {
		return nil, err
	}
	if rp.started {
		lost := slices.SortedFunc(maps.Values(pending), func(a, b *open) int { return cmp.Compare(a.seq, b.seq) })
		for _, o := range lost {
			it := &job{Item: o.it, attempts: &itemAttempts{total: o.dispatched}}
			l.endItem(ar, it, auditd.ItemFailed, "proxied request lost to a restart: the client's connection closed before an answer", nil, "", nil)
		}
		ar.posts.Wait()
		l.log.Info("resuming proxy-mode run", "run", id, "items", live.Run().ItemCount, "lost", len(lost), "interrupted", len(rp.open))
	}
	if err := l.cfg.Runs.Start(live); err != nil {
		return nil, err
	}
	return func() { l.launchProxy(ar) }, nil
}
