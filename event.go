package auditd

import (
	"context"
	"time"
)

// EventType names what an Event records. The string values are part of the
// ledger's canonical encoding and of the API; never rename one.
type EventType string

// Event types. DESIGN.md's event model; each type's comment says which of
// Event's type-specific fields it carries.
const (
	EventRunStarted       EventType = "run.started"          // Detail: JSON of the run's award and config hash
	EventRunResumed       EventType = "run.resumed"          // Cause: why (restart)
	EventRunFinished      EventType = "run.finished"         // Outcome: run status
	EventItemQueued       EventType = "item.queued"          // Method, Path
	EventDispatch         EventType = "dispatch"             // Method, Path (credentials stripped)
	EventWait             EventType = "wait"                 // Cause (gate), Wait (planned), Actual
	EventResponse         EventType = "response"             // Status, Bytes, Latency, Outcome, BodyError
	EventThrottle         EventType = "throttle"             // Status, RetryAfterRaw, RetryAfter, Clamped, Backoff, Wait
	EventTransportError   EventType = "transport.error"      // Cause (error text), Latency
	EventInterrupted      EventType = "dispatch.interrupted" // a dispatch with no outcome, found on resume
	EventBreaker          EventType = "breaker"              // From, To, Failures, Threshold, Cooldown
	EventRegistryChanged  EventType = "registry.changed"     // OldLimit, NewLimit, OldWindow, NewWindow, Cause (what taught it)
	EventRegistrySnapshot EventType = "registry.snapshot"    // NewLimit, NewWindow, Group, Cause ("run.start" or "run.end")
	EventShed             EventType = "shed"                 // Cause (gate that could not admit in time)
	EventCacheServed      EventType = "cache.served"         // PayloadHash of the copy served
	EventPayloadStaged    EventType = "payload.staged"       // PayloadHash, Bytes
	EventItemFinished     EventType = "item.finished"        // Outcome, Cause (reason when failed)
	EventAcknowledged     EventType = "item.acknowledged"    // the downstream pipeline loaded the item
	EventExport           EventType = "export.downloaded"    // Principal, Detail (what), Cause (ledger head at that time)
	EventTokenChanged     EventType = "token.changed"        // Principal, Detail
	EventSourceChanged    EventType = "source.changed"       // Principal, Detail (JSON of the new configuration, secrets removed)
)

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
	RetryAfterRaw string        // Retry-After exactly as the server sent it
	RetryAfter    time.Duration // parsed server hint, floored at zero
	Clamped       bool          // the hint was clamped to the source's cap
	Backoff       time.Duration // own jittered backoff chosen
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
	Outcome       Outcome // outcome of a response, item or run
	BodyError     string  // error code found inside a 2xx body
	PayloadHash   string  // hex SHA-256 of a staged or served payload
	Cause         string  // why: the gate, what taught the registry, an error message
	Principal     string  // who (token principal) for access-log events
	Detail        string  // free-form JSON for events that need more (run.started, snapshots)

	PrevHash [32]byte // hash of the event before (zero for the first)
	Hash     [32]byte // SHA-256(PrevHash || canonical encoding of this event)
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
