package fetch_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// httptest servers' idle keep-alive connections close on their own.
		goleak.IgnoreTopFunction("net/http.(*persistConn).readLoop"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
	)
}

const mixedScenario = `
name: mixed
seed: 3
upstreams:
  - name: parcels
    path: /arcgis/rest/services/Parcels/FeatureServer/0/query
    limit: {shape: leaky_bucket, requests: 5, window: 1s, burst: 1}
    reject: {status: 429, retry_after: none}
    collection: {kind: arcgis, records: 230, max_page: 50, layer: parcels}
  - name: zoning
    path: /geoserver/ows
    limit: {shape: sliding_window, requests: 4, window: 1s}
    reject: {status: 429, retry_after: delta, advertise: x_ratelimit}
    collection: {kind: wfs, records: 120, max_page: 40, layer: zoning}
  - name: grants
    path: /v1/api/search2
    limit: {shape: token_bucket, requests: 3, window: 1s, burst: 3}
    reject: {status: 503, retry_after: imf_fixdate}
    collection: {kind: grants_gov, records: 60, max_page: 25}
    body_errors:
      - {style: grants_gov, every: 7, code: 1, message: "search is temporarily unavailable"}
`

func mixedSources(tb testing.TB, h *harness) {
	tb.Helper()
	second := auditd.Duration(time.Second)
	h.source(tb, auditd.Source{ID: "parcels", Limit: 20, Window: second}, "parcels")
	h.source(tb, auditd.Source{ID: "zoning", Limit: 20, Window: second}, "zoning")
	h.source(tb, auditd.Source{ID: "grants", Limit: 20, Window: second, BodyError: auditd.BodyErrorGrantsGov}, "grants")
}

func mixedItems() []auditd.Item {
	var items []auditd.Item
	for i, key := range []string{"p1", "p2", "p3", "p4"} {
		items = append(items, auditd.Item{Key: key, SourceID: "parcels", Path: "/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%3D1&f=json&q=" + string(rune('a'+i)), Paging: auditd.PagingArcGIS, PageSize: 50})
	}
	for i, key := range []string{"z1", "z2", "z3"} {
		items = append(items, auditd.Item{Key: key, SourceID: "zoning", Path: "/geoserver/ows?service=WFS&request=GetFeature&typeNames=zoning&outputFormat=json&n=" + string(rune('a'+i)), Paging: auditd.PagingWFS, PageSize: 40})
	}
	for i := range 6 {
		items = append(items, auditd.Item{Key: "g" + string(rune('1'+i)), SourceID: "grants", Method: "POST", Path: "/v1/api/search2", Body: []byte(`{"keyword":"broadband` + string(rune('a'+i)) + `"}`)})
	}
	return items
}

