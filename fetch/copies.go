package fetch

import (
	"errors"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/staging"
)

// copies are the last good copies the loop answers from when a request
// cannot be fetched: a staged payload per request (its key in the
// last-good index, staging.RequestKey), usable by every run once the
// ledger holds its item.finished.
type copies struct {
	staging *staging.Store
	ledger  Ledger
	clock   clock.Clock
}

// hasCopy reports whether the last-good index holds a copy of the request
// key names; whether it still verifies is checked when it is served.
func (cs *copies) hasCopy(key string) bool {
	_, ok, err := cs.staging.LastGood(key)
	return ok && err == nil
}

// lastGoodCopy returns the last good copy the index holds under key, if
// it still verifies against its hash.
func (cs *copies) lastGoodCopy(key string) (staging.Copy, bool) {
	c, ok, err := cs.staging.LastGood(key)
	if err != nil || !ok || cs.staging.VerifyPayload(c.Sum) != nil {
		return staging.Copy{}, false
	}
	return c, true
}

// cachedCopy describes c, the copy an item is answered from, fetched by
// run origin: that run, when it fetched the copy, and the copy's age now.
func (cs *copies) cachedCopy(c staging.Copy, origin string) *auditd.CachedCopy {
	return &auditd.CachedCopy{OriginRun: origin, FetchedAt: c.FetchedAt, Age: auditd.Duration(max(0, cs.clock.Now().Sub(c.FetchedAt)))}
}

// endCached ends item it from c, its last good copy: cache.served, then
// the item's end, cached, both saying which run fetched the copy (looked
// up in the ledger for a copy indexed before the index kept runs), when,
// and how old it is. It returns that description.
func (cs *copies) endCached(to itemEnds, it *auditd.Item, c staging.Copy, reason string) *auditd.CachedCopy {
	origin := c.Run
	if origin == "" {
		origin = cs.originRun(c.Sum, c.FetchedAt)
	}
	cp := cs.cachedCopy(c, origin)
	to.record(auditd.Event{Type: auditd.EventCacheServed, SourceID: it.SourceID, ItemKey: it.Key,
		PayloadHash: c.Sum, Reason: reason, Detail: cp.CacheDetail()})
	to.end(auditd.ItemCached, reason, &auditd.ItemResult{PayloadHash: c.Sum, Advertised: -1, Cached: cp}, "", nil)
	return cp
}

// originRun finds the run that fetched the payload sum whose item finished
// at at, from the ledger: the last-good index keeps the time, and the
// item.finished is among the first events recorded from then on.
func (cs *copies) originRun(sum string, at time.Time) string {
	from, err := cs.ledger.SeqAt(at.Add(-time.Second))
	if err != nil || from == 0 {
		return ""
	}
	run := ""
	_ = cs.ledger.Scan(from, from+20_000, func(e *auditd.Event) error {
		if e.Type == auditd.EventItemFinished && e.PayloadHash == sum && e.Time.Sub(at).Abs() < time.Millisecond {
			run = e.RunID
			return errFound
		}
		if e.Time.After(at.Add(time.Second)) {
			return errFound
		}
		return nil
	})
	return run
}

// errFound ends a scan that found what it looked for.
var errFound = errors.New("found")
