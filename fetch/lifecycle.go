package fetch

import (
	"context"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/staging"
)

// itemEnds is where a batch run's item and a proxied request differ when
// the lifecycle they share records what happened and ends the item: a
// batch worker waits for each record to be durable (Loop.mustRecord); a
// proxied request posts them, so that a client is not held while the
// ledger's writes fail, its item.queued first (proxied.note).
type itemEnds interface {
	// record appends e, which describes what already happened.
	record(e auditd.Event)
	// end ends the item (Loop.endItem).
	end(out auditd.Outcome, reason string, res *auditd.ItemResult, lastGood string, payload *staging.Payload)
	// fallBack ends the item from its last good copy, for reason, and
	// reports whether it could: a batch item from any copy that verifies,
	// a proxied request only when its source serves stale copies.
	fallBack(reason string) bool
}

// batchEnds are a batch run's item's ends.
type batchEnds struct {
	l        *Loop
	ctx      context.Context
	ar       *activeRun
	it       *job
	lastGood string // the item's key in the last-good index
}

func (b batchEnds) record(e auditd.Event) { b.l.mustRecord(b.ctx, b.ar, e) }

func (b batchEnds) end(out auditd.Outcome, reason string, res *auditd.ItemResult, lastGood string, payload *staging.Payload) {
	b.l.endItem(b.ar, b.it, out, reason, res, lastGood, payload)
}

func (b batchEnds) fallBack(reason string) bool {
	return b.l.serveCached(b.ctx, b.ar, b.it, b.lastGood, reason)
}

func (p *proxied) record(e auditd.Event)       { p.note(e) }
func (p *proxied) fallBack(reason string) bool { return p.serveStale(reason) }

// endUnanswered ends an item that got no fresh answer: from its last
// good copy, for copyReason, when its caller falls back on one, and as out
// with reason otherwise. It reports whether the copy answered it.
func endUnanswered(to itemEnds, copyReason string, out auditd.Outcome, reason string) bool {
	if to.fallBack(copyReason) {
		return true
	}
	to.end(out, reason, nil, "", nil)
	return false
}

// endShed records that the gates shed item it at gate by its deadline,
// then ends it (endUnanswered): from its copy, or shed.
func endShed(to itemEnds, it *auditd.Item, gate string) bool {
	to.record(auditd.Event{Type: auditd.EventShed, SourceID: it.SourceID, ItemKey: it.Key, Gate: gate})
	return endUnanswered(to, "shed at "+gate, auditd.ItemShed, "deadline")
}

// recordAdmission records what the gates did before admitting an attempt
// of page of item it (p; empty when the gates did not admit it): breaker
// transitions, then the waits, each with the attempt it held back.
//
// A request a throttle answered (throttled) waits out the pause the
// throttle asked for before it goes again, and its retry records that
// wait (R4). When the gates had nothing left to hold it back for, the
// pause having run out while the loop recorded what came back (a busy
// machine, a slow disk), the wait was spent all the same between the
// throttle's record and now: it is recorded as the pause's, planned as
// the throttle asked and as long as it actually was.
func recordAdmission(to itemEnds, it *auditd.Item, page int, attempt uint32, p *limiter.Permit, throttled *attempt) {
	for _, t := range p.Breaker {
		to.record(breakerEvent(it, t))
	}
	for _, w := range p.Waits {
		to.record(waitEvent(it, page, attempt, w))
	}
	if throttled == nil || throttled.throttledAt.IsZero() || len(p.Waits) > 0 || p.Admitted.IsZero() {
		return
	}
	to.record(waitEvent(it, page, attempt, limiter.Wait{
		Gate: limiter.GatePause, Planned: throttled.pause, Actual: p.Admitted.Sub(throttled.throttledAt),
	}))
}

// endCached ends item it from c, its last good copy: cache.served, then
// the item's end, cached, both saying which run fetched the copy (looked
// up in the ledger for a copy indexed before the index kept runs), when,
// and how old it is. It returns that description.
func (l *Loop) endCached(to itemEnds, it *auditd.Item, c staging.Copy, reason string) *auditd.CachedCopy {
	origin := c.Run
	if origin == "" {
		origin = l.originRun(c.Sum, c.FetchedAt)
	}
	cp := l.cachedCopy(c, origin)
	to.record(auditd.Event{Type: auditd.EventCacheServed, SourceID: it.SourceID, ItemKey: it.Key,
		PayloadHash: c.Sum, Reason: reason, Detail: cp.CacheDetail()})
	to.end(auditd.ItemCached, reason, &auditd.ItemResult{PayloadHash: c.Sum, Advertised: -1, Cached: cp}, "", nil)
	return cp
}
