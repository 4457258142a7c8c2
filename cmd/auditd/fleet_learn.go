package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// maxAdvertisedWindow is the longest quota window a server may advertise
// that the fleet is held to (a day's quota, as public APIs have).
const maxAdvertisedWindow = 24 * time.Hour

// fleetOutcomesEvery is how often a node puts its outcomes of a key for the key's
// learner (one etcd write a key a node, when they changed).
const fleetOutcomesEvery = time.Second

// fleetLearning is one key's learning on this node: the fleet learns one
// rate for the key (fleet.Learner, elected among the nodes, raises it; any
// node cuts it on a refusal), and this node reserves its slots at it. The
// node's own learned pace is not applied to the key's budget meanwhile
// (limiter.Learner): it would hold the node to a share of the fleet's.
type fleetLearning struct {
	key, node string
	store     *fleet.Store
	slots     *fleet.Slots
	learner   *fleet.Learner
	notify    func(fleet.Event)
	// clock stamps what this node applies and the windows it marks spent
	// (a fake in tests); the campaign, the watch and the reports run on
	// real time.
	clock clock.Clock

	ok, refused atomic.Int64 // this node's outcomes of the key, cumulative
	cutting     atomic.Bool  // a cut is on its way to etcd
	// episode is set by a cut, this node's or another's, and cleared by
	// the next success here: refusals with no success between them are
	// one episode, which cuts once (a spent window refuses everything
	// until it resets, whatever the pace).
	episode atomic.Bool

	mu      sync.Mutex
	limit   fleet.Limit // the learned limit in force here; Revision 0 until one is read
	rate    fleet.Rate  // what the slots reserve at: the limit, capped at the ceiling
	applied time.Time   // when this node began reserving at it
	atQuota quotaShare  // answers and refusals at an advertised quota since the last cut
	// quota is the quota the server last advertised here, zero when none
	// for quotaMemory: the slots are never spaced closer than it allows
	// (Slots.SetRate). quotaAt is when an answer last carried it.
	quota   fleet.Rate
	quotaAt time.Time

	ctx    context.Context // ends when the learning stops
	cancel context.CancelFunc
	done   sync.WaitGroup
	// calls are the key's etcd writes made without holding up their
	// caller: cuts, limits set by hand, and the share's pauses.
	calls keyCalls
}

// startLearning starts key's learning on this node: it campaigns to be the
// key's learner, follows the key's learned limit and reports this node's
// outcomes. Until the fleet's limit is read, the node reserves at start:
// the ceiling when the operator told it, else where the node's registry
// would start alone.
func startLearning(store *fleet.Store, slots *fleet.Slots, clk clock.Clock, key, node string, start, ceiling fleet.Rate, notify func(fleet.Event)) *fleetLearning {
	ctx, cancel := context.WithCancel(context.Background())
	l := &fleetLearning{key: key, node: node, store: store, slots: slots, notify: notify, clock: clk, ctx: ctx, cancel: cancel,
		learner: fleet.NewLearner(store, clock.Real{}, fleet.LearnerConfig{Key: key, Node: node, Ceiling: ceiling, Start: start})}
	l.rate, l.applied = slots.SetRate(start, fleet.Rate{}), clk.Now()
	l.done.Add(3)
	go func() { defer l.done.Done(); _ = l.learner.Run(ctx) }()
	go func() { defer l.done.Done(); l.follow(ctx) }()
	go func() { defer l.done.Done(); l.report(ctx) }()
	return l
}

// stop ends the key's learning on this node: its campaign, its watch,
// its reports and its calls on their way. It waits for them until ctx
// ends: without a quorum a campaign resigns only when the etcd client
// closes.
func (l *fleetLearning) stop(ctx context.Context) {
	l.cancel()
	l.calls.wait(ctx)
	waitFor(ctx, &l.done)
}

// keyCalls runs a key's etcd writes in the background, each bounded by
// fleet.DefaultTimeout, and lets the node wait for them as it stops the
// key.
type keyCalls struct {
	mu      sync.Mutex
	stopped bool // wait has begun: no call starts any more
	wg      sync.WaitGroup
}

// Go runs f in the background and reports true; once wait has begun it
// runs nothing and reports false.
func (c *keyCalls) Go(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return false
	}
	c.wg.Go(f)
	return true
}

// wait lets no call start any more and waits for those on their way until
// ctx ends.
func (c *keyCalls) wait(ctx context.Context) {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
	waitFor(ctx, &c.wg)
}

