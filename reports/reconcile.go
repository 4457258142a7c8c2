package reports

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/auditd/auditd"
)

// DefaultMaxOffending is how many offending sequence numbers a failed check
// lists; enough to start an investigation, small enough for a CI log.
const DefaultMaxOffending = 10

// ErrRunNotFound means the ledger holds no event for the run.
var ErrRunNotFound = errors.New("run not found in ledger")

// Status is the verdict of one check.
type Status string

// Check verdicts.
const (
	StatusPass Status = "pass"
	StatusFail Status = "fail"
	StatusNA   Status = "n/a" // the check does not apply; Note says why
)

// Check identifiers, in report order.
const (
	R1  = "R1"
	R2  = "R2"
	R3  = "R3"
	R4  = "R4"
	R5  = "R5"
	R6  = "R6"
	R7  = "R7"
	R8  = "R8"
	R9  = "R9"
	R10 = "R10"
)

// checkIDs orders the checks; index i holds check R(i+1).
var checkIDs = [numChecks]string{R1, R2, R3, R4, R5, R6, R7, R8, R9, R10}

const numChecks = 10

// checkDescriptions are the identities as docs/RECONCILIATION.md words
// them, with what expected and actual count, so a reader of a failure knows
// what differs.
var checkDescriptions = [numChecks]string{
	"items queued (expected) = succeeded + served from cache + failed + shed + pending (actual)",
	"dispatches (expected) = 2xx + 429 + 5xx + other + transport errors + interrupted (+ in flight while the run is open) (actual)",
	"dispatches (expected) = first attempts + retries that follow a non-final outcome of the same request, attempts numbered 1..n (actual)",
	"throttles (expected) = throttles honoured: a pause wait before the request's next dispatch, and no dispatch to the source or group inside the pause (actual)",
	"dispatches and breaker transitions (expected) = those the breaker allowed: none while open, only probes while half-open, legal transitions only (actual)",
	"succeeded items (expected) = staged payloads whose hash verifies (actual)",
	"live counters compared (expected) = live counters equal to the recount from raw events (actual)",
	"events in the run's ledger range (expected) = events with contiguous sequence numbers whose hash chain verifies (actual)",
	"dispatches (expected) = dispatches within the limit in force (plus configured burst) in their sliding window, and, where a dispatch cost more than 1, within the configured ceiling in records (actual)",
	"items delivered, succeeded or cached (expected) = items acknowledged by the pipeline (actual)",
}

// Check is one identity's verdict in one scope (a source, or the run).
type Check struct {
	ID string `json:"id"`
	// Scope is "total" or a source id.
	Scope       string `json:"scope"`
	Description string `json:"description"`
	Status      Status `json:"status"`
	// Pass is false only when Status is fail: a check that does not apply
	// does not fail, and says so in Status and Note. Balanced is the AND of
	// every Pass.
	Pass     bool  `json:"pass"`
	Expected int64 `json:"expected"`
	Actual   int64 `json:"actual"`
	// Difference is Actual - Expected.
	Difference int64 `json:"difference"`
	// Offending holds the first sequence numbers of events that break the
	// identity, ascending; empty unless Status is fail.
	Offending []uint64 `json:"offending,omitempty"`
	Note      string   `json:"note,omitempty"`
}

// LedgerCounts are what a scope's events in the ledger add up to, recounted by
// reconciliation; auditd.Counts are the live counters the fetch loop keeps,
// which R7 compares with them.
type LedgerCounts struct {
	Events          int64 `json:"events"`
	Queued          int64 `json:"queued"`
	Succeeded       int64 `json:"succeeded"`
	Cached          int64 `json:"cached"`
	Failed          int64 `json:"failed"`
	Shed            int64 `json:"shed"`
	Pending         int64 `json:"pending"`
	Dispatches      int64 `json:"dispatches"`
	FirstAttempts   int64 `json:"first_attempts"`
	Retries         int64 `json:"retries"`
	Status2xx       int64 `json:"status_2xx"`
	Status429       int64 `json:"status_429"`
	Status5xx       int64 `json:"status_5xx"`
	StatusOther     int64 `json:"status_other"`
	TransportErrors int64 `json:"transport_errors"`
	Interrupted     int64 `json:"interrupted"`
	InFlight        int64 `json:"in_flight"`
	Throttles       int64 `json:"throttles"`
	Waits           int64 `json:"waits"`
	Breaker         int64 `json:"breaker_transitions"`
	BreakerOpens    int64 `json:"breaker_opens"`
	Registry        int64 `json:"registry_events"`
	Staged          int64 `json:"staged"`
	CacheServed     int64 `json:"cache_served"`
	Acknowledged    int64 `json:"acknowledged"`
}

