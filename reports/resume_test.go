package reports_test

import (
	"context"
	"testing"
)

// A crash between an item's staged payload and its item.finished makes the
// resumed loop fetch and stage it again: after run.resumed that retry of a
// request whose last outcome was a success, and the second payload.staged,
// are what a restart does, not a broken identity.
func TestResumedRunRefetchesUnfinishedItem(t *testing.T) {
	evs := loadFixture(t, "resumed.ndjson")
	rep, err := newReconciler(newMemLedger(evs)).Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if c.Status == "fail" {
			t.Errorf("%s failed: expected %d actual %d offending %v", c.ID, c.Expected, c.Actual, c.Offending)
		}
	}
	if !rep.Balanced {
		t.Error("not balanced")
	}

	// Without the restart the same events are a retry after a success and a
	// payload staged twice: R3 and R6 fail.
	var cut = evs[:0:0]
	for _, e := range evs {
		if e.Type != "run.resumed" {
			cut = append(cut, e)
		}
	}
	rep, err = newReconciler(newMemLedger(cut)).Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	failed := map[string]bool{}
	for _, id := range rep.Failed() {
		failed[id] = true
	}
	if !failed["R3"] || !failed["R6"] {
		t.Errorf("without run.resumed, failed %v; want R3 and R6 among them", rep.Failed())
	}
}
