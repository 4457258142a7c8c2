package reports_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

// A run staging more payloads than wait for their re-hash at once (the
// scan pauses for them in batches): two missing payloads, far apart, both
// fail R6 at their events, and the note names the first in ledger order.
func TestReconcile_PayloadsVerifiedInBatches(t *testing.T) {
	const items = 20_000 // a pause at 16,384 (pendingBatch)
	sum := func(i int) string {
		s := sha256.Sum256(fmt.Appendf(nil, "payload %d", i))
		return hex.EncodeToString(s[:])
	}
	evs := []auditd.Event{{Type: auditd.EventRunStarted, RunID: fixtureRun}}
	for i := range items {
		evs = append(evs, auditd.Event{Type: auditd.EventItemQueued, RunID: fixtureRun, SourceID: "gis", ItemKey: fmt.Sprint(i)})
	}
	staged := make([]uint64, items) // seq of each item's payload.staged
	staged0 := uint64(len(evs)) + 3
	for i := range items {
		k := fmt.Sprint(i)
		evs = append(evs,
			auditd.Event{Type: auditd.EventDispatch, RunID: fixtureRun, SourceID: "gis", ItemKey: k, Attempt: 1},
			auditd.Event{Type: auditd.EventResponse, RunID: fixtureRun, SourceID: "gis", ItemKey: k, Attempt: 1, Status: 200, Outcome: auditd.OutcomeSuccess},
			auditd.Event{Type: auditd.EventPayloadStaged, RunID: fixtureRun, SourceID: "gis", ItemKey: k, PayloadHash: sum(i)},
			auditd.Event{Type: auditd.EventItemFinished, RunID: fixtureRun, SourceID: "gis", ItemKey: k, Outcome: auditd.ItemSucceeded})
		staged[i] = staged0 + 4*uint64(i)
	}
	evs = append(evs, auditd.Event{Type: auditd.EventRunFinished, RunID: fixtureRun, Outcome: auditd.Outcome(auditd.RunSucceeded)})
	l := newMemLedger(evs)
	if e := l.Events[staged[items-1]-1]; e.Type != auditd.EventPayloadStaged || e.ItemKey != fmt.Sprint(items-1) {
		t.Fatalf("event %d is %s of %s, not the last payload staged", e.Seq, e.Type, e.ItemKey)
	}

	payloads := reportstest.PayloadSet{}
	for i := range items {
		payloads[sum(i)] = true
	}
	missing := []int{items - 5, 7}
	for _, i := range missing {
		delete(payloads, sum(i))
	}
	r := newReconciler(l)
	r.Hash, r.Payloads = nil, payloads // R8 checks links only: the chain is not what is tested
	rep, err := r.Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := rep.Checks[5]
	if c.Status != reports.StatusFail || c.Expected != items || c.Actual != items-2 {
		t.Errorf("R6 %s, expected %d actual %d; want a failure, %d and %d", c.Status, c.Expected, c.Actual, items, items-2)
	}
	if want := []uint64{staged[7], staged[items-5]}; !slices.Equal(c.Offending, want) {
		t.Errorf("R6 offending %v, want %v", c.Offending, want)
	}
	if want := "first payload error: staged payload does not hash to " + sum(7); !strings.Contains(c.Note, want) {
		t.Errorf("R6 note %q, want it to hold %q", c.Note, want)
	}
	for i, ch := range rep.Checks {
		if i != 5 && ch.Status == reports.StatusFail {
			t.Errorf("%s fails too: %q", ch.ID, ch.Note)
		}
	}
}