func (c *LedgerCounts) add(o LedgerCounts) {
	c.Events += o.Events
	c.Queued += o.Queued
	c.Succeeded += o.Succeeded
	c.Cached += o.Cached
	c.Failed += o.Failed
	c.Shed += o.Shed
	c.Pending += o.Pending
	c.Dispatches += o.Dispatches
	c.FirstAttempts += o.FirstAttempts
	c.Retries += o.Retries
	c.Status2xx += o.Status2xx
	c.Status429 += o.Status429
	c.Status5xx += o.Status5xx
	c.StatusOther += o.StatusOther
	c.TransportErrors += o.TransportErrors
	c.Interrupted += o.Interrupted
	c.InFlight += o.InFlight
	c.Throttles += o.Throttles
	c.Waits += o.Waits
	c.Breaker += o.Breaker
	c.BreakerOpens += o.BreakerOpens
	c.Registry += o.Registry
	c.Staged += o.Staged
	c.CacheServed += o.CacheServed
	c.Acknowledged += o.Acknowledged
}

// LiveCounters are a run's counters as kept while it ran (auditd.Counts),
// in total and, when they were kept so, per source: what R7 compares with
// the recount.
type LiveCounters struct {
	Total   auditd.Counts            `json:"total"`
	Sources map[string]auditd.Counts `json:"sources,omitempty"`
}

// ControlEvidence is R9's evidence for one source: the busiest sliding
// window seen against the bound in force at that moment: the limit in
// force in requests, or, for a source whose dispatches cost more than 1,
// whichever came closer of that and its configured ceiling in records
// (reports/records.go).
type ControlEvidence struct {
	SourceID string `json:"source"`
	// Peak is the most units (Unit) in one window, at the dispatch
	// PeakSeq, taken where the margin to the allowance was smallest.
	Peak int64 `json:"peak"`
	// Unit is what Peak, Limit and Burst count: UnitRequests or
	// UnitRecords (the costs the window's dispatches were charged).
	Unit string `json:"unit"`
	// Requests is how many dispatches the window held.
	Requests int64         `json:"requests"`
	PeakSeq  uint64        `json:"peak_seq,omitempty"`
	PeakAt   time.Time     `json:"peak_at,omitzero"`
	Limit    int           `json:"limit"`
	Burst    int           `json:"burst"`
	Window   time.Duration `json:"window_ns"`
	Within   bool          `json:"within"`
}

// RunSummary identifies the run and its place in the ledger.
type RunSummary struct {
	ID          string       `json:"id"`
	Name        string       `json:"name,omitempty"`
	Award       auditd.Award `json:"award"`
	InitiatedBy string       `json:"initiated_by,omitempty"`
	ConfigHash  string       `json:"config_hash,omitempty"`
	CodeVersion string       `json:"code_version,omitempty"`
	Status      string       `json:"status"`
	StartedAt   time.Time    `json:"started_at,omitzero"`
	FinishedAt  time.Time    `json:"finished_at,omitzero"`
	FirstSeq    uint64       `json:"first_seq"`
	LastSeq     uint64       `json:"last_seq"`
	HeadAtStart string       `json:"head_at_start"`
	HeadAtEnd   string       `json:"head_at_end"`
}

// SourceReport is the reconciliation of one source of a run.
type SourceReport struct {
	SourceID string       `json:"source"`
	Balanced bool         `json:"balanced"`
	Counts   LedgerCounts `json:"counts"`
	Checks   []Check      `json:"checks"`
}

// Report is the reconciliation of one run: the JSON that CI reads, on the
// API and offline alike.
type Report struct {
	// RunID repeats Run.ID where the API contract puts it.
	RunID    string       `json:"run_id"`
	Run      RunSummary   `json:"run"`
	Balanced bool         `json:"balanced"`
	Counts   LedgerCounts `json:"counts"`
	Checks   []Check      `json:"checks"`
	// Sources are sorted by id. Run-level events (run.started, ...) carry no
	// source and count only in the totals.
	Sources []SourceReport    `json:"sources"`
	Control []ControlEvidence `json:"control"`
	// Cached are the items served from a last good copy, in the order
	// they were served: which run fetched each copy, when, and how old it
	// was. A CI job holds them to a bound of its own (auditd reconcile
	// --max-stale).
	Cached []CachedItem `json:"cached,omitempty"`
}