// The ledger must never show fewer requests than the upstream received, and
// with no crash it shows exactly as many; every dispatch has one outcome and
// every item one end.
func TestRunTiesOutWithUpstreams(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	v, created, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "mixed", Items: mixedItems(), Principal: "test"})
	if err != nil || !created {
		t.Fatalf("submit: %v %v", created, err)
	}
	v = h.finish(t, v.ID)
	events := h.events(t, v.ID)
	h.reconcile(t, v.ID)

	for _, up := range []string{"parcels", "zoning", "grants"} {
		got, want := count(events, auditd.EventDispatch, up), h.sim.Stats(up).Received
		if got != want {
			t.Errorf("%s: %d dispatch events, upstream received %d", up, got, want)
		}
	}
	outcomes := count(events, auditd.EventResponse, "") + count(events, auditd.EventThrottle, "") + count(events, auditd.EventTransportError, "")
	if d := count(events, auditd.EventDispatch, ""); outcomes != d {
		t.Errorf("%d dispatches but %d outcome events", d, outcomes)
	}
	if n := count(events, auditd.EventItemFinished, ""); n != len(mixedItems()) {
		t.Errorf("%d item.finished events for %d items", n, len(mixedItems()))
	}
	if n := count(events, auditd.EventRunFinished, ""); n != 1 {
		t.Errorf("%d run.finished events", n)
	}
	if len(v.ConfigHash) != 64 {
		t.Errorf("run carries config hash %q", v.ConfigHash)
	}
	if c := v.Counts; c.Done() != c.Items || c.Items != len(mixedItems()) {
		t.Errorf("counts do not add up: %+v", c)
	}
	throttles := count(events, auditd.EventThrottle, "")
	if throttles == 0 {
		t.Error("the hidden limits never throttled: the scenario tests nothing")
	}
	if ch := count(events, auditd.EventRegistryChanged, ""); ch == 0 {
		t.Error("nothing was learned from the throttles and headers")
	}

	// Paged items: every page fetched and the totals tie to the upstream's.
	for _, key := range []string{"p1", "z1", "g1"} {
		it, err := h.runs.Item(context.Background(), v.ID, key)
		if err != nil {
			t.Fatal(err)
		}
		if it.Result == nil {
			t.Fatalf("%s has no result", key)
		}
		if key == "g1" {
			continue // unpaged
		}
		want := map[string]int{"p1": 230, "z1": 120}[key]
		if it.Result.Outcome == auditd.ItemSucceeded && it.Result.Records != want {
			t.Errorf("%s: %d records, want %d", key, it.Result.Records, want)
		}
		if key == "z1" && it.Result.Outcome == auditd.ItemSucceeded && !it.Result.CountMatched {
			t.Errorf("z1: count did not match the advertised numberMatched: %+v", it.Result)
		}
		r, err := h.runs.Payload(context.Background(), v.ID, key)
		if err == nil {
			b, _ := io.ReadAll(r)
			r.Close()
			if len(b) == 0 {
				t.Errorf("%s: empty payload", key)
			}
		}
	}
	// Body errors inside a 200 are failures, recorded with their code.
	failedBody := 0
	for _, e := range events {
		if e.Type == auditd.EventResponse && e.Outcome == auditd.OutcomeBodyError {
			failedBody++
			if e.BodyError != "errorcode=1" {
				t.Errorf("body error recorded as %q", e.BodyError)
			}
		}
	}
	if failedBody != h.sim.Stats("grants").BodyErrors {
		t.Errorf("%d body errors recorded, upstream sent %d", failedBody, h.sim.Stats("grants").BodyErrors)
	}
}