// waitFor waits for wg until ctx ends.
func waitFor(ctx context.Context, wg *sync.WaitGroup) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	}
}

// Leading reports whether this node is the key's learner now.
func (l *fleetLearning) Leading() bool { return l.learner.Leading() }

// Limit returns the learned limit in force on this node (Revision 0 when
// none was read yet) and the rate the node's slots are reserved at: the
// limit, capped at the told ceiling.
func (l *fleetLearning) Limit() (fleet.Limit, fleet.Rate) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.limit, l.rate
}

// follow applies every change of the key's learned limit to the node's
// slots, recording it first, until ctx ends; a watch that fails is
// started again.
func (l *fleetLearning) follow(ctx context.Context) {
	for ctx.Err() == nil {
		ch := make(chan fleet.Limit)
		errc := make(chan error, 1)
		wctx, stop := context.WithCancel(ctx)
		go func() { errc <- l.store.WatchLimit(wctx, l.key, ch) }()
	watch:
		for {
			select {
			case lim := <-ch:
				l.apply(lim)
			case <-errc:
				break watch
			}
		}
		stop()
		if clock.Sleep(ctx, clock.Real{}, time.Second) != nil {
			return
		}
	}
}

// apply makes lim the rate of the node's next blocks. The change is handed
// to the ledger before any block at the new rate is reserved: a grant's
// record is written with everything queued before it.
func (l *fleetLearning) apply(lim fleet.Limit) {
	if lim.Revision == 0 {
		return
	}
	l.mu.Lock()
	if lim.Revision <= l.limit.Revision {
		l.mu.Unlock()
		return
	}
	cut := l.limit.Revision != 0 && l.limit.Rate.PerSecond() > lim.Rate.PerSecond()
	l.limit, l.applied = lim, l.clock.Now()
	if cut {
		l.atQuota = quotaShare{} // answered at the pace cut: they tell nothing of the next
	}
	l.mu.Unlock()
	if cut {
		l.episode.Store(true)
	}
	l.notify(fleet.Event{Kind: fleet.EventLearned, Key: l.key, At: l.clock.Now(), Limit: lim})
	l.mu.Lock()
	l.rate = l.slots.SetRate(lim.Rate, l.quota)
	l.mu.Unlock()
}

// spaceFor makes quota, the quota the server advertised on an answer
// (zero: none), a bound of the slots' spacing when it changed: its window
// may be shorter than the ceiling's, and a learned rate counted over a
// longer one spreads the skew guard too thin for it. l.mu is held.
//
// A quota is kept until successes have come without one for quotaMemory:
// a server may put its headers on some answers only (its 429s, one
// endpoint, one member of a gateway group), and forgetting the quota at
// the first answer without it would drop the guard until the next.
// Each node keeps what its own answers carried: a node that has not seen
// the quota lately spaces by the learned rate and the ceiling alone.
func (l *fleetLearning) spaceFor(quota fleet.Rate) {
	if quota != l.quota {
		l.quota = quota
		l.rate = l.slots.SetRate(l.rate, quota)
	}
}

// quotaMemory is how long a quota q is kept with no answer carrying it:
// a minute, or ten of its windows when longer.
func quotaMemory(q fleet.Rate) time.Duration {
	return max(time.Minute, 10*q.Window)
}

// report puts this node's outcomes of the key for its learner every
// fleetOutcomesEvery, when they changed, until ctx ends.
func (l *fleetLearning) report(ctx context.Context) {
	var last fleet.Outcomes
	t := time.NewTicker(fleetOutcomesEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		o := fleet.Outcomes{OK: l.ok.Load(), Refused: l.refused.Load()}
		if o == last {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, fleet.DefaultTimeout)
		if l.store.Report(rctx, l.key, l.node, o) == nil {
			last = o
		}
		cancel()
	}
}

