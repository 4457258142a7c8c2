package fetch

import (
	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/staging"
)

// itemEnds is where a batch run's item and a proxied request differ when
// the lifecycle they share records what happened and ends the item. Both
// post the records of what already happened (a wait, a breaker's change)
// without waiting for them: the ledger stores posts in order, so they are
// durable with the dispatch record that follows, or before it, and a
// request admitted by a gate is not held back by a commit of its own
// before its dispatch's (in a fleet, the time between its slot and the
// wire). A proxied request posts its item.queued first (proxied.note).
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
	ar       *activeRun
	it       *job
	lastGood string // the item's key in the last-good index
}

func (b batchEnds) record(e auditd.Event) {
	buf := b.l.eventBuf()
	buf[0] = e
	b.l.post(b.ar, buf, 1, nil, nil)
}

func (b batchEnds) end(out auditd.Outcome, reason string, res *auditd.ItemResult, lastGood string, payload *staging.Payload) {
	b.l.endItem(b.ar, b.it, out, reason, res, lastGood, payload)
}

// fallBack serves the item from its last good staged payload, if one
// exists and still verifies: a copy staged by any run, this one or another
// still running, once the ledger holds it. cache.served and the item's
// result say which run fetched it, when, and how old it is.
func (b batchEnds) fallBack(reason string) bool {
	c, ok := b.l.lastGoodCopy(b.lastGood)
	if !ok {
		return false
	}
	b.l.endCached(b, b.it.Item, c, reason)
	return true
}

// failOrServe ends an item that could not be fetched: from the last good
// copy when there is one, as failed otherwise.
func (b batchEnds) failOrServe(reason string) {
	endUnanswered(b, reason, auditd.ItemFailed, reason)
}

// shed ends an item the gates could not admit before the run's deadline.
func (b batchEnds) shed(gate string) {
	endShed(b, b.it.Item, gate)
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
