package reports_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

// memTimes is a fixture ledger with the time index a source timeline reads.
type memTimes struct{ *memLedger }

func (l memTimes) SeqAt(t time.Time) (uint64, error) {
	for _, e := range l.Events {
		if !e.Time.Before(t) {
			return e.Seq, nil
		}
	}
	return uint64(len(l.Events) + 1), nil
}

func cleanTimelines(tb testing.TB) *reports.Timelines {
	return reports.NewTimelines(memTimes{newMemLedger(loadFixture(tb, "clean.ndjson"))})
}

func at(d time.Duration) time.Time { return fixtureBase.Add(d) }

// row is the counts of one bucket the tests spell out.
type row struct {
	dispatches, s2xx, s429, s5xx, other, transport, interrupted, inFlight, throttles, shed, cached int
	waits                                                                                          map[string]auditd.WaitTotal
	limit                                                                                          int
}

func rowOf(b auditd.TimelineBucket) row {
	return row{b.Dispatches, b.Status2xx, b.Status429, b.Status5xx, b.StatusOther, b.TransportErrors,
		b.Interrupted, b.InFlight, b.Throttles, b.Shed, b.CacheServed, b.Waits, b.Limit}
}

func sourceOf(tb testing.TB, tl *auditd.Timeline, id string) auditd.SourceTimeline {
	tb.Helper()
	for _, s := range tl.Sources {
		if s.SourceID == id {
			return s
		}
	}
	tb.Fatalf("timeline has no source %s: %+v", id, tl.Sources)
	return auditd.SourceTimeline{}
}

func checkRows(t *testing.T, s auditd.SourceTimeline, want []row) {
	t.Helper()
	if len(s.Buckets) != len(want) {
		t.Fatalf("%s: %d buckets, want %d", s.SourceID, len(s.Buckets), len(want))
	}
	for i, b := range s.Buckets {
		if got := rowOf(b); !reflect.DeepEqual(got, want[i]) {
			t.Errorf("%s bucket %d (%s):\n got %+v\nwant %+v", s.SourceID, i, b.Start.Format("15:04:05.000"), got, want[i])
		}
	}
}