// observed counts a response to one of the key's requests admitted at
// admitted, holds the fleet's limit, and the node's slots' spacing, to a
// quota the server advertises (h), and cuts the limit for a refusal that
// no hint explains, once an episode, by windowSpent's rule: not for a
// refusal with no success here since the episode began or the last cut,
// and by a quarter not for a request admitted before the limit in force
// had settled (fleet.Settle after this node applied it), which was sent at
// the pace the last cut already answered. A refusal whose server said when
// to come back (a Retry-After, a spent quota's Remaining 0 with its Reset)
// is a pause, shared as one.
//
// A plain refusal that advertises a quota the fleet is held to (its limit
// at atQuotaNear of the quota or more) is no window spent: the quota's
// count is the server's own, and a fleet paced at it meets its edge now
// and then (a sliding window refuses a request a few milliseconds early).
// It cuts by a quarter only when such refusals are more than atQuotaShare
// of this node's answers sent at a settled pace since the last cut: then
// the server does not keep the quota it advertises.
func (l *fleetLearning) observed(admitted time.Time, c limiter.Class, h hints.Hint) {
	told := fleet.Rate{Limit: h.Limit, Window: h.Window}
	// A quota over more than a day (or a window that saturated parsing) is
	// not one to cut the fleet to: each slot of it would push the key's
	// shared arrival time, which never comes back, hours ahead.
	advertised := h.HasLimit && h.HasWindow && told.Valid() && told.Window <= maxAdvertisedWindow
	spent := h.HasRemaining && h.Remaining == 0 && h.HasReset
	plain := c == limiter.ClassThrottled && !h.HasRetryAfter && !spent
	l.mu.Lock()
	switch now := l.clock.Now(); {
	case advertised:
		l.quotaAt = now
		l.spaceFor(told)
	case c == limiter.ClassSuccess && now.Sub(l.quotaAt) > quotaMemory(l.quota):
		l.spaceFor(fleet.Rate{}) // no answer has carried a quota for a while: the server advertises none
	}
	cur, settled := l.limit, admitted.After(l.applied.Add(fleet.Settle))
	atQuota := plain && advertised && cur.Revision != 0 && cur.Rate.PerSecond() >= atQuotaNear*told.PerSecond() && cur.Rate.PerSecond() <= told.PerSecond()
	overShare := false
	if settled && (atQuota || c == limiter.ClassSuccess || c == limiter.ClassClient) {
		overShare = l.atQuota.add(atQuota)
	}
	l.mu.Unlock()
	if advertised && cur.Revision != 0 && cur.Rate.PerSecond() > told.PerSecond() {
		l.cut(func() (limitCut, bool) { return limitCut{told, told, fleet.CauseQuota}, true }) // the server's own count: the learner raises to nine tenths of it, and probes past it only to be held back here
	}
	switch c {
	case limiter.ClassSuccess, limiter.ClassClient:
		l.ok.Add(1)
		l.episode.Store(false)
		return
	case limiter.ClassThrottled:
		l.refused.Add(1)
	default:
		return
	}
	if !plain || cur.Revision == 0 {
		return
	}
	if atQuota {
		if overShare && l.episode.CompareAndSwap(false, true) {
			if !l.cut(func() (limitCut, bool) { return limitCut{fleet.CutTo(cur.Rate), cur.Rate, fleet.CauseRefused}, true }) {
				l.episode.Store(false)
			}
		}
		return
	}
	if !l.episode.CompareAndSwap(false, true) {
		return
	}
	if !l.cut(func() (limitCut, bool) { return l.windowSpent(cur, settled, admitted) }) {
		l.episode.Store(false) // another cut was on its way: the next refusal tries again
	}
}

// A plain refusal at a quota the server advertises (atQuotaNear of it or
// more: the learner regains to nine tenths of the rate refused) cuts when
// more than atQuotaShare of a node's answers since the last cut were such
// refusals, atQuotaRefusals of them at least: the 2% of refusals issue 26
// allows a learned pace. Answers are counted from the last cut on, not over
// a short sliding span, so that the share read is the server's, not its
// spread (a span of 100 answers would hold three refusals now and then from
// a server that refuses 1%); at atQuotaKept answers both counts halve, so
// that a quota kept for hours does not hide one the server stops keeping.
const (
	atQuotaNear     = 0.85
	atQuotaShare    = 0.02
	atQuotaRefusals = 3
	atQuotaKept     = 1000
)

// quotaShare counts a node's answers of a key, and among them its plain
// refusals at an advertised quota, since the last cut it applied.
type quotaShare struct {
	answered, refused int
}

// add counts one answer, refused at the quota or not, and reports whether
// the refusals are now more than atQuotaShare of the answers, and
// atQuotaRefusals at least.
func (q *quotaShare) add(refused bool) bool {
	if q.answered == atQuotaKept {
		q.answered, q.refused = q.answered/2, q.refused/2
	}
	q.answered++
	if refused {
		q.refused++
	}
	return q.refused >= atQuotaRefusals && float64(q.refused) > atQuotaShare*float64(q.answered)
}