// A throttle pauses the source from the moment it is on record: no dispatch
// to that source recorded after it carries a time before throttle.Time+Wait.
func TestThrottlePausesBeforeNextDispatch(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "pause", Items: mixedItems()})
	if err != nil {
		t.Fatal(err)
	}
	events := h.events(t, h.finish(t, v.ID).ID)
	checked := 0
	for _, th := range events {
		if th.Type != auditd.EventThrottle {
			continue
		}
		checked++
		end := th.Time.Add(th.Wait)
		for _, d := range events {
			if d.Type == auditd.EventDispatch && d.SourceID == th.SourceID && d.Seq > th.Seq && d.Time.Before(end) {
				t.Errorf("dispatch %d at %v inside the pause of throttle %d [%v, %v)", d.Seq, d.Time, th.Seq, th.Time, end)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no throttle to check")
	}
}

const outageScenario = `
name: outage
seed: 1
upstreams:
  - name: down
    path: /geoserver/ows
    collection: {kind: wfs, records: 30, max_page: 30, layer: parcels}
    outages:
      - {from: 1m, to: 2h, status: 503}
  - name: up
    path: /arcgis/rest/services/Parcels/FeatureServer/0/query
    collection: {kind: arcgis, records: 20, max_page: 20, layer: parcels}
`

const gatewayScenario = `
name: gateway
seed: 1
groups:
  - name: org
    limit: {shape: leaky_bucket, requests: 4, window: 1s, burst: 2}
upstreams:
  - name: north
    group: org
    path: /q
    reject: {status: 429, retry_after: delta}
  - name: south
    group: org
    path: /q
    reject: {status: 429, retry_after: delta}
`

// Endpoints in one gateway group share one budget: together they never
// exceed the group's quota in any window.
func TestGatewayGroupSharesOneBudget(t *testing.T) {
	h := newHarness(t, gatewayScenario)
	second := auditd.Duration(time.Second)
	h.source(t, auditd.Source{ID: "north", Group: "org", Limit: 4, Window: second}, "north")
	h.source(t, auditd.Source{ID: "south", Group: "org", Limit: 4, Window: second}, "south")
	var items []auditd.Item
	for i := range 30 {
		src := []string{"north", "south"}[i%2]
		items = append(items, auditd.Item{Key: src + string(rune('A'+i)), SourceID: src, Path: "/q?i=" + string(rune('A'+i))})
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "gw", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	h.reconcile(t, v.ID)
	if v.Counts.Succeeded != 30 {
		t.Fatalf("%d of 30 succeeded: %+v", v.Counts.Succeeded, v.Counts)
	}
	var times []time.Time
	for _, e := range h.events(t, v.ID) {
		if e.Type == auditd.EventDispatch {
			times = append(times, e.Time)
		}
	}
	for i := range times {
		n := 0
		for j := i; j < len(times) && times[j].Sub(times[i]) < time.Second; j++ {
			n++
		}
		if n > 4 {
			t.Fatalf("%d dispatches to the group within 1s from %v; the quota is 4", n, times[i])
		}
	}
	if r := h.sim.Stats("north").ByStatus[429] + h.sim.Stats("south").ByStatus[429]; r != 0 {
		for _, e := range h.events(t, v.ID) {
			if e.Type == auditd.EventDispatch || e.Type == auditd.EventThrottle || e.Type == auditd.EventRegistryChanged {
				t.Logf("%d %s %s %s st=%d old=%d/%v new=%d/%v %s", e.Seq, e.Time.Format("05.000000"), e.Type, e.SourceID, e.Status, e.OldLimit, e.OldWindow, e.NewLimit, e.NewWindow, e.Cause+e.Snapshot)
			}
		}
		t.Errorf("the gateway refused %d requests", r)
	}
}

// An unknown source is refused before anything is stored or recorded.
func TestSubmitRefusesUnknownSource(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	head, _ := h.ledger.Head()
	_, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Items: []auditd.Item{
		{Key: "a", SourceID: "parcels", Path: "/x"}, {Key: "b", SourceID: "nowhere", Path: "/x"},
	}})
	if auditd.ErrorCode(err) != auditd.EINVALID {
		t.Fatalf("got %v", err)
	}
	if e, ok := err.(*auditd.Error); !ok || e.Field != "items[1].source" {
		t.Errorf("error names %+v", err)
	}
	if after, _ := h.ledger.Head(); after != head {
		t.Errorf("ledger moved from %d to %d", head, after)
	}
	if runs, _, _ := h.runs.Runs(context.Background(), auditd.RunFilter{}); len(runs) != 0 {
		t.Errorf("%d runs stored", len(runs))
	}
}

