package auditd

import "time"

// Bounds of a Timeline. A range and bucket that would make more buckets
// are refused (EINVALID, field "bucket"); a run with so many sources that
// their buckets would make more points is refused too (field "source":
// name fewer sources, or use a larger bucket).
const (
	MaxTimelineBuckets = 10_000
	MaxTimelinePoints  = 100_000 // buckets times sources
)

// TimelineQuery selects what a Timeline adds up.
type TimelineQuery struct {
	// Bucket is the width of a bucket; buckets start at whole multiples of
	// it since the Unix epoch, so the same query gives the same buckets.
	Bucket time.Duration
	// From and To bound a source's timeline, [From, To); both are required
	// there. A run's timeline ignores them: it runs from the run's first
	// event to its run.finished (or its latest event while it runs).
	From, To time.Time
	// Sources keeps these sources of a run's timeline; empty keeps all.
	Sources []string
}

// Timeline is what a run's or a source's ledger events add up to per time
// bucket: how fast requests left against the limit in force, how they ended,
// the refusals and waits, and when the breaker was open. The reports package
// computes it from a fresh read of the ledger; the API serves it as JSON.
type Timeline struct {
	RunID    string `json:"run_id,omitempty"`
	SourceID string `json:"source_id,omitempty"`
	// From is the start of the first bucket and To the end of the last;
	// both are absent when nothing was recorded yet.
	From          time.Time `json:"from,omitzero"`
	To            time.Time `json:"to,omitzero"`
	Bucket        Duration  `json:"bucket"`
	BucketSeconds float64   `json:"bucket_seconds"`
	// Sources are sorted by id, each with one bucket per bucket of [From, To).
	Sources []SourceTimeline `json:"sources"`
}

// SourceTimeline is one source's share of a Timeline.
type SourceTimeline struct {
	SourceID     string           `json:"source"`
	Buckets      []TimelineBucket `json:"buckets"`
	BreakerSpans []BreakerSpan    `json:"breaker_spans"`
	// LimitChanges are the source's registry.changed events, in order: its
	// learned-limit history over the timeline.
	LimitChanges []LimitChange `json:"limit_changes"`
}

// TimelineBucket is one source's events in [Start, Start+Bucket).
type TimelineBucket struct {
	Start time.Time `json:"start"`
	// Dispatches are the requests sent in the bucket. The classes after it
	// count the same dispatches by how each ended, wherever its outcome
	// fell, so they add up to Dispatches; InFlight have no outcome by the
	// end of the timeline.
	Dispatches      int `json:"dispatches"`
	Status2xx       int `json:"status_2xx"`
	Status429       int `json:"status_429"`
	Status5xx       int `json:"status_5xx"`
	StatusOther     int `json:"status_other"`
	TransportErrors int `json:"transport_errors"`
	Interrupted     int `json:"interrupted"`
	InFlight        int `json:"in_flight"`
	// Throttles are the refusals (throttle events: 429, or 503 with
	// Retry-After) recorded in the bucket.
	Throttles   int `json:"throttles"`
	Shed        int `json:"shed"`
	CacheServed int `json:"cache_served"`
	// Waits are the waits that ended in the bucket, by the gate that held
	// them (rate, pause, concurrency, breaker, backoff).
	Waits map[string]WaitTotal `json:"waits,omitempty"`
	// Limit per Window is the limit in force at the end of the bucket, from
	// the source's registry.snapshot and registry.changed events; absent
	// when none of them says. LimitPerSecond is the same as a rate.
	Limit          int      `json:"limit,omitempty"`
	Window         Duration `json:"window,omitempty"`
	LimitPerSecond float64  `json:"limit_per_second,omitempty"`
}

// WaitTotal is how many waits ended and the seconds they actually spent.
type WaitTotal struct {
	Count   int     `json:"count"`
	Seconds float64 `json:"seconds"`
}

// BreakerSpan is a stretch of time a source's breaker was not closed.
type BreakerSpan struct {
	State string    `json:"state"` // open or half_open
	From  time.Time `json:"from"`
	// To is zero while the breaker is still in State at the end of the
	// timeline.
	To time.Time `json:"to,omitzero"`
	// Seq is the breaker event that began the span; zero when it began
	// before the timeline (From is then the timeline's start).
	Seq uint64 `json:"seq,omitempty"`
}

// LimitChange is one registry.changed event of a source.
type LimitChange struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	RunID     string    `json:"run_id,omitempty"`
	OldLimit  int       `json:"old_limit"`
	OldWindow Duration  `json:"old_window"`
	NewLimit  int       `json:"new_limit"`
	NewWindow Duration  `json:"new_window"`
	Cause     string    `json:"cause"` // what taught it: header, 429, probe_up, operator
}