// windowSpent is the rule at the first plain refusal of an episode here
// that is not at a quota the server advertises (observed).
// It marks the window spent, fleet-wide (fleet.Store.Spent), and returns
// the cut to make, or ok false for none:
//   - the first mark cuts nothing: the next episode measures the window;
//   - another node's mark moments before (fewer than fleet.MinWindowAdmitted
//     answered since) is the same spent window, and cuts nothing more;
//   - a mark more than one and a half windows (the shortest span between
//     marks seen) before cuts nothing: the windows between went unspent;
//     unless the limit is a probe past the rate last refused, or the mark
//     is two and a half windows or less after the last, at a settled
//     limit the fleet was answered at three quarters of or more: a limit
//     just past the quota spends every other window, so it is the rate
//     refused, and the limit is trimmed under it (fleet.TrimTo);
//   - a mark within maxWindowSpan before: the pace the fleet was answered at
//     between the two, a fixed window's quota over its length
//     (fleet.WindowRate: the span, or the common window length it is
//     taken for, windowLength), is the limit and the rate refused, so the learner
//     holds it (fleet.Raise); never lower than a quarter's cut, which is
//     then the limit, remembering as refused the rate of which the pace
//     is a quarter's cut;
//   - otherwise, or when etcd fails, the quarter's cut (fleet.CutTo) of a
//     request sent at a settled pace.
//
// The mark is at the refusal: when its request was admitted (about when
// the server counted it), unless that was markAge or more before now, and
// the fleet's answered count for it is read spentRead after that.
func (l *fleetLearning) windowSpent(lim fleet.Limit, settled bool, admitted time.Time) (limitCut, bool) {
	cur := lim.Rate
	now := l.clock.Now()
	at := now
	if !admitted.IsZero() && !admitted.After(now) && now.Sub(admitted) < markAge {
		at = admitted
	}
	if clock.Sleep(l.ctx, l.clock, at.Add(spentRead).Sub(now)) != nil {
		return limitCut{}, false
	}
	ctx, cancel := context.WithTimeout(l.ctx, fleet.DefaultTimeout)
	defer cancel()
	span, n, window, seen, err := l.store.Spent(ctx, l.key, at)
	switch {
	case err == nil && !seen:
		return limitCut{}, false
	case err == nil && span <= maxWindowSpan && n < fleet.MinWindowAdmitted:
		return limitCut{}, false
	case err == nil && window > 0 && 2*span > 3*window:
		probe := lim.Refused.Limit > 0 && cur.PerSecond() > lim.Refused.PerSecond()
		everyOther := 2*span <= 5*window && settled && float64(n) >= 0.75*cur.PerSecond()*span.Seconds()
		if !probe && !everyOther {
			// Windows went by unspent between the marks: the pace was
			// under the quota in them, and what they admitted tells not
			// the quota.
			return limitCut{}, false
		}
		// A window spent after one or more went by unspent, by a probe
		// past the rate last refused, or at a settled limit two windows
		// (two and a half at most) after the last, the fleet answered at
		// three quarters of it or more between (less, and the demand left
		// the windows unspent): the limit is just past the quota, and
		// each refusal's pause took enough from the window after it to
		// leave it unspent. So every other window, the marks never a
		// window apart to measure by: a fleet at 6.3/s of 6 was answered
		// 30 and 22 by turns. The limit in force spent a window, so it is
		// the rate refused, and the limit is trimmed under it. Not back to
		// the rate refused before: that may be a window's count read
		// short (29 of 30, once in each of two runs), which every probe
		// would then return to all run.
		return limitCut{fleet.TrimTo(cur), cur, fleet.CauseWindowSpent}, true
	case err == nil && span <= maxWindowSpan:
		r, ok := fleet.WindowRate(n, windowLength(span, window))
		if ok && r.PerSecond() >= fleet.CutTo(cur).PerSecond() {
			return limitCut{r, r, fleet.CauseWindowSpent}, true
		}
		if ok {
			// The fleet was answered at less than a quarter's cut. The
			// rate remembered as refused is the one whose quarter's cut
			// is that pace (never above the rate in force), so the learner
			// regains to a fifth above it: enough to spend the next
			// window, and to measure it, when the pace read low; never
			// back toward the rate in force, which would only meet the
			// next mark with a quarter's cut above the window's pace
			// again, a ratchet that never reaches the window.
			refused := fleet.Rate{Limit: r.Limit, Window: r.Window * 3 / 4}
			if refused.PerSecond() > cur.PerSecond() {
				refused = cur
			}
			return limitCut{fleet.CutTo(cur), refused, fleet.CauseRefused}, settled
		}
	}
	return limitCut{fleet.CutTo(cur), cur, fleet.CauseRefused}, settled
}

