package runs

import (
	"encoding/hex"
	"sync"

	"github.com/auditd/auditd"
)

// Live is a run the fetch loop is working on: its record, with counters
// that move as the run's events become durable, and how each finished item
// ended, kept until the run's end is stored in one transaction (Store.End).
// The ledger holds the same facts as they happen, so a restart rebuilds
// both from it. It is safe for concurrent use.
type Live struct {
	id string // never changes

	mu      sync.Mutex
	rec     record
	results map[string]*auditd.ItemResult // item key -> how it ended
	ended   chan struct{}                 // closed once the run's end is stored
	proxied *proxiedItems                 // a proxy-mode run's items, as they come (proxy.go); nil for a batch run
}

func newLive(rec *record) *Live {
	r := &Live{id: rec.ID, rec: *rec, ended: make(chan struct{}),
		results: make(map[string]*auditd.ItemResult, rec.ItemCount)}
	if rec.Mode == auditd.RunProxy {
		r.proxied = &proxiedItems{index: map[string]int{}}
		r.rec.ItemCount = 0 // counted again as the items are added
	}
	return r
}

// ID returns the run's id.
func (r *Live) ID() string { return r.id }

// Run returns the run's record as it is now.
func (r *Live) Run() auditd.Run {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Run
}

// Counts returns the run's counters as they are now.
func (r *Live) Counts() auditd.Counts {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rec.Counts.Clone()
}

// Ended is closed once the run's end is stored.
func (r *Live) Ended() <-chan struct{} { return r.ended }

// Started notes where the run starts in the ledger: at first, its
// run.started as stored.
func (r *Live) Started(first *auditd.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rec.FirstSeq = first.Seq
	r.rec.HeadAtStart = hex.EncodeToString(first.PrevHash[:])
}

// Count counts events of the run once they are durable. Events that
// different workers recorded become durable in an order of their own, so
// the run's LastSeq is the largest seen.
func (r *Live) Count(events ...auditd.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range events {
		r.rec.Counts.Count(&events[i])
		r.rec.LastSeq = max(r.rec.LastSeq, events[i].Seq)
	}
}

// Finished keeps how the item with key ended, once its item.finished is
// durable. (Its payload is the request's last good copy from then on: the
// ledger stored its last-good record with it, staging.Store.LastGoodRecord.)
func (r *Live) Finished(key string, res *auditd.ItemResult) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.results[key] = res
}

// result returns a copy of how an item of the run ended, if it has.
func (r *Live) result(key string) (*auditd.ItemResult, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	res, ok := r.results[key]
	if !ok {
		return nil, false
	}
	c := *res
	return &c, true
}

// record returns a copy of the run's record.
func (r *Live) record() record {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	rec.Counts = r.rec.Counts.Clone()
	return rec
}