// A replayed run reads the staged payloads instead of fetching again, and
// the pipeline's acknowledgements tie delivered to loaded.
func TestReplayAndAcknowledge(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	items := mixedItems()[:4] // the parcels layers
	first, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "fetch", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if v := h.finish(t, first.ID); v.Counts.Succeeded != len(items) {
		t.Fatalf("first run: %+v", v.Counts)
	}
	received := h.sim.Stats("parcels").Received

	replay, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "replay", Items: items, Replay: true})
	if err != nil {
		t.Fatal(err)
	}
	v := h.finish(t, replay.ID)
	if v.Counts.Cached != len(items) || v.Counts.Dispatches != 0 {
		t.Fatalf("replay fetched instead of reading staged payloads: %+v", v.Counts)
	}
	if got := h.sim.Stats("parcels").Received; got != received {
		t.Fatalf("the upstream received %d more requests during a replay", got-received)
	}

	// Acknowledging an unknown item records nothing; known ones once each.
	head, _ := h.ledger.Head()
	if _, err := h.runs.Acknowledge(context.Background(), first.ID, []string{"p1", "nope"}, "pipeline"); auditd.ErrorCode(err) != auditd.EINVALID {
		t.Fatalf("unknown key: %v", err)
	}
	if after, _ := h.ledger.Head(); after != head {
		t.Fatalf("a refused acknowledgement wrote %d events", after-head)
	}
	keys := []string{"p1", "p2", "p3", "p4"}
	if n, err := h.runs.Acknowledge(context.Background(), first.ID, keys, "pipeline"); err != nil || n != 4 {
		t.Fatalf("acknowledge: %d %v", n, err)
	}
	if n, err := h.runs.Acknowledge(context.Background(), first.ID, keys, "pipeline"); err != nil || n != 0 {
		t.Fatalf("acknowledging again: %d %v", n, err)
	}
	h.reconcile(t, first.ID)
	h.reconcile(t, replay.ID)
}

// Redirects are followed only to the same host: credentials added for one
// jurisdiction never reach another.
func TestRedirectToAnotherHostRefused(t *testing.T) {
	h := newHarness(t, mixedScenario)
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	redirecting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/steal", http.StatusFound)
	}))
	defer redirecting.Close()
	src := auditd.Source{ID: "moved", BaseURL: redirecting.URL, Limit: 10, Window: auditd.Duration(time.Second), MaxAttempts: 1,
		Headers: map[string]string{"X-API-Key": "secret"}}
	if _, err := h.loop.PutSource(context.Background(), "test", src); err != nil {
		t.Fatal(err)
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "redirect", Items: []auditd.Item{{Key: "a", SourceID: "moved", Path: "/q"}}})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	if v.Counts.Failed != 1 || elsewhere.Load() != 0 {
		t.Fatalf("redirect followed to another host: %+v, other host hit %d times", v.Counts, elsewhere.Load())
	}
	for _, e := range h.events(t, v.ID) {
		if _, cause := e.Shared(); strings.Contains(cause+e.Path+e.Detail, "secret") {
			t.Fatalf("a secret reached the ledger: %+v", e)
		}
	}
}

// Cancelling a run stops it: the items not yet finished end as failed
// ("cancelled"), the run ends cancelled and still reconciles; cancelling it
// again is a conflict.
func TestCancelRun(t *testing.T) {
	h := newHarness(t, mixedScenario)
	items := slowItems(t, h, 20)
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "cancel me", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	h.drive(func() bool {
		got, _ := h.runs.Run(context.Background(), v.ID)
		return got.Counts.Succeeded >= 3
	}, 10_000)
	if _, err := h.loop.Cancel(context.Background(), v.ID); err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	if v.Status != auditd.RunCancelled {
		t.Fatalf("run ended %s", v.Status)
	}
	if v.Counts.Succeeded < 3 || v.Counts.Succeeded+v.Counts.Failed != len(items) {
		t.Fatalf("counts after cancel: %+v", v.Counts)
	}
	it, err := h.runs.Item(context.Background(), v.ID, "kt")
	if err != nil || it.Result == nil || it.Result.Reason != "cancelled" {
		t.Fatalf("last item after cancel: %+v %v", it.Result, err)
	}
	if _, err := h.loop.Cancel(context.Background(), v.ID); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Fatalf("second cancel: %v", err)
	}
	h.reconcile(t, v.ID)
}

