package web_test

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

// The fake API's timelines are added up by the reports package itself from
// the ledger below, so what the charts are checked against is what the real
// route would answer for these events.

// fixtureStart is the run.started of the run in runs.json.
var fixtureStart = time.Date(2026, 11, 29, 18, 40, 5, 130_000_000, time.UTC)

// fixtureLedger is the run of runs.json as the fetch loop would record it,
// kept small: hays-gis is paced at its learned limit, which grows from 2 to
// 8 a second, until three 429s at 18:46:59.8 cut it to 5 (a 12 s pause);
// five 503s open its breaker at 18:52:04 for 30 s, while which an item is
// served from cache; travis-gis goes at its
// ceiling of 30 a minute until a header teaches it 20 at 18:41:00.5.
func fixtureLedger() []auditd.Event {
	var evs []auditd.Event
	at := func(d time.Duration) time.Time { return fixtureStart.Add(d) }
	clock := func(hms string) time.Time {
		t, err := time.Parse("15:04:05.000", hms)
		if err != nil {
			panic(err)
		}
		return time.Date(2026, 11, 29, t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
	}
	add := func(t time.Time, e auditd.Event) {
		e.RunID, e.Time = runID, t
		evs = append(evs, e)
	}
	add(at(0), auditd.Event{Type: auditd.EventRunStarted, Detail: `{"award":{"fain":"EMW-2024-FG-05123"},"config_hash":"9f2c4e1a7b3d5f60aa11bb22cc33dd44ee55ff6677889900aabbccddeeff0011","code_version":"v0.4.0","name":"Parcels refresh, Travis and Hays counties"}`})
	add(at(time.Millisecond), auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: "hays-gis", NewLimit: 2, NewWindow: time.Second, Group: "texas-gateway", Cause: "run.start"})
	add(at(2*time.Millisecond), auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: "travis-gis", NewLimit: 30, NewWindow: time.Minute, Cause: "run.start"})

	// req sends one request of src: a dispatch and its outcome 80 ms later.
	n := map[string]int{}
	req := func(src string, t time.Time, outcome func(d auditd.Event) auditd.Event) auditd.Event {
		i := n[src]
		n[src]++
		d := auditd.Event{Type: auditd.EventDispatch, SourceID: src, ItemKey: fmt.Sprintf("%s/parcels/%d", src[:5], i/4), Page: uint32(i % 4), Attempt: 1, Method: "GET",
			Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?resultOffset=%d", i%4*1000)}
		add(t, d)
		o := auditd.Event{Type: auditd.EventResponse, SourceID: src, ItemKey: d.ItemKey, Page: d.Page, Attempt: 1, Status: 200, Bytes: 48_000, Latency: 80 * time.Millisecond, Outcome: auditd.OutcomeSuccess}
		if outcome != nil {
			o = outcome(o)
		}
		add(t.Add(80*time.Millisecond), o)
		return d
	}
	retry := func(d auditd.Event, t time.Time, cause string, waited time.Duration) {
		add(t, auditd.Event{Type: auditd.EventWait, SourceID: d.SourceID, ItemKey: d.ItemKey, Page: d.Page, Attempt: d.Attempt + 1, Cause: cause, Wait: waited, Actual: waited})
		d.Attempt++
		add(t.Add(time.Millisecond), d)
		add(t.Add(81*time.Millisecond), auditd.Event{Type: auditd.EventResponse, SourceID: d.SourceID, ItemKey: d.ItemKey, Page: d.Page, Attempt: d.Attempt, Status: 200, Bytes: 48_000, Latency: 80 * time.Millisecond, Outcome: auditd.OutcomeSuccess})
	}
	every := func(src string, from, to time.Time, gap time.Duration) {
		for t := from; t.Before(to); t = t.Add(gap) {
			req(src, t, nil)
		}
	}
	changed := func(src string, t time.Time, oldL, newL int, w time.Duration, cause string) {
		add(t, auditd.Event{Type: auditd.EventRegistryChanged, SourceID: src, OldLimit: oldL, NewLimit: newL, OldWindow: w, NewWindow: w, Cause: cause})
	}

	// hays-gis: growing, refused, cut, broken, recovered.
	every("hays-gis", clock("18:40:10.000"), clock("18:42:30.000"), 500*time.Millisecond)
	changed("hays-gis", clock("18:42:30.000"), 2, 4, time.Second, "probe_up")
	every("hays-gis", clock("18:42:30.100"), clock("18:45:00.000"), 250*time.Millisecond)
	changed("hays-gis", clock("18:45:00.000"), 4, 8, time.Second, "probe_up")
	every("hays-gis", clock("18:45:00.100"), clock("18:46:59.800"), 125*time.Millisecond)
	var refused []auditd.Event
	for i, t := range []string{"18:46:59.800", "18:46:59.820", "18:46:59.850"} {
		refused = append(refused, req("hays-gis", clock(t), func(o auditd.Event) auditd.Event {
			return auditd.Event{Type: auditd.EventThrottle, SourceID: o.SourceID, ItemKey: o.ItemKey, Page: o.Page, Attempt: 1, Status: 429,
				RetryAfterRaw: "12", RetryAfter: 12 * time.Second, Backoff: time.Duration(1500+100*i) * time.Millisecond, Wait: 12 * time.Second, Latency: 30 * time.Millisecond}
		}))
		if i == 0 {
			changed("hays-gis", clock("18:46:59.880"), 8, 5, time.Second, "429")
		}
	}
	for i, d := range refused {
		retry(d, clock("18:47:11.900").Add(time.Duration(i)*200*time.Millisecond), "pause", 12*time.Second)
	}
	every("hays-gis", clock("18:47:12.600"), clock("18:52:00.000"), 200*time.Millisecond)
	var broken []auditd.Event
	for i := range 5 {
		broken = append(broken, req("hays-gis", clock("18:52:00.000").Add(time.Duration(i)*time.Second), func(o auditd.Event) auditd.Event {
			o.Status, o.Bytes, o.Outcome = 503, 0, auditd.OutcomeServerError
			return o
		}))
	}
	add(clock("18:52:04.090"), auditd.Event{Type: auditd.EventBreaker, SourceID: "hays-gis", From: "closed", To: "open", Failures: 5, Threshold: 5, Cooldown: 30 * time.Second})
	// While the breaker is open, an item falls back on its last good copy.
	add(clock("18:52:10.000"), auditd.Event{Type: auditd.EventCacheServed, SourceID: "hays-gis", ItemKey: "hays/parcels/19",
		PayloadHash: "d4735e3a265e16eee03f59718b9b5d03019c07d8b6c51f90da3a666eec13ab35", Reason: "breaker open",
		Detail: auditd.CachedCopy{OriginRun: "01JQ8Z6X0RUN00000000000009", FetchedAt: clock("18:51:48.993"), Age: auditd.Duration(21007 * time.Millisecond)}.CacheDetail()})
	add(clock("18:52:34.100"), auditd.Event{Type: auditd.EventBreaker, SourceID: "hays-gis", From: "open", To: "half_open", Failures: 5, Threshold: 5, Cooldown: 30 * time.Second})
	probe := broken[0]
	probe.Attempt, probe.Cause = 2, "probe"
	add(clock("18:52:34.110"), auditd.Event{Type: auditd.EventWait, SourceID: "hays-gis", ItemKey: probe.ItemKey, Page: probe.Page, Attempt: 2, Cause: "breaker", Wait: 30 * time.Second, Actual: 30 * time.Second})
	add(clock("18:52:34.120"), probe)
	add(clock("18:52:34.200"), auditd.Event{Type: auditd.EventResponse, SourceID: "hays-gis", ItemKey: probe.ItemKey, Page: probe.Page, Attempt: 2, Status: 200, Bytes: 48_000, Latency: 80 * time.Millisecond, Outcome: auditd.OutcomeSuccess})
	add(clock("18:52:34.210"), auditd.Event{Type: auditd.EventBreaker, SourceID: "hays-gis", From: "half_open", To: "closed", Threshold: 5, Cooldown: 30 * time.Second})
	for i, d := range broken[1:] {
		retry(d, clock("18:52:34.300").Add(time.Duration(i)*200*time.Millisecond), "breaker", 30*time.Second)
	}
	every("hays-gis", clock("18:52:35.200"), clock("18:56:00.000"), 200*time.Millisecond)

	// travis-gis: at its ceiling, then at what a header taught.
	every("travis-gis", clock("18:40:10.000"), clock("18:41:00.500"), 2*time.Second)
	changed("travis-gis", clock("18:41:00.500"), 30, 20, time.Minute, "header")
	for i, t := 0, clock("18:41:03.000"); t.Before(clock("19:10:00.000")); i, t = i+1, t.Add(3*time.Second) {
		if i%10 == 9 {
			add(t.Add(-time.Second), auditd.Event{Type: auditd.EventWait, SourceID: "travis-gis", ItemKey: fmt.Sprintf("travi/parcels/%d", n["travis-gis"]/4), Page: uint32(n["travis-gis"] % 4), Attempt: 1, Cause: "rate", Wait: time.Second, Actual: time.Second})
		}
		req("travis-gis", t, nil)
	}

	add(clock("19:10:01.900"), auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: "hays-gis", NewLimit: 5, NewWindow: time.Second, Group: "texas-gateway", Cause: "run.end"})
	add(clock("19:10:01.901"), auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: "travis-gis", NewLimit: 20, NewWindow: time.Minute, Cause: "run.end"})
	add(clock("19:10:02.004"), auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(auditd.RunPartial)})
	// The ledger holds events in the order they were recorded.
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].Time.Before(evs[j].Time) })
	return evs
}

// timeIndexed is a fixture ledger with the time index a source's timeline
// reads.
type timeIndexed struct{ *reportstest.MemLedger }

func (l timeIndexed) SeqAt(t time.Time) (uint64, error) {
	i, _ := slices.BinarySearchFunc(l.Events, t, func(e auditd.Event, t time.Time) int { return e.Time.Compare(t) })
	return uint64(i + 1), nil
}

func fixtureTimelines() *reports.Timelines {
	return reports.NewTimelines(timeIndexed{reportstest.NewMemLedger(fixtureLedger())})
}

// autoBucket is what the API gives a timeline without ?bucket= (api,
// niceBuckets): the narrowest round width that covers span in about 240.
func autoBucket(span time.Duration) time.Duration {
	for _, b := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
		time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour} {
		if span <= 240*b {
			return b
		}
	}
	return time.Hour
}
