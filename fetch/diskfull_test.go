package fetch_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

const steadyScenario = `
name: steady
seed: 5
upstreams:
  - name: counties
    path: /arcgis/rest/services/Parcels/FeatureServer/0/query
    limit: {shape: sliding_window, requests: 50, window: 1s}
    reject: {status: 429, retry_after: delta}
    collection: {kind: arcgis, records: 40, max_page: 50, layer: parcels}
`

// With the disk full for a while in the middle of a run, no request leaves
// unrecorded: dispatching pauses (and the run says so) while the ledger
// cannot write, and resumes when it can; every item ends, the run
// succeeds, and it reconciles.
func TestDiskFullPausesTheRun(t *testing.T) {
	h := newHarness(t, steadyScenario)
	h.source(t, auditd.Source{ID: "counties", Limit: 40, Window: auditd.Duration(time.Second), Concurrency: 4}, "counties")
	var items []auditd.Item
	for i := range 120 {
		items = append(items, auditd.Item{Key: fmt.Sprintf("c%03d", i), SourceID: "counties",
			Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%%3D1&f=json&n=%d", i)})
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "disk full", Items: items, Principal: "test"})
	if err != nil {
		t.Fatal(err)
	}
	received := func() int { return h.sim.Stats("counties").Received }
	if !h.drive(func() bool { return received() >= 30 }, 100_000) {
		t.Fatalf("only %d requests went out", received())
	}

	h.full.Store(true)
	var paused auditd.RunView
	deadline := time.Now().Add(10 * time.Second)
	for {
		h.step()
		if paused, err = h.runs.Run(context.Background(), v.ID); err != nil {
			t.Fatal(err)
		}
		if paused.Paused != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the run never said it is paused")
		}
	}
	// Whatever was on record before the disk filled may still go out; then
	// nothing does, whatever the clock does, until the disk takes writes.
	for range 20 {
		h.step()
	}
	head, _ := h.ledger.Head()
	before := received()
	for range 40 {
		h.step()
	}
	if got := received(); got != before {
		t.Errorf("%d requests went out while the disk was full", got-before)
	}
	if now, _ := h.ledger.Head(); now != head {
		t.Errorf("the ledger grew from %d to %d while the disk was full", head, now)
	}
	t.Logf("paused after %d requests: %s", before, paused.Paused.Reason)

	h.full.Store(false)
	v = h.finish(t, v.ID)
	if v.Status != auditd.RunSucceeded || v.Counts.Succeeded != len(items) || v.Counts.Pending != 0 {
		t.Fatalf("run ended %s with %+v", v.Status, v.Counts)
	}
	if v.Paused != nil {
		t.Errorf("a finished run says it is paused: %+v", v.Paused)
	}
	events := h.events(t, v.ID)
	if got, want := count(events, auditd.EventDispatch, ""), received(); got != want {
		t.Errorf("%d dispatches on record, the upstream received %d", got, want)
	}
	if n := count(events, auditd.EventItemFinished, ""); n != len(items) {
		t.Errorf("%d item.finished for %d items", n, len(items))
	}
	h.reconcile(t, v.ID)
}
