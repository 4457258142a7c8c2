package runs

import (
	"encoding/hex"
	"sync"

	"github.com/auditd/auditd"
)

// Live is a run the fetch loop is working on: its record, with counters
// that move as the run's events become durable. Its items and their
// results are in the store as they come and end (pages.go); what the live
// run keeps besides its record is bounded by the requests in flight. The
// ledger holds the same facts as they happen, so a restart rebuilds the
// counters from it. It is safe for concurrent use.
type Live struct {
	id    string // never changes
	store *Store
	// legacy is true for a run an earlier build stored, which kept its
	// items' results (and a proxy run its items) in memory until its end:
	// a resume rebuilds them from the ledger (Rebuilt, RestoreItem).
	legacy bool

	// adding serialises the pages added to an open batch run.
	adding sync.Mutex

	mu      sync.Mutex
	rec     record
	ended   chan struct{} // closed once the run's end is stored
	proxied *proxiedItems // a proxy-mode run's items not yet stored (proxy.go); nil for a batch run
	rebuilt []result      // results a resume rebuilt that the store lacked: Start stores them
}

func (s *Store) newLive(rec *record) *Live {
	r := &Live{id: rec.ID, store: s, rec: *rec, ended: make(chan struct{})}
	if rec.Mode == auditd.RunProxy {
		r.proxied = &proxiedItems{pending: map[string]pendingItem{}}
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
// the run's LastSeq is the largest seen. A proxied request's item is
// stored with its item.queued, and no longer kept here.
func (r *Live) Count(events ...auditd.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range events {
		r.rec.Counts.Count(&events[i])
		r.rec.LastSeq = max(r.rec.LastSeq, events[i].Seq)
		if r.proxied != nil && events[i].Type == auditd.EventItemQueued {
			delete(r.proxied.pending, events[i].ItemKey)
		}
	}
}

// ResultPut is what stores how the item with key ended (the package's
// ResultPut), for the ledger's commit of its item.finished.
func (r *Live) ResultPut(key string, res *auditd.ItemResult) auditd.Put {
	return ResultPut(r.id, key, res)
}

// Rebuilt keeps how the item with key ended, as a resume rebuilt it from
// its item.finished, when the store lacks it (a run an earlier build
// kept its results of in memory): Start stores it. (It reads nothing from
// the store: the resume calls it while it reads the ledger.)
func (r *Live) Rebuilt(key string, res *auditd.ItemResult) {
	if !r.legacy {
		return // stored with its item.finished
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.rebuilt = append(r.rebuilt, result{key, res})
}

// Rebuilds reports whether a resume rebuilds the run's items' results (and
// a proxy-mode run's items) from the ledger: a run an earlier build stored,
// which kept them in memory until its end. Any other run has them stored.
func (r *Live) Rebuilds() bool { return r.legacy }

// record returns a copy of the run's record.
func (r *Live) record() record {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec := r.rec
	rec.Counts = r.rec.Counts.Clone()
	return rec
}
