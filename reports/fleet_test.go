package reports_test

import (
	"context"
	"strings"
	"testing"

	"github.com/auditd/auditd/reports"
)

// nodePart reconciles a small balanced run as one node's part, logged in
// the fleet log up to its last event.
func nodePart(t *testing.T, node string, items int) reports.FleetPart {
	t.Helper()
	rep, err := reports.NewReconciler(newSynthReader(synthRun{items: items, pages: 2, throttleEvery: 5})).Reconcile(context.Background(), synthRunID, nil)
	if err != nil || !rep.Balanced {
		t.Fatalf("node %s's part: %v %v", node, err, rep.Failed())
	}
	return reports.FleetPart{Node: node, Report: rep, Logged: rep.Run.LastSeq, FleetLeaf: 1}
}

func check(rep *reports.FleetReport, id string) reports.Check {
	for _, c := range rep.Checks {
		if c.ID == id {
			return c
		}
	}
	return reports.Check{}
}

func TestCombineFleet(t *testing.T) {
	a, b, c := nodePart(t, "a", 10), nodePart(t, "b", 20), nodePart(t, "c", 5)
	t.Run("Balanced", func(t *testing.T) {
		rep := reports.CombineFleet(synthRunID, []reports.FleetPart{c, a, b})
		want := a.Report.Counts.Dispatches + b.Report.Counts.Dispatches + c.Report.Counts.Dispatches
		if !rep.Balanced || rep.Status != "succeeded" || rep.Counts.Dispatches != want || rep.Parts[0].Node != "a" {
			t.Fatalf("balanced %t, status %s, dispatches %d (want %d), first part %s; failed %v", rep.Balanced, rep.Status, rep.Counts.Dispatches, want, rep.Parts[0].Node, rep.Failed())
		}
		if r2 := check(rep, "R2"); r2.Expected != want || r2.Actual != want || !r2.Pass {
			t.Errorf("R2 over the fleet: %+v", r2)
		}
		if len(rep.Sources) == 0 || !rep.Sources[0].Balanced {
			t.Errorf("sources: %+v", rep.Sources)
		}
	})
	t.Run("PartMissing", func(t *testing.T) {
		rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, {Node: "b", Error: "node b: connection refused"}, c})
		if f1 := check(rep, "F1"); rep.Balanced || f1.Pass || f1.Expected != 3 || f1.Actual != 2 || f1.Note != "no part from b" || rep.Status != "missing" {
			t.Errorf("a part missing: balanced %t, status %s, F1 %+v", rep.Balanced, rep.Status, f1)
		}
	})
	t.Run("NotInFleetLog", func(t *testing.T) {
		late := b
		late.Logged = b.Report.Run.LastSeq - 1
		rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, late, c})
		if f2 := check(rep, "F2"); rep.Balanced || f2.Pass || !strings.Contains(f2.Note, "b (events to") {
			t.Errorf("a part past its node's logged checkpoint: F2 %+v", f2)
		}
	})
	t.Run("NodeFails", func(t *testing.T) {
		bad := *b.Report
		bad.Checks = append([]reports.Check(nil), bad.Checks...)
		bad.Checks[1].Status, bad.Checks[1].Pass, bad.Checks[1].Actual, bad.Checks[1].Offending = reports.StatusFail, false, bad.Checks[1].Actual-1, []uint64{42}
		bad.Balanced = false
		bp := b
		bp.Report = &bad
		rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, bp, c})
		r2 := check(rep, "R2")
		if rep.Balanced || r2.Pass || !strings.Contains(r2.Note, "failed on node b") || !strings.Contains(r2.Note, "42") || strings.Contains(r2.Note, "node a") {
			t.Errorf("R2 failing on node b: %+v", r2)
		}
	})
}
