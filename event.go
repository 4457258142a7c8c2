package auditd

import (
	"context"
	"slices"
	"time"
)

// EventType names what an Event records. The string values are part of the
// ledger's canonical encoding and of the API; never rename one.
type EventType string

// Event types. DESIGN.md's event model; each type's comment says which of
// Event's type-specific fields it carries.
const (
	EventRunStarted       EventType = "run.started"          // Detail: JSON of the run's award and config hash
	EventRunResumed       EventType = "run.resumed"          // Reason (restart)
	EventRunFinished      EventType = "run.finished"         // Outcome: run status
	EventItemQueued       EventType = "item.queued"          // Method, Path
	EventDispatch         EventType = "dispatch"             // Method, Path (credentials stripped), Probe, Detail (its cost when above 1: CostDetail)
	EventWait             EventType = "wait"                 // Gate, Wait (planned), Actual
	EventResponse         EventType = "response"             // Status, Bytes, Latency, Outcome, BodyError
	EventThrottle         EventType = "throttle"             // Status, RetryAfterRaw, RetryAfter, Clamped, Backoff, Wait
	EventTransportError   EventType = "transport.error"      // ErrorText, Latency
	EventInterrupted      EventType = "dispatch.interrupted" // a dispatch with no outcome, found on resume, or never sent (Reason "not sent: ..."): Method, Path, Reason
	EventBreaker          EventType = "breaker"              // From, To, Failures, Threshold, Cooldown
	EventRegistryChanged  EventType = "registry.changed"     // OldLimit, NewLimit, OldWindow, NewWindow, Group, Cause (what taught it)
	EventRegistrySnapshot EventType = "registry.snapshot"    // NewLimit, NewWindow, Group, Snapshot
	EventShed             EventType = "shed"                 // Gate (that could not admit in time)
	EventCacheServed      EventType = "cache.served"         // PayloadHash of the copy served, Reason, Detail (CachedCopy: origin run, fetched at, age)
	EventPayloadStaged    EventType = "payload.staged"       // PayloadHash, Bytes
	EventItemFinished     EventType = "item.finished"        // Outcome, Attempts, Reason (when not succeeded), PayloadHash, Bytes, Detail (paged)
	EventAcknowledged     EventType = "item.acknowledged"    // the downstream pipeline loaded the item: Principal, PayloadHash
	EventExport           EventType = "export.downloaded"    // Principal, Detail (what), Head
	EventViewed           EventType = "report.viewed"        // a reconciliation read (the UI, CI), not downloaded: Principal, Detail (what), Head
	EventTokenChanged     EventType = "token.changed"        // Principal, Detail
	EventSourceChanged    EventType = "source.changed"       // Principal, Detail (JSON of the new configuration, secrets removed)
	// Fleet mode (auditd serve --fleet-etcd): what this node acted on of a
	// budget it shares through etcd. SourceID or Group names the key;
	// Detail is JSON with the node and the etcd revision of the grant or pause.
	EventFleetReserved EventType = "fleet.reserved" // Detail: node, revision, first, interval, count
	EventFleetPaused   EventType = "fleet.paused"   // Detail: node, revision (0: the fleet was not told), until
	EventFleetCutOff   EventType = "fleet.cut_off"  // Reason: why etcd did not answer; Detail: node
	EventFleetRejoined EventType = "fleet.rejoined" // Detail: node
	EventFleetLearned  EventType = "fleet.learned"  // Reason: what changed it (fleet.Cause*); Detail: node, revision, limit, window, by (the node that wrote it), refused, refused_window, refused_at
)

// EventTypes is every event type, in the order their constants are
// declared: what the API filters by and the contract lists.
var EventTypes = []EventType{
	EventRunStarted, EventRunResumed, EventRunFinished, EventItemQueued, EventDispatch, EventWait,
	EventResponse, EventThrottle, EventTransportError, EventInterrupted, EventBreaker,
	EventRegistryChanged, EventRegistrySnapshot, EventShed, EventCacheServed, EventPayloadStaged,
	EventItemFinished, EventAcknowledged, EventExport, EventViewed, EventTokenChanged, EventSourceChanged,
	EventFleetReserved, EventFleetPaused, EventFleetCutOff, EventFleetRejoined, EventFleetLearned,
	EventRetentionSet, EventHoldPlaced, EventHoldReleased, EventPayloadPurged,
}

