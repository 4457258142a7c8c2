package fetch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/limiter"
)

// One jurisdiction down never fails the run or holds the others back: its
// items are served from the last good copy, or end failed once their
// attempts are spent, while the other source completes.
func TestOutageServesLastGoodCopy(t *testing.T) {
	h := newHarness(t, outageScenario)
	second := auditd.Duration(time.Second)
	h.source(t, auditd.Source{ID: "down", Limit: 10, Window: second, MaxAttempts: 3,
		Breaker: auditd.BreakerPolicy{Threshold: 2, Cooldown: auditd.Duration(10 * time.Second)}}, "down")
	h.source(t, auditd.Source{ID: "up", Limit: 10, Window: second}, "up")
	item := func(key, src, path string) auditd.Item { return auditd.Item{Key: key, SourceID: src, Path: path} }
	wfs := func(n string) string { return "/geoserver/ows?service=WFS&request=GetFeature&typeNames=parcels&n=" + n }

	first, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "before", Items: []auditd.Item{
		item("a", "down", wfs("a")), item("b", "down", wfs("b")),
	}})
	if err != nil {
		t.Fatal(err)
	}
	if v := h.finish(t, first.ID); v.Status != auditd.RunSucceeded {
		t.Fatalf("first run %s: %+v", v.Status, v.Counts)
	}

	h.clk.Advance(2 * time.Minute) // the outage has begun
	var items []auditd.Item
	items = append(items, item("a", "down", wfs("a")), item("b", "down", wfs("b")), item("new", "down", wfs("new")))
	for i := range 5 {
		items = append(items, item("u"+string(rune('0'+i)), "up", "/arcgis/rest/services/Parcels/FeatureServer/0/query?f=json&n="+string(rune('0'+i))))
	}
	second2, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "during", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	v := h.finish(t, second2.ID)
	events := h.events(t, v.ID)
	h.reconcile(t, first.ID)
	h.reconcile(t, v.ID)
	if v.Counts.Succeeded != 5 {
		t.Errorf("the healthy source finished %d of 5", v.Counts.Succeeded)
	}
	if v.Counts.Cached != 2 {
		t.Errorf("%d items served from cache, want 2 (a, b)", v.Counts.Cached)
	}
	if v.Counts.Failed != 1 {
		t.Errorf("%d items failed, want 1 (new has no copy)", v.Counts.Failed)
	}
	if v.Status != auditd.RunPartial {
		t.Errorf("run ended %s, want partial", v.Status)
	}
	opened := false
	for _, e := range events {
		if e.Type == auditd.EventBreaker && e.To == "open" && e.SourceID == "down" {
			opened = true
		}
	}
	if !opened {
		t.Error("the breaker never opened on 503s")
	}
	if count(events, auditd.EventCacheServed, "down") != 2 {
		t.Errorf("%d cache.served events", count(events, auditd.EventCacheServed, "down"))
	}
	if got, want := count(h.events(t, first.ID), auditd.EventDispatch, "down")+count(events, auditd.EventDispatch, "down"), h.sim.Stats("down").Received; got != want {
		t.Errorf("down: %d dispatches recorded, upstream received %d", got, want)
	}
}

// A copy is its request's last good copy as soon as it is staged: a run
// whose fetch fails falls back on a copy that another run, still running,
// staged minutes earlier, and says which run fetched it and how old it is.
func TestConcurrentRunFallsBackOnStagedCopy(t *testing.T) {
	h := newHarness(t, outageScenario)
	second := auditd.Duration(time.Second)
	h.source(t, auditd.Source{ID: "down", Limit: 10, Window: second, MaxAttempts: 2,
		Breaker: auditd.BreakerPolicy{Threshold: 2, Cooldown: auditd.Duration(10 * time.Second)}}, "down")
	// One request every ten minutes: the first run is still running long
	// after its item of "down" is staged.
	h.source(t, auditd.Source{ID: "slow", Limit: 1, Window: auditd.Duration(10 * time.Minute)}, "up")
	path := "/geoserver/ows?service=WFS&request=GetFeature&typeNames=parcels&n=a"
	items := []auditd.Item{{Key: "a", SourceID: "down", Path: path}}
	for i := range 4 {
		items = append(items, auditd.Item{Key: fmt.Sprint("slow", i), SourceID: "slow", Path: fmt.Sprint("/arcgis/rest/services/Parcels/FeatureServer/0/query?f=json&n=", i)})
	}
	ctx := context.Background()
	first, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "long", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(func() bool {
		v, err := h.runs.Item(ctx, first.ID, "a")
		return err == nil && v.Result != nil
	}, 10_000) {
		t.Fatal("the first run never finished item a")
	}
	staged := h.clk.Now()

	h.clk.Advance(3 * time.Minute) // the outage has begun; the first run goes on
	second2, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "during", Items: []auditd.Item{{Key: "again", SourceID: "down", Path: path}}})
	if err != nil {
		t.Fatal(err)
	}
	v := h.finish(t, second2.ID)
	if long, _ := h.runs.Run(ctx, first.ID); long.Status.Terminal() {
		t.Fatalf("the first run ended (%s) before the second: the test proves nothing", long.Status)
	}
	if v.Counts.Cached != 1 || v.Status != auditd.RunSucceeded {
		t.Fatalf("second run %s with %+v; want its item served from the first run's staged copy", v.Status, v.Counts)
	}
	iv, err := h.runs.Item(ctx, v.ID, "again")
	if err != nil {
		t.Fatal(err)
	}
	c := iv.Result.Cached
	if c == nil || c.OriginRun != first.ID || c.Age.D() < 3*time.Minute || c.FetchedAt.After(staged) {
		t.Fatalf("cached copy %+v; want one from run %s, fetched by %v, at least 3m old", c, first.ID, staged)
	}
	var served []auditd.Event
	for _, e := range h.events(t, v.ID) {
		if e.Type == auditd.EventCacheServed {
			served = append(served, e)
		}
	}
	if len(served) != 1 {
		t.Fatalf("%d cache.served events", len(served))
	}
	if got, err := auditd.ParseCacheDetail(served[0].Detail); err != nil || *got != *c {
		t.Errorf("cache.served says %+v (%v); the item's result %+v", got, err, c)
	}
	h.reconcile(t, v.ID)
	h.finish(t, first.ID)
	h.reconcile(t, first.ID)
}

