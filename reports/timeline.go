package reports

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
)

// TimeReader is what a timeline reads: events in sequence order, and where
// the events of a moment begin. *ledger.Ledger and *ledger.Reader are one.
type TimeReader interface {
	auditd.EventReader
	// SeqAt returns the sequence number of the first event recorded at or
	// after t, or one past the head when there is none.
	SeqAt(t time.Time) (uint64, error)
}

// Timelines adds up a run's or a source's ledger events per time bucket
// (auditd.Timeline), from a fresh read of the ledger each time.
type Timelines struct {
	Events TimeReader
}

// NewTimelines returns Timelines reading r.
func NewTimelines(r TimeReader) *Timelines { return &Timelines{Events: r} }

// RunTimeline adds up run runID's events from its first to its
// run.finished (or its latest, while it runs); events after its end
// (acknowledgements, downloads) are not part of it. q.Sources keeps those
// sources. A run with no event yet has an empty timeline.
func (t *Timelines) RunTimeline(ctx context.Context, runID string, q auditd.TimelineQuery) (*auditd.Timeline, error) {
	if q.Bucket <= 0 {
		return nil, bucketError("bucket must be positive")
	}
	first, last, err := runRange(t.Events, runID)
	if err != nil {
		return nil, fmt.Errorf("find run %s: %w", runID, err)
	}
	a := newTimelineAgg(q.Bucket, q.Sources...)
	a.tl.RunID = runID
	if first == 0 {
		return a.finish(), nil
	}
	var n int64
	err = t.Events.Scan(first, last, func(e *auditd.Event) error {
		if n++; n%ctxEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		if e.Seq > last {
			return errStop
		}
		if e.RunID != runID {
			return nil
		}
		if !a.started {
			a.begin(alignDown(e.Time, q.Bucket), 0)
		}
		if err := a.observe(e); err != nil {
			return err
		}
		if e.Type == auditd.EventRunFinished {
			return errStop
		}
		return nil
	})
	if err != nil && !errors.Is(err, errStop) {
		return nil, fmt.Errorf("timeline of run %s: %w", runID, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return a.finish(), nil
}

// SourceTimeline adds up source sourceID's events, of any run or none, in
// [q.From, q.To), widened to whole buckets.
func (t *Timelines) SourceTimeline(ctx context.Context, sourceID string, q auditd.TimelineQuery) (*auditd.Timeline, error) {
	if q.Bucket <= 0 {
		return nil, bucketError("bucket must be positive")
	}
	if q.From.IsZero() || q.To.IsZero() || !q.From.Before(q.To) {
		return nil, &auditd.Error{Code: auditd.EINVALID, Field: "from", Message: "A source's timeline needs from before to."}
	}
	from, to := alignDown(q.From, q.Bucket), alignDown(q.To.Add(q.Bucket-1), q.Bucket)
	buckets := to.Sub(from) / q.Bucket
	if buckets > auditd.MaxTimelineBuckets {
		return nil, bucketError("from %s to %s in buckets of %s is %d buckets, more than %d; use a bucket of at least %s",
			from.Format(time.RFC3339), to.Format(time.RFC3339), q.Bucket, buckets, auditd.MaxTimelineBuckets, minBucket(to.Sub(from)))
	}
	a := newTimelineAgg(q.Bucket, sourceID)
	a.tl.SourceID = sourceID
	a.keyRuns = true
	a.begin(from, int(buckets))
	lo, err := t.Events.SeqAt(from)
	if err != nil {
		return nil, fmt.Errorf("find events at %s: %w", from, err)
	}
	hi, err := t.Events.SeqAt(to)
	if err != nil {
		return nil, fmt.Errorf("find events at %s: %w", to, err)
	}
	if hi > lo {
		var n int64
		err = t.Events.Scan(lo, hi-1, func(e *auditd.Event) error {
			if n++; n%ctxEvery == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if e.Seq >= hi {
				return errStop
			}
			return a.observe(e)
		})
		if err != nil && !errors.Is(err, errStop) {
			return nil, fmt.Errorf("timeline of source %s: %w", sourceID, err)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
	}
	return a.finish(), nil
}

// minBucket is the narrowest bucket of whole seconds (whole milliseconds
// under a second) that covers span in at most auditd.MaxTimelineBuckets.
func minBucket(span time.Duration) time.Duration {
	b := (span + auditd.MaxTimelineBuckets - 1) / auditd.MaxTimelineBuckets
	unit := time.Millisecond
	if b > time.Second {
		unit = time.Second
	}
	return max(unit, (b+unit-1)/unit*unit)
}

func bucketError(format string, args ...any) error {
	return &auditd.Error{Code: auditd.EINVALID, Field: "bucket", Message: fmt.Sprintf(format, args...)}
}

// alignDown returns the start of the bucket holding t: a whole multiple of
// bucket since the Unix epoch.
func alignDown(t time.Time, bucket time.Duration) time.Time {
	ns := t.UnixNano()
	off := ns % int64(bucket)
	if off < 0 {
		off += int64(bucket)
	}
	return time.Unix(0, ns-off).UTC()
}

// timelineAgg is one pass of a timeline over events in sequence order.
type timelineAgg struct {
	tl      auditd.Timeline
	bucket  time.Duration
	only    map[string]bool // keep these sources only; nil keeps all
	kept    int             // sources kept so far
	start   time.Time
	n       int  // buckets so far
	fixed   bool // n is the range's, not grown by the events
	started bool
	keyRuns bool // dispatches of several runs: key them by run too

	sources map[string]*sourceAgg
	last    *sourceAgg // the source of the previous event, looked up once
	open    map[dispatchKey]openDispatch
}

// dispatchKey names a request (run, item, page) whose dispatch awaits its
// outcome.
type dispatchKey struct {
	run, item string
	page      uint32
}

type openDispatch struct {
	src     *sourceAgg
	bucket  int
	attempt uint32
}

// sourceAgg is one source's part of a timeline.
type sourceAgg struct {
	id      string
	buckets []auditd.TimelineBucket
	limits  []limitAt // registry events in order: what was in force when
	before  limitAt   // in force before the first of them, if known
	spans   []auditd.BreakerSpan
	changes []auditd.LimitChange
	breaker bool // a breaker event was seen
	skip    bool // not one of the sources asked for
}

type limitAt struct {
	bucket int
	limit  int
	window time.Duration
}

func newTimelineAgg(bucket time.Duration, only ...string) *timelineAgg {
	a := &timelineAgg{
		tl:      auditd.Timeline{Bucket: auditd.Duration(bucket), BucketSeconds: bucket.Seconds(), Sources: []auditd.SourceTimeline{}},
		bucket:  bucket,
		sources: map[string]*sourceAgg{},
		open:    map[dispatchKey]openDispatch{},
	}
	if len(only) > 0 {
		a.only = make(map[string]bool, len(only))
		for _, id := range only {
			a.only[id] = true
		}
	}
	return a
}

// begin sets the start of the first bucket and, for a fixed range, the
// number of buckets.
func (a *timelineAgg) begin(start time.Time, buckets int) {
	a.start, a.started = start, true
	if buckets > 0 {
		a.n, a.fixed = buckets, true
	}
}

// source returns the part of source id, creating it; a source that is not
// asked for is kept as skipped, so that its events are passed over fast.
func (a *timelineAgg) source(id string) (*sourceAgg, error) {
	if a.last != nil && a.last.id == id {
		return a.last, nil
	}
	s := a.sources[id]
	if s == nil {
		s = &sourceAgg{id: strings.Clone(id), skip: a.only != nil && !a.only[id]}
		if !s.skip {
			if a.kept++; a.kept*max(a.n, 1) > auditd.MaxTimelinePoints {
				return nil, a.pointsError()
			}
		}
		a.sources[s.id] = s
	}
	a.last = s
	return s, nil
}

func (a *timelineAgg) pointsError() error {
	return &auditd.Error{Code: auditd.EINVALID, Field: "source", Message: fmt.Sprintf(
		"%d sources in buckets of %s make more than %d points; name the sources to chart with source=, or use a larger bucket",
		a.kept, a.bucket, auditd.MaxTimelinePoints)}
}

// index returns the bucket of t, growing the timeline to it unless its
// range is fixed; ok is false for a time outside a fixed range.
func (a *timelineAgg) index(t time.Time) (i int, ok bool, err error) {
	i = int(max(0, t.Sub(a.start)) / a.bucket)
	switch {
	case i < a.n:
		return i, true, nil
	case a.fixed:
		return 0, false, nil
	case i >= auditd.MaxTimelineBuckets:
		return 0, false, bucketError("the run spans more than %d buckets of %s; use a larger bucket", auditd.MaxTimelineBuckets, a.bucket)
	case (i+1)*a.kept > auditd.MaxTimelinePoints:
		return 0, false, a.pointsError()
	}
	a.n = i + 1
	return i, true, nil
}

func (s *sourceAgg) at(i int) *auditd.TimelineBucket {
	if i >= len(s.buckets) {
		s.buckets = slices.Grow(s.buckets, i+1-len(s.buckets))[:i+1]
	}
	return &s.buckets[i]
}

// observe adds one event.
func (a *timelineAgg) observe(e *auditd.Event) error {
	switch e.Type {
	case auditd.EventDispatch, auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError,
		auditd.EventInterrupted, auditd.EventWait, auditd.EventShed, auditd.EventCacheServed,
		auditd.EventBreaker, auditd.EventRegistryChanged, auditd.EventRegistrySnapshot:
	default:
		return nil
	}
	if e.SourceID == "" {
		return nil
	}
	s, err := a.source(e.SourceID)
	if err != nil || s.skip {
		return err
	}
	i, ok, err := a.index(e.Time)
	if err != nil || !ok {
		return err
	}
	key := dispatchKey{item: e.ItemKey, page: e.Page}
	if a.keyRuns {
		key.run = e.RunID
	}
	switch e.Type {
	case auditd.EventDispatch:
		s.at(i).Dispatches++
		key.item, key.run = strings.Clone(key.item), strings.Clone(key.run)
		a.open[key] = openDispatch{src: s, bucket: i, attempt: e.Attempt}
	case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
		if e.Type == auditd.EventThrottle {
			s.at(i).Throttles++
		}
		d, ok := a.open[key]
		if !ok || d.attempt != e.Attempt {
			return nil // its dispatch is outside the timeline
		}
		delete(a.open, key)
		classify(d.src.at(d.bucket), e)
	case auditd.EventWait:
		b := s.at(i)
		if b.Waits == nil {
			b.Waits = map[string]auditd.WaitTotal{}
		}
		// The map keeps the key it is given on every assignment, and the
		// event's strings may be reused: the key must be a string of its own.
		cause := gate(e.Gate)
		w := b.Waits[cause]
		w.Count++
		w.Seconds += e.Actual.Seconds()
		b.Waits[cause] = w
	case auditd.EventShed:
		s.at(i).Shed++
	case auditd.EventCacheServed:
		s.at(i).CacheServed++
	case auditd.EventBreaker:
		a.breaker(s, e)
	case auditd.EventRegistryChanged, auditd.EventRegistrySnapshot:
		if len(s.limits) == 0 {
			// The registry records every change, so what the first change
			// changed from, or what the first snapshot found, was in force
			// since before the timeline.
			s.before = limitAt{limit: e.NewLimit, window: e.NewWindow}
			if e.Type == auditd.EventRegistryChanged {
				s.before = limitAt{limit: e.OldLimit, window: e.OldWindow}
			}
		}
		s.limits = append(s.limits, limitAt{bucket: i, limit: e.NewLimit, window: e.NewWindow})
		if e.Type == auditd.EventRegistryChanged {
			s.changes = append(s.changes, auditd.LimitChange{
				Seq: e.Seq, Time: e.Time.UTC(), RunID: strings.Clone(e.RunID),
				OldLimit: e.OldLimit, OldWindow: auditd.Duration(e.OldWindow),
				NewLimit: e.NewLimit, NewWindow: auditd.Duration(e.NewWindow), Cause: strings.Clone(e.Cause),
			})
		}
	}
	return nil
}

// gate returns the wait cause c as a string of its own, without copying
// the gates the fetch loop names.
func gate(c string) string {
	for _, g := range [...]string{"rate", "pause", "concurrency", "breaker", "backoff"} {
		if c == g {
			return g
		}
	}
	return strings.Clone(c)
}

// classify counts a dispatch by its outcome, as the reconciliation does (R2).
func classify(b *auditd.TimelineBucket, e *auditd.Event) {
	switch {
	case e.Type == auditd.EventTransportError:
		b.TransportErrors++
	case e.Type == auditd.EventInterrupted:
		b.Interrupted++
	case e.Status == 429:
		b.Status429++
	case e.Status >= 500 && e.Status < 600:
		b.Status5xx++
	case e.Status >= 200 && e.Status < 300:
		b.Status2xx++
	default:
		b.StatusOther++
	}
}

// breaker ends the span the breaker was in and begins the next one.
func (a *timelineAgg) breaker(s *sourceAgg, e *auditd.Event) {
	t := e.Time.UTC()
	if !s.breaker && e.From != "" && e.From != breakerClosed {
		// The first transition seen leaves a state entered before the
		// timeline began.
		s.spans = append(s.spans, auditd.BreakerSpan{State: strings.Clone(e.From), From: a.start})
	}
	s.breaker = true
	if n := len(s.spans); n > 0 && s.spans[n-1].To.IsZero() {
		s.spans[n-1].To = t
	}
	if e.To == breakerOpen || e.To == breakerHalfOpen {
		s.spans = append(s.spans, auditd.BreakerSpan{State: strings.Clone(e.To), From: t, Seq: e.Seq})
	}
}

// finish settles what only the end can tell: dispatches left in flight,
// the limit in force in every bucket, the buckets' start times.
func (a *timelineAgg) finish() *auditd.Timeline {
	for _, d := range a.open {
		d.src.at(d.bucket).InFlight++
	}
	ids := make([]string, 0, len(a.sources))
	for id, s := range a.sources {
		if !s.skip {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := a.sources[id]
		if a.n > 0 {
			s.at(a.n - 1)
		}
		cur, next := s.before, 0
		for i := range s.buckets {
			b := &s.buckets[i]
			b.Start = a.start.Add(time.Duration(i) * a.bucket)
			for next < len(s.limits) && s.limits[next].bucket == i {
				cur = s.limits[next]
				next++
			}
			if cur.limit > 0 && cur.window > 0 {
				b.Limit, b.Window = cur.limit, auditd.Duration(cur.window)
				b.LimitPerSecond = float64(cur.limit) / cur.window.Seconds()
			}
		}
		a.tl.Sources = append(a.tl.Sources, auditd.SourceTimeline{
			SourceID:     s.id,
			Buckets:      s.buckets,
			BreakerSpans: nonNil(s.spans),
			LimitChanges: nonNil(s.changes),
		})
	}
	if a.started {
		a.tl.From, a.tl.To = a.start, a.start.Add(time.Duration(a.n)*a.bucket)
	}
	return &a.tl
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