// spentRead is how long after a refusal a node reads the fleet's answered
// count for its mark: by then every node's report (fleetOutcomesEvery)
// holds what it had answered when the window was spent, and a spent window
// answers nothing more until it resets. Read at once, the count missed up
// to a second of the burst that spent the window, differently at each
// mark: 135 per 20 s was learned of 30 per 5 s.
const spentRead = fleetOutcomesEvery + 250*time.Millisecond

// windowSpanErr is how far the span between two marks may be from a common
// window length (registry.CommonWindow) and be taken for it
// (windowLength). The span errs by where in each window the pace spent it:
// 4.88 to 5.12 s between windows of 5 s in TestFleetUsesAFixedWindow on a
// quiet machine. What was answered between two marks is one window's quota
// whatever point of it each was spent at, as both counts are read the same
// time after their marks (spentRead), so the quota is spread over the
// window's length, not the span.
const windowSpanErr = 0.1

// windowLength is the length of the window whose quota the fleet answered
// over span, the time between two marks: the common window length within
// windowSpanErr of span; or within twice that, as on one node (registry's
// windowSpent), when the shortest span seen between marks (shortest, 0
// when none) is within windowSpanErr of that same length; else span
// itself. On a loaded machine the marks come later each window while the
// pace falls short of the quota: 5.40 s, 5.51 s, 5.67 s and 5.80 s between
// windows of 5 s. Spread over such a span the quota read up to a sixth
// low, and a pace under the quota spends no window to be measured again:
// the fleet held 5.28/s of 6 until its probes, 30 s on, climbed back. A
// window of a length no common one is within a tenth of (6 s, 12 s) is
// never taken for a common one a fifth off, which would pace the fleet a
// sixth past its quota in every window: its shortest span is near its own
// length.
func windowLength(span, shortest time.Duration) time.Duration {
	if w, ok := registry.CommonWindow(span, windowSpanErr); ok {
		return w
	}
	if w, ok := registry.CommonWindow(span, 2*windowSpanErr); ok {
		if s, ok := registry.CommonWindow(shortest, windowSpanErr); ok && s == w {
			return w
		}
	}
	return span
}

// markAge is how long before it is seen here a refusal's request may have
// been admitted for the mark to be set at its admission rather than now. A
// refusal seen late would move the mark and its count's read by its
// lateness: a span read long, and a count that holds answers of the next
// window, which a common length would then spread over too little time.
const markAge = 2 * time.Second

// maxWindowSpan is the longest time between two episodes whose pace
// windowSpent takes as a window's quota.
const maxWindowSpan = time.Minute

// limitCut is a cut of the fleet's limit: to the rate to, remembering the rate
// refused, for cause (fleet.CauseRefused, CauseWindowSpent, CauseQuota).
type limitCut struct {
	to, refused fleet.Rate
	cause       string
}

// cut lowers the fleet's limit as rule says, in the background (rule may
// read etcd); one cut at a time, and none when rule says no. It reports
// false when another cut was on its way, or the learning is stopping, and
// rule was not run. A cut etcd did not take ends the episode, so that the
// next refusal tries again.
func (l *fleetLearning) cut(rule func() (limitCut, bool)) bool {
	if !l.cutting.CompareAndSwap(false, true) {
		return false
	}
	started := l.calls.Go(func() {
		defer l.cutting.Store(false)
		c, ok := rule()
		if !ok {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), fleet.DefaultTimeout)
		defer cancel()
		if _, _, err := l.store.Cut(ctx, l.key, c.to, c.refused, c.cause, l.node); err != nil {
			l.episode.Store(false)
		}
	})
	if !started {
		l.cutting.Store(false)
	}
	return started
}

// setByHand writes r as the key's learned limit for the whole fleet, in the
// background: it was set by hand on this node (fetch.Loop.SetLimit), and
// the registry recorded it. It applies once the
// write is watched back, as any change.
func (l *fleetLearning) setByHand(r fleet.Rate) {
	if r.Limit <= 0 || r.Window <= 0 {
		return // no limit to share: the ceiling's slots pace the key
	}
	l.calls.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), fleet.DefaultTimeout)
		defer cancel()
		_, _ = l.store.Set(ctx, l.key, r, l.node) // a failure leaves the fleet's limit as it was
	})
}
