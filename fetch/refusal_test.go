package fetch_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fetch"
)

// fixedWindowScenario is a fixed window of 3 requests per 10 s answering a
// plain 429 beyond it, the same advertising its quota (X-RateLimit-Limit,
// Remaining, Reset in seconds), and one that admits a single request a day.
const fixedWindowScenario = `
name: fixed-window
seed: 1
upstreams:
  - name: window
    path: /q
    limit: {shape: fixed_window, requests: 3, window: 10s}
    reject: {status: 429, retry_after: none}
  - name: quota
    path: /q
    limit: {shape: fixed_window, requests: 3, window: 10s}
    reject: {status: 429, retry_after: none, advertise: x_ratelimit}
  - name: daily
    path: /q
    limit: {shape: fixed_window, requests: 1, window: 24h}
    reject: {status: 429, retry_after: none}
`

// A fixed window refuses every request until it resets, whatever the pace:
// those refusals spend none of an item's attempts. Against a real fixed
// window, on default learning, items meet more refusals than MaxAttempts
// and all succeed; every refusal is on record as a throttle. The same with
// the quota advertised: a 429 with Remaining 0 and a Reset.
func TestFixedWindowRefusalsSpendNoAttempts(t *testing.T) {
	// Learning the advertised quota paces it well: one refusal or so, so
	// one attempt is all its items have.
	for upstream, maxAttempts := range map[string]int{"window": 2, "quota": 1} {
		t.Run(upstream, func(t *testing.T) { testWindowRefusals(t, upstream, maxAttempts) })
	}
}

func testWindowRefusals(t *testing.T, upstream string, maxAttempts int) {
	h := newHarness(t, fixedWindowScenario)
	h.source(t, auditd.Source{ID: "w", MaxAttempts: maxAttempts}, upstream)
	var items []auditd.Item
	for i := range 24 {
		items = append(items, auditd.Item{Key: fmt.Sprint("i", i), SourceID: "w", Path: fmt.Sprint("/q?n=", i)})
	}
	run, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "fixed window", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	v := h.finish(t, run.ID)
	events := h.events(t, run.ID)
	h.reconcile(t, run.ID)
	if v.Status != auditd.RunSucceeded || v.Counts.Succeeded != len(items) {
		for _, e := range events {
			if e.Type == auditd.EventItemFinished && e.Outcome != auditd.ItemSucceeded {
				t.Logf("%s: %s", e.ItemKey, e.Reason)
			}
		}
		t.Fatalf("run %s, %+v: want all %d items to succeed", v.Status, v.Counts, len(items))
	}
	throttles, dispatches := map[string]int{}, map[string]int{}
	for _, e := range events {
		switch e.Type {
		case auditd.EventThrottle:
			throttles[e.ItemKey]++
		case auditd.EventDispatch:
			dispatches[e.ItemKey]++
		}
	}
	most := ""
	for key, n := range throttles {
		if most == "" || n > throttles[most] {
			most = key
		}
	}
	if throttles[most] < maxAttempts || dispatches[most] <= maxAttempts {
		t.Fatalf("no item met %d refusals or more and succeeded after them (throttles by item %v): the test proves nothing", maxAttempts, throttles)
	}
	t.Logf("%d of %d items refused; %s met %d refusals in %d dispatches", len(throttles), len(items), most, throttles[most], dispatches[most])
	if got, want := count(events, auditd.EventDispatch, "w"), h.sim.Stats(upstream).Received; got != want {
		t.Errorf("%d dispatches recorded, upstream received %d", got, want)
	}
}

// An upstream whose window never resets (within the run) refuses for good:
// the page waits out the refusals without spending its attempts, and ends
// once they have lasted RefusalBound, with a reason that says so.
func TestRefusalsThatNeverEndEndTheItem(t *testing.T) {
	h := newHarness(t, fixedWindowScenario)
	h.source(t, auditd.Source{ID: "d", MaxAttempts: 2}, "daily")
	ctx := context.Background()
	run, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "daily", Items: []auditd.Item{
		{Key: "first", SourceID: "d", Path: "/q?n=1"},
		{Key: "second", SourceID: "d", Path: "/q?n=2"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	start := h.clk.Now()
	v := h.finish(t, run.ID)
	events := h.events(t, run.ID)
	h.reconcile(t, run.ID)
	if v.Counts.Succeeded != 1 || v.Counts.Failed != 1 {
		t.Fatalf("run %s, %+v: want the day's one request to succeed and the other item to fail", v.Status, v.Counts)
	}
	var failed *auditd.Event
	for i, e := range events {
		if e.Type == auditd.EventItemFinished && e.Outcome == auditd.ItemFailed {
			failed = &events[i]
		}
	}
	if !strings.HasPrefix(failed.Reason, "refused for ") || !strings.Contains(failed.Reason, "spent window or quota that never reset") {
		t.Errorf("failed with %q; want the refusal bound named", failed.Reason)
	}
	refusals := 0
	for _, e := range events {
		if e.Type == auditd.EventThrottle && e.ItemKey == failed.ItemKey {
			refusals++
		}
	}
	if refusals <= 2 {
		t.Errorf("the item met %d refusals: it ended on its attempts, not on the bound", refusals)
	}
	if took := failed.Time.Sub(start); took < fetch.RefusalBound || took > fetch.RefusalBound+5*time.Minute {
		t.Errorf("the item ended %v after the run began; want soon after RefusalBound (%v)", took, fetch.RefusalBound)
	}
	t.Logf("%s: %s (%d refusals)", failed.ItemKey, failed.Reason, refusals)
}

// Refusals of a spent window recorded before a restart spend none of the
// page's attempts after it either: the item resumes waiting for the window
// rather than ending on attempts it never spent, and the refusal bound
// still ends it.
func TestWindowRefusalsSurviveARestart(t *testing.T) {
	h := newHarness(t, fixedWindowScenario)
	const maxAttempts = 2
	h.source(t, auditd.Source{ID: "d", MaxAttempts: maxAttempts}, "daily")
	ctx := context.Background()
	run, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "daily", Items: []auditd.Item{
		{Key: "first", SourceID: "d", Path: "/q?n=1"},
		{Key: "second", SourceID: "d", Path: "/q?n=2"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(func() bool { return count(h.events(t, run.ID), auditd.EventThrottle, "d") > maxAttempts }, 100_000) {
		t.Fatalf("no more than %d refusals before the restart", maxAttempts)
	}
	h.close(t)
	h.open(t, h.dir)
	v := h.finish(t, run.ID)
	h.reconcile(t, run.ID)
	if v.Counts.Succeeded != 1 || v.Counts.Failed != 1 {
		t.Fatalf("run %s, %+v: want the day's one request to succeed and the other item to fail", v.Status, v.Counts)
	}
	for _, e := range h.events(t, run.ID) {
		if e.Type == auditd.EventItemFinished && e.Outcome == auditd.ItemFailed && !strings.HasPrefix(e.Reason, "refused for ") {
			t.Errorf("%s failed with %q after the restart; want the refusal bound named", e.ItemKey, e.Reason)
		}
	}
}
