package fetch_test

import (
	"context"
	"fmt"
	"net/http"
	"sync/atomic"
	"syscall"
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

const throttleScenario = `
name: throttle
seed: 3
upstreams:
  - name: county
    path: /q
    limit: {shape: fixed_window, requests: 3, window: 1s}
    reject: {status: 429, retry_after: delta}
`

// A throttled request's retry records the wait that honoured its throttle
// (R4) even when the gates had nothing left to hold it back for: here the
// disk refuses the record after the throttle's for longer than the pause,
// so the pause has run out by the time the request is back at the gates.
func TestThrottleWaitRecordedWhenThePauseRanOut(t *testing.T) {
	h := newHarness(t, throttleScenario)
	h.source(t, auditd.Source{ID: "county", Limit: 10, Window: auditd.Duration(time.Second), Concurrency: 1}, "county")
	// The first commit after the upstream's first 429 is the throttle's;
	// the ones after it (what the response taught the registry first) are
	// refused until the test lets them through.
	var phase atomic.Int32
	fault := func() error {
		switch phase.Load() {
		case 0:
			if h.sim.Stats("county").ByStatus[http.StatusTooManyRequests] > 0 {
				phase.Store(1)
			}
		case 1:
			phase.Store(2)
			return syscall.ENOSPC
		case 2:
			return syscall.ENOSPC
		}
		return nil
	}
	h.fault.Store(&fault)
	var items []auditd.Item
	for i := range 6 {
		items = append(items, auditd.Item{Key: fmt.Sprint("q", i), SourceID: "county", Path: fmt.Sprint("/q?n=", i)})
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "throttled", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	// Driven by the phase alone until the disk refuses the record: the
	// registry holds its lock while it appends, so a view of the run (its
	// finish estimate asks the registry) would wait for the disk too.
	if !h.drive(func() bool { return phase.Load() == 2 }, 100_000) {
		t.Fatalf("the disk stall never came (phase %d): the test proves nothing", phase.Load())
	}
	// The stall lasts longer than the pause; then the disk takes writes.
	h.clk.Advance(3 * time.Second)
	phase.Store(3)
	v = h.finish(t, v.ID)
	events := h.events(t, v.ID)
	var throttle *auditd.Event
	for i := range events {
		e := &events[i]
		if e.Type == auditd.EventThrottle && throttle == nil {
			throttle = e
			continue
		}
		if throttle == nil || e.ItemKey != throttle.ItemKey || e.Page != throttle.Page {
			continue
		}
		if e.Type == auditd.EventDispatch {
			t.Fatalf("dispatch %d retried throttle %d with no wait recorded between them", e.Seq, throttle.Seq)
		}
		if e.Type == auditd.EventWait {
			if e.Attempt != throttle.Attempt+1 || e.Actual < throttle.Wait || e.Gate != "pause" {
				t.Errorf("wait %d after throttle %d: %+v", e.Seq, throttle.Seq, *e)
			}
			break
		}
	}
	if throttle == nil {
		t.Fatal("no throttle")
	}
	h.reconcile(t, v.ID)
}