// TestRunTimeline adds up the clean fixture in buckets of a second, by
// hand: every outcome class, the waits by gate, the limit a 429 cut, the
// breaker's open and half-open spans.
func TestRunTimeline(t *testing.T) {
	tl, err := cleanTimelines(t).RunTimeline(context.Background(), fixtureRun, auditd.TimelineQuery{Bucket: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !tl.From.Equal(at(0)) || !tl.To.Equal(at(4*time.Second)) || tl.Bucket != auditd.Duration(time.Second) || tl.BucketSeconds != 1 {
		t.Errorf("range %s to %s in %s (%v s), want the run's 4 s in buckets of 1s", tl.From, tl.To, tl.Bucket.D(), tl.BucketSeconds)
	}
	if tl.RunID != fixtureRun || len(tl.Sources) != 2 || tl.Sources[0].SourceID != "gis" || tl.Sources[1].SourceID != "grants" {
		t.Fatalf("run %q sources %+v, want gis and grants", tl.RunID, tl.Sources)
	}
	w := func(cause string, n int, sec float64) map[string]auditd.WaitTotal {
		return map[string]auditd.WaitTotal{cause: {Count: n, Seconds: sec}}
	}
	gis := sourceOf(t, tl, "gis")
	checkRows(t, gis, []row{
		{dispatches: 2, s2xx: 1, s429: 1, throttles: 1, limit: 3},
		{limit: 3},
		{dispatches: 2, s2xx: 1, s5xx: 1, waits: w("pause", 1, 2), limit: 3},
		{dispatches: 1, s2xx: 1, waits: w("breaker", 1, 1), limit: 3},
	})
	if b := gis.Buckets[1]; !b.Start.Equal(at(time.Second)) || b.Window != auditd.Duration(time.Second) || b.LimitPerSecond != 3 {
		t.Errorf("gis bucket 1 starts %s, limit %d per %s = %v/s", b.Start, b.Limit, b.Window.D(), b.LimitPerSecond)
	}
	wantSpans := []auditd.BreakerSpan{
		{State: "open", From: at(2451 * time.Millisecond), To: at(3452 * time.Millisecond), Seq: 34},
		{State: "half_open", From: at(3452 * time.Millisecond), To: at(3501 * time.Millisecond), Seq: 43},
	}
	if !reflect.DeepEqual(gis.BreakerSpans, wantSpans) {
		t.Errorf("gis breaker spans\n got %+v\nwant %+v", gis.BreakerSpans, wantSpans)
	}
	wantChanges := []auditd.LimitChange{{Seq: 14, Time: at(251 * time.Millisecond), RunID: fixtureRun,
		OldLimit: 5, OldWindow: auditd.Duration(time.Second), NewLimit: 3, NewWindow: auditd.Duration(time.Second), Cause: "429"}}
	if !reflect.DeepEqual(gis.LimitChanges, wantChanges) {
		t.Errorf("gis limit changes\n got %+v\nwant %+v", gis.LimitChanges, wantChanges)
	}

	grants := sourceOf(t, tl, "grants")
	checkRows(t, grants, []row{
		{dispatches: 2, s2xx: 1, s5xx: 1, cached: 1, limit: 2},
		{dispatches: 1, transport: 1, shed: 1, waits: w("backoff", 1, 1), limit: 2},
		{dispatches: 2, other: 1, interrupted: 1, waits: w("backoff", 1, 1), limit: 2},
		{dispatches: 1, s2xx: 1, limit: 2},
	})
	if len(grants.BreakerSpans) != 0 || len(grants.LimitChanges) != 0 {
		t.Errorf("grants spans %+v changes %+v, want none", grants.BreakerSpans, grants.LimitChanges)
	}

	// The classes add up to the dispatches, and the dispatches to R2's.
	var sum int
	for _, s := range tl.Sources {
		for _, b := range s.Buckets {
			sum += b.Dispatches
			if c := b.Status2xx + b.Status429 + b.Status5xx + b.StatusOther + b.TransportErrors + b.Interrupted + b.InFlight; c != b.Dispatches {
				t.Errorf("%s %s: classes add up to %d, dispatches %d", s.SourceID, b.Start, c, b.Dispatches)
			}
		}
	}
	if want := reportstest.CleanLive().Total.Dispatches; sum != want {
		t.Errorf("dispatches add up to %d, the run made %d", sum, want)
	}

	b, err := json.MarshalIndent(tl, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	goldenCompare(t, "clean.timeline.json", append(b, '\n'))
}

func TestRunTimelineQueries(t *testing.T) {
	ctx := context.Background()
	t.Run("OneSource", func(t *testing.T) {
		tl, err := cleanTimelines(t).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: time.Second, Sources: []string{"grants"}})
		if err != nil {
			t.Fatal(err)
		}
		if len(tl.Sources) != 1 || tl.Sources[0].SourceID != "grants" || !tl.From.Equal(at(0)) || !tl.To.Equal(at(4*time.Second)) {
			t.Errorf("from %s to %s, sources %+v; want grants alone over the run", tl.From, tl.To, tl.Sources)
		}
	})
	t.Run("BucketsAlignToTheEpoch", func(t *testing.T) {
		tl, err := cleanTimelines(t).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: 7 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if tl.From.UnixNano()%int64(7*time.Second) != 0 || tl.From.After(at(0)) || len(tl.Sources[0].Buckets) != int(tl.To.Sub(tl.From)/(7*time.Second)) {
			t.Errorf("from %s to %s in %d buckets of 7s", tl.From, tl.To, len(tl.Sources[0].Buckets))
		}
	})
	t.Run("Running", func(t *testing.T) {
		// The run as it stood before its last response: one request in flight.
		evs := loadFixture(t, "clean.ndjson")[:49]
		tl, err := reports.NewTimelines(memTimes{newMemLedger(evs)}).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		last := sourceOf(t, tl, "grants").Buckets[3]
		if last.Dispatches != 1 || last.InFlight != 1 || last.Status2xx != 0 {
			t.Errorf("grants' last bucket %+v; want its dispatch in flight", last)
		}
	})
	t.Run("NoEvents", func(t *testing.T) {
		tl, err := cleanTimelines(t).RunTimeline(ctx, "01JNOSUCHRUN00000000000000", auditd.TimelineQuery{Bucket: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if len(tl.Sources) != 0 || !tl.From.IsZero() || !tl.To.IsZero() {
			t.Errorf("timeline of a run with no events: %+v", tl)
		}
	})
	t.Run("TooManyBuckets", func(t *testing.T) {
		_, err := cleanTimelines(t).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: 100 * time.Microsecond})
		var e *auditd.Error
		if !errors.As(err, &e) || e.Code != auditd.EINVALID || e.Field != "bucket" {
			t.Fatalf("err = %v, want EINVALID on bucket", err)
		}
	})
	t.Run("TooManyPoints", func(t *testing.T) {
		// 20 sources with a dispatch at the start and 6,000 s later: 120,020
		// points in buckets of a second, 60,010 for ten of them.
		var evs []auditd.Event
		var ten []string
		for i := range 20 {
			src := fmt.Sprintf("src-%02d", i)
			if i < 10 {
				ten = append(ten, src)
			}
			for _, d := range []time.Duration{0, 6000 * time.Second} {
				evs = append(evs, auditd.Event{Type: auditd.EventDispatch, RunID: fixtureRun, SourceID: src, ItemKey: src, Attempt: 1, Time: at(d)})
			}
		}
		slices.SortStableFunc(evs, func(a, b auditd.Event) int { return a.Time.Compare(b.Time) })
		tls := reports.NewTimelines(memTimes{newMemLedger(evs)})
		_, err := tls.RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: time.Second})
		var e *auditd.Error
		if !errors.As(err, &e) || e.Code != auditd.EINVALID || e.Field != "source" {
			t.Fatalf("err = %v, want EINVALID on source", err)
		}
		tl, err := tls.RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: time.Second, Sources: ten})
		if err != nil || len(tl.Sources) != 10 || len(tl.Sources[9].Buckets) != 6001 {
			t.Fatalf("ten sources: %v, %d sources", err, len(tl.Sources))
		}
	})
	t.Run("NoBucket", func(t *testing.T) {
		_, err := cleanTimelines(t).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{})
		if auditd.ErrorCode(err) != auditd.EINVALID {
			t.Fatalf("err = %v, want EINVALID", err)
		}
	})
}