// Known reports whether t is one of EventTypes.
func (t EventType) Known() bool { return slices.Contains(EventTypes, t) }

// Event is one immutable record in the ledger.
//
// The header fields (Seq to IdempotencyKey) are common to every type; the
// type-specific fields are zero when a type does not use them (see the
// EventType constants). Seq, Time, Mono, PrevHash and Hash are assigned by the
// ledger on append; whatever the caller put there is overwritten.
type Event struct {
	Seq            uint64        // global, contiguous, from 1
	Type           EventType     // what happened
	RunID          string        // run the event belongs to; empty for service-wide events
	SourceID       string        // upstream source, when there is one
	ItemKey        string        // item within the run
	Page           uint32        // page of a paged item, from 0; 0 for unpaged items
	Attempt        uint32        // 1 for the first dispatch of a request (item and page), 2 for its first retry, ...
	Time           time.Time     // UTC wall time, recorded, never used for pacing
	Mono           time.Duration // monotonic offset since the ledger was opened
	IdempotencyKey string        // appending a key twice returns the first event

	Method        string        // HTTP method of a dispatch
	Path          string        // path and query, credentials stripped
	Status        int           // HTTP status of a response or throttle
	Bytes         int64         // response or payload size
	Latency       time.Duration // dispatch to response
	Wait          time.Duration // planned wait
	Actual        time.Duration // wait actually spent
	Gate          string        // the gate a wait waited at, or that could not admit a shed request in time
	RetryAfterRaw string        // Retry-After exactly as the server sent it
	RetryAfter    time.Duration // parsed server hint, floored at zero
	Clamped       bool          // the hint was clamped to the source's cap
	Probe         bool          // a dispatch sent as a half-open breaker's probe
	Attempts      uint32        // the dispatches an item took, all its pages together
	Backoff       time.Duration // own jittered backoff chosen
	ErrorText     string        // a transport error, credentials removed
	From          string        // breaker state before
	To            string        // breaker state after
	Failures      int           // breaker failure count
	Threshold     int           // breaker threshold
	Cooldown      time.Duration // breaker cooldown
	OldLimit      int           // registry limit before a change
	NewLimit      int           // registry limit after a change (or in a snapshot)
	OldWindow     time.Duration
	NewWindow     time.Duration
	Group         string  // gateway group of the source
	Cause         string  // what taught the registry a change: header, throttle, slow_start, recover, probe_up, window_spent, outage, operator, config, concurrency, slots (429 in older ledgers)
	Snapshot      string  // when a registry snapshot was taken: run.start or run.end
	Outcome       Outcome // outcome of a response, item or run
	Reason        string  // why, in words: an item's end short of success, a copy served from cache, a run resumed, a dispatch interrupted
	BodyError     string  // error code found inside a 2xx body
	PayloadHash   string  // hex SHA-256 of a staged or served payload
	Head          string  // the ledger's head seq when an export was downloaded or a report viewed
	Principal     string  // who (token principal) for access-log events
	Detail        string  // free-form JSON for events that need more (run.started, snapshots)

	PrevHash [32]byte // hash of the event before (zero for the first)
	Hash     [32]byte // SHA-256(PrevHash || canonical encoding of this event)
}

// The ledger's canonical encoding and the API's event JSON predate the
// typed fields that say why an event happened and how many dispatches an
// item took. Both keep one "attempt" and one "cause" for every type:
// Attempt, or Attempts on item.finished; and the one of Gate, Probe
// ("probe"), ErrorText, Reason, Cause, Snapshot and Head that the type
// carries (Reason for a type not listed). Shared reads them, SetShared
// sets the typed fields back from them, and CheckShared refuses an event
// that sets a field its type does not carry, which they could not hold.

// probeCause is what a probe dispatch records as its cause.
const probeCause = "probe"

// causeField names the field that holds an event type's shared cause.
type causeField int

const (
	causeReason causeField = iota // the types not listed in causeOf
	causeGate
	causeProbe
	causeErrorText
	causeCause
	causeSnapshot
	causeHead
)

func causeOf(t EventType) causeField {
	switch t {
	case EventWait, EventShed:
		return causeGate
	case EventDispatch:
		return causeProbe
	case EventTransportError:
		return causeErrorText
	case EventRegistryChanged:
		return causeCause
	case EventRegistrySnapshot:
		return causeSnapshot
	case EventExport, EventViewed:
		return causeHead
	}
	return causeReason
}