// Past the run's deadline the gates shed what they cannot admit in time:
// items end shed, each recorded with the gate that could not admit it, and
// the run reaches a terminal status that reconciles.
func TestDeadlineSheds(t *testing.T) {
	h := newHarness(t, mixedScenario)
	items := slowItems(t, h, 10)
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "deadline", Items: items,
		Deadline: h.clk.Now().Add(3500 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	if v.Counts.Shed == 0 || v.Counts.Succeeded == 0 || v.Counts.Succeeded+v.Counts.Shed != len(items) {
		t.Fatalf("at 1/s with 3.5 s to go: %+v", v.Counts)
	}
	if v.Status != auditd.RunPartial {
		t.Fatalf("run ended %s", v.Status)
	}
	for _, e := range h.events(t, v.ID) {
		if e.Type == auditd.EventShed && e.Gate != "rate" {
			t.Errorf("shed at gate %q, want rate", e.Gate)
		}
		if e.Type == auditd.EventDispatch && e.Time.After(v.Deadline) {
			t.Errorf("dispatch %d after the deadline", e.Seq)
		}
	}
	h.reconcile(t, v.ID)
}

// Wait blocks until the run's end is stored, gives up with its context,
// and answers at once for a run that has ended.
func TestWaitReturnsOnceRunEnds(t *testing.T) {
	h := newHarness(t, mixedScenario)
	h.source(t, auditd.Source{ID: "slow", Limit: 1, Window: auditd.Duration(time.Second), Concurrency: 1}, "zoning")
	items := []auditd.Item{{Key: "a", SourceID: "slow", Path: "/geoserver/ows?n=a"}, {Key: "b", SourceID: "slow", Path: "/geoserver/ows?n=b"}}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "wait for me", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := h.loop.Wait(gone, v.ID); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with an ended context on a running run: %v", err)
	}
	type waited struct {
		v   auditd.RunView
		err error
	}
	done := make(chan waited, 1)
	go func() {
		v, err := h.loop.Wait(context.Background(), v.ID)
		done <- waited{v, err}
	}()
	want := h.finish(t, v.ID)
	got := <-done
	if got.err != nil || got.v.Status != want.Status || !got.v.Status.Terminal() || got.v.Counts.Succeeded != 2 {
		t.Fatalf("wait returned %s %+v, %v; the run ended %s", got.v.Status, got.v.Counts, got.err, want.Status)
	}
	if again, err := h.loop.Wait(gone, v.ID); err != nil || again.Status != want.Status {
		t.Fatalf("wait on an ended run: %s, %v", again.Status, err)
	}
	if _, err := h.loop.Wait(context.Background(), "no-such-run"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
		t.Fatalf("wait on an unknown run: %v, want ENOTFOUND", err)
	}
}

// TestLearnedLimitFollowsItsResponse: a limit the upstream advertises is
// recorded (registry.changed, Cause "header") after the response that
// advertised it, as EVENTS.md says: it "follows the outcome that taught
// it"; and only once, since later responses advertise the same.
func TestLearnedLimitFollowsItsResponse(t *testing.T) {
	h := newHarness(t, `
name: advertised
seed: 1
upstreams:
  - name: adv
    path: /api
    limit: {shape: fixed_window, requests: 7, window: 1s}
    reject: {status: 429, retry_after: delta, advertise: ietf}
`)
	// The ceiling is above the advertised 7 a second (RateLimit-Policy
	// q=7;w=1), and the harness starts sources at 10 a second, so the
	// advertisement moves the pace.
	h.source(t, auditd.Source{ID: "adv", Limit: 20, Window: auditd.Duration(time.Second), Concurrency: 1}, "adv")
	items := []auditd.Item{{Key: "a", SourceID: "adv", Path: "/api?q=a"}, {Key: "b", SourceID: "adv", Path: "/api?q=b"}}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "adv", Items: items, Principal: "test"})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	if v.Status != auditd.RunSucceeded {
		t.Fatalf("run ended %s", v.Status)
	}
	events := h.events(t, v.ID)
	var firstResponse, firstChange uint64
	for _, e := range events {
		switch {
		case e.Type == auditd.EventResponse && firstResponse == 0:
			firstResponse = e.Seq
		case e.Type == auditd.EventRegistryChanged && firstChange == 0:
			firstChange = e.Seq
			if e.Cause != "header" || e.NewLimit != 7 {
				t.Errorf("the first registry change is %+v, want the advertised 7 per second", e)
			}
		}
	}
	if firstChange == 0 || firstResponse == 0 || firstChange < firstResponse {
		t.Fatalf("first response at %d, first registry.changed at %d: the change must follow the response that taught it", firstResponse, firstChange)
	}
	if n := count(events, auditd.EventRegistryChanged, ""); n != 1 {
		t.Errorf("%d registry changes; want only the first response's lesson", n)
	}
}