// A source that never answers but 503s (no Retry-After) is an outage, not a
// limit: the run still ends, every item failed once its attempts are spent
// or the breaker's probes keep failing, within the documented bound; and the
// learned pace is what it was.
func TestUnreachableSourceRunEnds(t *testing.T) {
	h := newHarness(t, `
name: unreachable
seed: 1
upstreams:
  - name: down
    path: /q
    outages:
      - {from: 0s, to: 24h, status: 503}
`)
	h.source(t, auditd.Source{ID: "down"}, "down")
	before, err := h.reg.Limits("down")
	if err != nil {
		t.Fatal(err)
	}
	var items []auditd.Item
	for i := range 20 {
		items = append(items, auditd.Item{Key: fmt.Sprintf("k%02d", i), SourceID: "down", Path: fmt.Sprintf("/q?n=%d", i)})
	}
	start := h.clk.Now()
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "down", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	v = h.finish(t, v.ID)
	took := h.clk.Now().Sub(start)
	t.Logf("ended %s after %v: %+v", v.Status, took, v.Counts)
	if v.Status != auditd.RunPartial || v.Counts.Failed != 20 {
		t.Fatalf("run ended %s with %+v, want partial with 20 failed", v.Status, v.Counts)
	}
	// The bound: OutageBound from when the breaker opened, a few seconds
	// of failures after the start, and one cooldown at most (the waiting
	// items hear of it at the next probe's end).
	if bound := fetch.OutageBound + time.Minute; took > bound {
		t.Fatalf("the run took %v of fake time, over the bound of %v", took, bound)
	}
	if after, _ := h.reg.Limits("down"); after != before {
		t.Fatalf("an outage moved the learned pace: %+v, was %+v", after, before)
	}
	h.reconcile(t, v.ID)
}

// A batch run whose items all have last good copies still moves the
// breaker's clock: during an outage they are served from the copies at
// once, and a run after it fetches them fresh, its first item past the
// cooldown the probe that closes the breaker. The batch path used to read
// the breaker's state and serve the copy without asking the gates, so the
// breaker never half-opened and every later run was served copies.
func TestBatchCopiesDoNotHoldTheBreakerOpen(t *testing.T) {
	h := newHarness(t, `
name: outage
seed: 1
upstreams:
  - name: county
    path: /q
    outages:
      - {from: 1m, to: 2m, status: 503}
`)
	h.source(t, auditd.Source{ID: "county", Limit: 100, Window: auditd.Duration(time.Second), MaxAttempts: 2}, "county")
	items := func() []auditd.Item {
		var out []auditd.Item
		for i := range 8 {
			out = append(out, auditd.Item{Key: fmt.Sprintf("k%d", i), SourceID: "county", Path: fmt.Sprintf("/q?n=%d", i)})
		}
		return out
	}
	submit := func(name string) auditd.RunView {
		v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: name, Items: items()})
		if err != nil {
			t.Fatal(err)
		}
		return h.finish(t, v.ID)
	}
	if v := submit("before"); v.Counts.Succeeded != 8 {
		t.Fatalf("before the outage: %+v", v.Counts)
	}
	h.clk.Set(epoch.Add(70 * time.Second))
	if v := submit("during"); v.Counts.Cached != 8 {
		t.Fatalf("during the outage: %+v, want every item from its copy", v.Counts)
	}
	if st, _ := h.lim.State("county"); st.Breaker != limiter.BreakerOpen {
		t.Fatalf("during the outage the breaker is %s", st.Breaker)
	}
	// While the probe is out, the other workers' items are still served
	// from their copies; once it succeeds, the rest go fresh.
	h.clk.Set(epoch.Add(3 * time.Minute))
	v := submit("after")
	if v.Counts.Succeeded == 0 || v.Counts.Succeeded+v.Counts.Cached != 8 {
		t.Fatalf("after the outage: %+v, want the probe's item and those after it fetched fresh", v.Counts)
	}
	if st, _ := h.lim.State("county"); st.Breaker != limiter.BreakerClosed {
		t.Fatalf("after the outage the breaker is %s", st.Breaker)
	}
	// Not reconciled: R5 recounts a run's breaker from closed, and this
	// run starts with it open (the earlier run's record says so).
	v = submit("later")
	if v.Counts.Succeeded != 8 {
		t.Fatalf("a run later: %+v, want every item fetched fresh", v.Counts)
	}
	h.reconcile(t, v.ID)
}
