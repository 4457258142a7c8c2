package fetch_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports/reportstest"
)

// update rewrites the fixture TestLoopFixture compares with:
//
//	go test ./fetch -run TestLoopFixture -update
var update = flag.Bool("update", false, "rewrite testdata/reports/loop.ndjson from a run of the fetch loop")

// loopFixture is the fixture a real run of the loop writes: the reports
// package's golden tests read it (reports/loop_fixture_test.go).
const loopFixture = "loop.ndjson"

// fixtureScenario is an upstream that refuses more than three requests a
// second with a 429 and Retry-After, and answers 503 for a second and a
// half: throttles, waits and retries (attempts 2 and 3), a learned limit,
// the breaker opening, probing and closing.
const fixtureScenario = `
name: fixture
seed: 3
upstreams:
  - name: county
    path: /arcgis/rest/services/Parcels/FeatureServer/0/query
    limit: {shape: fixed_window, requests: 3, window: 1s}
    reject: {status: 429, retry_after: delta}
    collection: {kind: arcgis, records: 25, max_page: 10, layer: parcels}
    outages:
      - {from: 11500ms, to: 1m, status: 503}
`

// fixtureRun runs the fixture's two runs on a fake clock, one worker, so
// that the ledger's order is the same every time: a first run that stages
// its items' payloads, and a second run that pages through a collection,
// fetches some of the same items again until the upstream goes down, then
// serves the rest from the first run's copies, and fails the one item it
// has no copy of, after the breaker's probes. It returns the second run's events, and the strings that
// differ from one test process to the next, each with the fixed one the
// fixture holds instead: the first run's id, the upstream's address, and
// the config hash of the second run (which covers the address).
func fixtureRun(t *testing.T) (events []auditd.Event, replace []string) {
	h := newHarness(t, fixtureScenario)
	h.lim.Jitter = func(n time.Duration) time.Duration { return n / 2 } // backoffs the same every time
	h.source(t, auditd.Source{ID: "county", Limit: 10, Window: auditd.Duration(time.Second), Concurrency: 1, MaxAttempts: 3,
		Breaker: auditd.BreakerPolicy{Threshold: 2, Cooldown: auditd.Duration(time.Second)}}, "county")
	item := func(key string, n int) auditd.Item {
		return auditd.Item{Key: key, SourceID: "county", Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%%3D1&f=json&n=%d", n)}
	}
	ctx := context.Background()
	var items []auditd.Item
	for i := range 6 {
		items = append(items, item(fmt.Sprintf("parcels-%d", i), i))
	}
	before, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "before", Principal: "pipeline@county.example", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if v := h.finish(t, before.ID); v.Status != auditd.RunSucceeded {
		t.Fatalf("first run %s", v.Status)
	}
	h.clk.Set(epoch.Add(10 * time.Second))
	// The second run: a paged item first, the first run's items, and one
	// the first run did not fetch, which has no copy to fall back on.
	paged := auditd.Item{Key: "parcels-all", SourceID: "county", Path: "/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%3D1&outFields=*&f=json",
		Paging: auditd.PagingArcGIS, PageSize: 10}
	items = append(append([]auditd.Item{paged}, items...), item("parcels-new", 99))
	v, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "nightly parcels", Principal: "pipeline@county.example",
		Award: auditd.Award{FAIN: "NA24OAR4310001", AwardYear: 2024}, Items: items})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	h.reconcile(t, v.ID)
	return h.events(t, v.ID), []string{before.ID, "01JQ8Z6X0RUN00000000000009", h.urls["county"], "http://county.example",
		v.ConfigHash, "c0ffee42"}
}

// TestLoopFixture: testdata/reports/loop.ndjson is what the loop writes.
// Two runs of the same scenario write the same fixture, and it is the one
// in testdata (rewrite it with -update), so the golden tests that read it
// test the records the loop makes, not records written by hand.
func TestLoopFixture(t *testing.T) {
	write := func(t *testing.T) []byte {
		events, replace := fixtureRun(t)
		var b bytes.Buffer
		if err := reportstest.WriteFixture(&b, events, events[0].RunID, replace...); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	got := write(t)
	if again := write(t); !bytes.Equal(got, again) {
		t.Fatalf("two runs of the scenario wrote different fixtures:\n%s", reportstest.LineDiff(string(got), string(again), 1))
	}
	for _, want := range []string{`"type":"throttle"`, `"type":"wait"`, `"attempt":2`, `"attempt":3`, `"to":"open"`, `"to":"half_open"`,
		`"cause":"probe"`, `"page":2`, `"type":"cache.served"`, `"outcome":"failed"`, `"type":"registry.changed"`} {
		if !bytes.Contains(got, []byte(want)) {
			t.Errorf("the run wrote no %s: the scenario no longer shows what the fixture is for", want)
		}
	}
	path := filepath.Join(reportstest.Dir(), loopFixture)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("the loop no longer writes %s (go test ./fetch -run TestLoopFixture -update to accept):\n%s", loopFixture, reportstest.LineDiff(string(want), string(got), 1))
	}
}