// CachedItem is an item served from a last good copy, as its cache.served
// records it.
type CachedItem struct {
	Seq         uint64    `json:"seq"` // of its cache.served
	SourceID    string    `json:"source"`
	ItemKey     string    `json:"item"`
	ServedAt    time.Time `json:"served_at"`
	PayloadHash string    `json:"payload_hash"`
	Reason      string    `json:"reason,omitempty"` // why the item fell back on it
	// OriginRun, FetchedAt and Age say which run fetched the copy, when,
	// and how old it was when served. A cache.served recorded before it
	// carried them has none: FetchedAt is zero and the age is unknown.
	OriginRun string          `json:"origin_run,omitempty"`
	FetchedAt time.Time       `json:"fetched_at,omitzero"`
	Age       auditd.Duration `json:"age,omitempty"`
}

// AgeKnown reports whether the copy's age was recorded.
func (c *CachedItem) AgeKnown() bool { return !c.FetchedAt.IsZero() }

// Failed returns the ids of the checks that failed in total.
func (r *Report) Failed() []string {
	var ids []string
	for _, c := range r.Checks {
		if c.Status == StatusFail {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// PayloadVerifier is what R6 needs from the payload store: a nil error when
// the staged bytes hash to hash.
type PayloadVerifier interface {
	VerifyPayload(hash string) error
}

// HashFunc recomputes an event's hash from the previous hash and the event,
// with the ledger's canonical encoding. Reconcile calls it from one
// goroutine at a time; a Reconciler shared by concurrent callers needs a
// HashFunc that is safe for concurrent use.
type HashFunc func(prev [32]byte, e *auditd.Event) [32]byte

// Reconciler recounts runs from the ledger.
type Reconciler struct {
	// Events is the ledger read afresh for every reconciliation.
	Events auditd.EventReader

	// Hash recomputes event hashes for R8. Nil checks sequence numbers and
	// links only, and R8's note says so.
	Hash HashFunc

	// Payloads verifies staged payload hashes for R6. Nil counts payloads
	// only, and R6's note says so.
	Payloads PayloadVerifier

	// Bursts is the configured burst per source, allowed on top of the limit
	// in R9. Missing sources have no burst.
	Bursts map[string]int

	// MaxOffending caps the offending sequence numbers listed per check.
	// Defaults to DefaultMaxOffending.
	MaxOffending int
}

// NewReconciler returns a Reconciler reading events from r.
func NewReconciler(r auditd.EventReader) *Reconciler {
	return &Reconciler{Events: r, MaxOffending: DefaultMaxOffending}
}

// Reconcile recounts run runID. live are the counters kept while the run
// ran; nil makes R7 n/a.
//
// It reads the ledger once, in sequence order, over the range from the
// run's first event to its last (found through the run index): the run's
// own events feed the recount, and every event of the range feeds R8.
func (r *Reconciler) Reconcile(ctx context.Context, runID string, live *LiveCounters) (*Report, error) {
	first, last, err := runRange(r.Events, runID)
	if err != nil {
		return nil, fmt.Errorf("find run %s: %w", runID, err)
	} else if first == 0 {
		return nil, ErrRunNotFound
	}
	return r.reconcileRange(ctx, runID, first, last, live)
}

// reconcileRange is Reconcile over a range already found, so that an export
// reconciles exactly the events it writes.
func (r *Reconciler) reconcileRange(ctx context.Context, runID string, first, last uint64, live *LiveCounters) (*Report, error) {
	rc := r.newRecount(runID)
	rc.chain = &chainCheck{runID: runID, first: first, hash: r.Hash}
	next := first
	if next > 1 {
		next-- // the event before the run anchors its chain
	}
	var n int64
	for next <= last {
		err := r.Events.Scan(next, last, func(e *auditd.Event) error {
			if n++; n%ctxEvery == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if e.Seq > last {
				return errStop
			}
			rc.chain.observe(rc, e)
			if e.RunID == runID && e.Seq >= first {
				rc.observe(e)
			}
			next = e.Seq + 1
			if len(rc.pending) == pendingBatch {
				return errPause
			}
			return nil
		})
		if errors.Is(err, errPause) {
			rc.verifyPayloads() // outside the scan's read transaction
			continue
		}
		if err != nil && !errors.Is(err, errStop) {
			return nil, fmt.Errorf("scan run %s: %w", runID, err)
		}
		break
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rc.chain.settle(rc, last)
	rc.verifyPayloads()
	return rc.report(live), nil
}