// TestSourceTimeline reads a real ledger by time: the source's events of
// every run in the range, with the limit and the breaker state carried in
// from before the range.
func TestSourceTimeline(t *testing.T) {
	dir := t.TempDir()
	reportstest.WriteLedger(t, dir, loadFixture(t, "clean.ndjson"))
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tls := reports.NewTimelines(ledger.NewReader(db))
	ctx := context.Background()

	t.Run("WholeRun", func(t *testing.T) {
		src, err := tls.SourceTimeline(ctx, "gis", auditd.TimelineQuery{Bucket: time.Second, From: at(0), To: at(4 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		run, err := cleanTimelines(t).RunTimeline(ctx, fixtureRun, auditd.TimelineQuery{Bucket: time.Second, Sources: []string{"gis"}})
		if err != nil {
			t.Fatal(err)
		}
		if src.SourceID != "gis" || src.RunID != "" || !src.From.Equal(run.From) || !src.To.Equal(run.To) {
			t.Errorf("source timeline %s %s to %s, run's %s to %s", src.SourceID, src.From, src.To, run.From, run.To)
		}
		// Within the one run, the source's timeline is the run's share of it.
		if len(src.Sources) != 1 || !reflect.DeepEqual(src.Sources[0], run.Sources[0]) {
			t.Errorf("source timeline\n%+v\nrun's share\n%+v", src.Sources, run.Sources)
		}
	})
	t.Run("CarriedIn", func(t *testing.T) {
		// From 3 s the breaker is open already (since 2.451 s) and the last
		// registry event is the run's end snapshot.
		tl, err := tls.SourceTimeline(ctx, "gis", auditd.TimelineQuery{Bucket: 500 * time.Millisecond, From: at(3 * time.Second), To: at(3900 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		s := tl.Sources[0]
		if len(s.Buckets) != 2 || !tl.To.Equal(at(4*time.Second)) {
			t.Fatalf("%d buckets to %s, want 2 to 4 s (to rounds up to a whole bucket)", len(s.Buckets), tl.To)
		}
		for _, b := range s.Buckets {
			if b.Limit != 3 || b.Window != auditd.Duration(time.Second) {
				t.Errorf("bucket %s limit %d per %s, want 3 per 1s from the snapshot", b.Start, b.Limit, b.Window.D())
			}
		}
		if len(s.BreakerSpans) < 1 || s.BreakerSpans[0] != (auditd.BreakerSpan{State: "open", From: at(3 * time.Second), To: at(3452 * time.Millisecond)}) {
			t.Errorf("spans %+v, want open from the range's start (seq 0) to 3.452 s first", s.BreakerSpans)
		}
		if len(s.LimitChanges) != 0 {
			t.Errorf("limit changes %+v, want none in the range", s.LimitChanges)
		}
	})
	t.Run("Empty", func(t *testing.T) {
		tl, err := tls.SourceTimeline(ctx, "gis", auditd.TimelineQuery{Bucket: time.Minute, From: at(time.Hour), To: at(2 * time.Hour)})
		if err != nil {
			t.Fatal(err)
		}
		if len(tl.Sources) != 0 || !tl.From.Equal(at(time.Hour)) || !tl.To.Equal(at(2*time.Hour)) {
			t.Errorf("timeline of a quiet hour: %+v", tl)
		}
	})
	for _, tc := range []struct {
		name  string
		q     auditd.TimelineQuery
		field string
	}{
		{"NoRange", auditd.TimelineQuery{Bucket: time.Second}, "from"},
		{"Backwards", auditd.TimelineQuery{Bucket: time.Second, From: at(time.Second), To: at(0)}, "from"},
		{"TooManyBuckets", auditd.TimelineQuery{Bucket: time.Second, From: at(0), To: at(3 * time.Hour)}, "bucket"},
		{"NoBucket", auditd.TimelineQuery{From: at(0), To: at(time.Second)}, "bucket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tls.SourceTimeline(ctx, "gis", tc.q)
			var e *auditd.Error
			if !errors.As(err, &e) || e.Code != auditd.EINVALID || e.Field != tc.field {
				t.Fatalf("err = %v, want EINVALID on %s", err, tc.field)
			}
		})
	}
}

// TestTimelineSeesEveryDispatchOnce checks a synthetic run of 40,000 events: the
// buckets hold every dispatch once, classed by its outcome.
func TestTimelineSeesEveryDispatchOnce(t *testing.T) {
	run := synthRun{items: 2_000, pages: 4, throttleEvery: 50}
	tl, err := reports.NewTimelines(synthTimes{newSynthReader(run)}).RunTimeline(context.Background(), synthRunID, auditd.TimelineQuery{Bucket: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	requests := run.items * run.pages
	var dispatches, ok, refused, throttles int
	for _, s := range tl.Sources {
		for _, b := range s.Buckets {
			dispatches, ok, refused, throttles = dispatches+b.Dispatches, ok+b.Status2xx, refused+b.Status429, throttles+b.Throttles
		}
	}
	retried := (requests + run.throttleEvery - 1) / run.throttleEvery
	if dispatches != requests+retried || ok != requests || refused != retried || throttles != retried {
		t.Errorf("dispatches %d (2xx %d, 429 %d, throttles %d); want %d requests, %d of them refused once", dispatches, ok, refused, throttles, requests, retried)
	}
	if !slices.IsSortedFunc(tl.Sources, func(a, b auditd.SourceTimeline) int { return strings.Compare(a.SourceID, b.SourceID) }) {
		t.Error("sources not sorted")
	}
}

// synthTimes serves a synthetic run with a time index: its events are a
// millisecond apart from fixtureBase.
type synthTimes struct{ synthReader }

func (r synthTimes) SeqAt(t time.Time) (uint64, error) {
	d := t.Sub(fixtureBase)
	if d < 0 {
		return 1, nil
	}
	return min(uint64(d/time.Millisecond), r.n+1), nil
}

// BenchmarkTimeline1M adds up a run of about 1M events in buckets of a
// second (some 1,000 buckets of 4 sources): "ledger" reads a real bbolt
// ledger (warm after the first iteration), "generated" isolates the
// aggregation from storage.
func BenchmarkTimeline1M(b *testing.B) {
	b.Run("ledger", func(b *testing.B) {
		db := openMillionLedger(b)
		benchTimeline(b, reports.NewTimelines(ledger.NewReader(db)))
	})
	b.Run("generated", func(b *testing.B) {
		benchTimeline(b, reports.NewTimelines(synthTimes{newSynthReader(synth1MEvents)}))
	})
}

func benchTimeline(b *testing.B, tls *reports.Timelines) {
	var buckets, dispatches int
	for b.Loop() {
		tl, err := tls.RunTimeline(context.Background(), synthRunID, auditd.TimelineQuery{Bucket: time.Second})
		if err != nil {
			b.Fatal(err)
		}
		buckets, dispatches = 0, 0
		for _, s := range tl.Sources {
			buckets = len(s.Buckets)
			for _, x := range s.Buckets {
				dispatches += x.Dispatches
			}
		}
	}
	b.ReportMetric(float64(buckets), "buckets/op")
	b.ReportMetric(float64(dispatches), "dispatches/op")
}