// Access reports whether events of type t record who read or downloaded
// the records (export.downloaded, report.viewed). They are a population of
// their own: reading a run never changes what its reconciliation counts.
func (t EventType) Access() bool { return t == EventExport || t == EventViewed }

// Retention reports whether t records a retention change: a period set, a
// hold placed or released, a payload purged.
func (t EventType) Retention() bool {
	switch t {
	case EventRetentionSet, EventHoldPlaced, EventHoldReleased, EventPayloadPurged:
		return true
	}
	return false
}

// Shared returns e's attempt and cause as the canonical encoding and the
// API's event JSON hold them.
func (e *Event) Shared() (attempt uint32, cause string) {
	attempt = e.Attempt
	if e.Type == EventItemFinished {
		attempt = e.Attempts
	}
	switch causeOf(e.Type) {
	case causeGate:
		cause = e.Gate
	case causeProbe:
		if e.Probe {
			cause = probeCause
		}
	case causeErrorText:
		cause = e.ErrorText
	case causeCause:
		cause = e.Cause
	case causeSnapshot:
		cause = e.Snapshot
	case causeHead:
		cause = e.Head
	default:
		cause = e.Reason
	}
	return attempt, cause
}

// SetShared sets the typed fields of e's type from attempt and cause, as
// Shared returns them. It fails for a cause the type's field cannot hold:
// a dispatch's is "probe" or nothing.
func (e *Event) SetShared(attempt uint32, cause string) error {
	if e.Type == EventItemFinished {
		e.Attempts = attempt
	} else {
		e.Attempt = attempt
	}
	switch causeOf(e.Type) {
	case causeGate:
		e.Gate = cause
	case causeProbe:
		if cause != "" && cause != probeCause {
			return Errorf(EINVALID, "a dispatch's cause is %q or nothing, not %q", probeCause, cause)
		}
		e.Probe = cause == probeCause
	case causeErrorText:
		e.ErrorText = cause
	case causeCause:
		e.Cause = cause
	case causeSnapshot:
		e.Snapshot = cause
	case causeHead:
		e.Head = cause
	default:
		e.Reason = cause
	}
	return nil
}

// CheckShared returns an EINVALID error naming a typed field that e sets
// and its type does not carry.
func (e *Event) CheckShared() error {
	finished := e.Type == EventItemFinished
	c := causeOf(e.Type)
	for _, f := range [...]struct {
		name    string
		set     bool
		carried bool
	}{
		{"Attempt", e.Attempt != 0, !finished}, {"Attempts", e.Attempts != 0, finished},
		{"Gate", e.Gate != "", c == causeGate}, {"Probe", e.Probe, c == causeProbe},
		{"ErrorText", e.ErrorText != "", c == causeErrorText}, {"Cause", e.Cause != "", c == causeCause},
		{"Snapshot", e.Snapshot != "", c == causeSnapshot}, {"Head", e.Head != "", c == causeHead},
		{"Reason", e.Reason != "", c == causeReason},
	} {
		if f.set && !f.carried {
			return Errorf(EINVALID, "a %s event carries no %s", e.Type, f.name)
		}
	}
	return nil
}

// Appender is what producers of events need from the ledger. Append returns
// only once the event is durable, with Seq, Time and hashes filled in.
type Appender interface {
	Append(ctx context.Context, e Event) (Event, error)
}

// EventReader streams stored events in sequence order without holding a
// whole run in memory. fn must not keep the pointer it is given past its
// return; a non-nil error from fn stops the scan and is returned.
type EventReader interface {
	// ScanRun visits the events of one run with Seq > after.
	ScanRun(runID string, after uint64, fn func(*Event) error) error
	// Scan visits events with from <= Seq <= to (to == 0 means the head).
	Scan(from, to uint64, fn func(*Event) error) error
}

// Future is events a ledger has queued to store but may not have made
// durable yet. Call one of its methods, once.
type Future interface {
	// Wait waits until the events are durable, or ctx ends first (they may
	// then still be recorded). A nil error leaves the events as stored.
	Wait(ctx context.Context) error
	// Then hands fn the events as stored, or the error that kept them
	// out, once that is decided, without waiting for it.
	Then(fn func(stored []Event, err error))
}

// Put is a key and value a package keeps in a bucket of its own in the
// bbolt file, which the ledger writes in the transaction that stores the
// events describing it: a small staged payload lands with its
// payload.staged, never before or without it.
type Put struct {
	Bucket, Key, Value []byte
}