// slowItems registers source "slow" (one request a second, one at a time, on
// the zoning upstream) and returns n items for it, keyed ka, kb, ...
func slowItems(tb testing.TB, h *harness, n int) []auditd.Item {
	tb.Helper()
	h.source(tb, auditd.Source{ID: "slow", Limit: 1, Window: auditd.Duration(time.Second), Concurrency: 1}, "zoning")
	items := make([]auditd.Item, n)
	for i := range items {
		items[i] = auditd.Item{Key: "k" + string(rune('a'+i)), SourceID: "slow", Path: "/geoserver/ows?n=" + string(rune('a'+i))}
	}
	return items
}

// An idempotency key answers retries of the submit that first used it, and
// only those: the same key with other items is refused (ECONFLICT) and
// stores nothing, and an item's method left empty is the GET it defaults to.
func TestIdempotencyKeyAnswersOnlyItsRequest(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	ctx := context.Background()
	req := auditd.NewRun{Name: "nightly", Items: mixedItems()[:2], IdempotencyKey: "tok:nightly-1"}
	first, created, err := h.loop.Submit(ctx, req)
	if err != nil || !created {
		t.Fatalf("first submit: created %v, %v", created, err)
	}

	retry := req
	retry.Items = slices.Clone(req.Items)
	retry.Items[0].Method = "GET" // what an empty method defaults to
	again, created, err := h.loop.Submit(ctx, retry)
	if err != nil || created || again.ID != first.ID {
		t.Fatalf("retry: run %s, created %v, %v; want run %s, not created", again.ID, created, err, first.ID)
	}

	other := req
	other.Items = mixedItems()[:3]
	runs, _, err := h.runs.Runs(context.Background(), auditd.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.loop.Submit(ctx, other); auditd.ErrorCode(err) != auditd.ECONFLICT || !strings.Contains(err.Error(), first.ID) {
		t.Fatalf("the key with other items: %v; want a conflict naming run %s", err, first.ID)
	}
	if _, err := h.runs.RunByIdempotencyKey(context.Background(), other); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Fatalf("RunByIdempotencyKey with other items: %v; want a conflict", err)
	}
	after, _, err := h.runs.Runs(context.Background(), auditd.RunFilter{})
	if err != nil || len(after) != len(runs) {
		t.Fatalf("%d runs before the refused submit, %d after (%v)", len(runs), len(after), err)
	}
	h.finish(t, first.ID)
}

// TestRunsListsSameInstantRunsInSubmissionOrder: runs submitted at one
// instant of the clock still list newest first, because their ids keep the
// order they were minted in.
func TestRunsListsSameInstantRunsInSubmissionOrder(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	ctx := context.Background()
	var ids []string
	for i := range 12 {
		v, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: fmt.Sprintf("r%02d", i), Items: mixedItems()[:1]})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, v.ID)
	}
	runs, _, err := h.runs.Runs(context.Background(), auditd.RunFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range runs {
		got = append(got, r.ID)
	}
	want := slices.Clone(ids)
	slices.Reverse(want)
	if !slices.Equal(got, want) {
		t.Fatalf("Runs listed %v, want newest first %v", got, want)
	}
	for _, id := range ids {
		h.finish(t, id)
	}
}
