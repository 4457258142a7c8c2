package reports_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

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

// A fleet run's workbook holds every node's rows of every sheet behind
// the node's name, cell for cell as the node's own workbook has them, the
// fleet's checks after the nodes' reconciliations, and a Manifest whose
// hashes are those of its rows.
func TestWriteFleetEvidence(t *testing.T) {
	node, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	one := readWorkbook(t, node)
	parts := []reports.FleetWorkbook{{Node: "b", Book: bytes.NewReader(node), Size: int64(len(node))},
		{Node: "a", Book: bytes.NewReader(node), Size: int64(len(node))}}
	rep := reports.CombineFleet(fixtureRun, []reports.FleetPart{nodePart(t, "a", 3), nodePart(t, "b", 4)})
	var buf bytes.Buffer
	if err := reports.WriteFleetEvidence(&buf, reports.FleetEvidence{RunID: fixtureRun, Parts: parts, Report: rep, GeneratedAt: generatedAt}); err != nil {
		t.Fatal(err)
	}
	wb := readWorkbook(t, buf.Bytes())
	if want := one.names; !slices.Equal(wb.names, want) {
		t.Fatalf("the fleet workbook's sheets: %q, want a run workbook's %q", wb.names, want)
	}
	for _, name := range one.names[1:] {
		rows, own := wb.sheets[name], one.sheets[name]
		if rows[0][0] != reports.FleetNodeColumn || !slices.Equal(rows[0][1:], own[0]) {
			t.Errorf("%s: header %q, want Node then %q", name, rows[0], own[0])
		}
		for i, node := range []string{"a", "b"} {
			for j, r := range own[1:] {
				got := rows[1+i*(len(own)-1)+j]
				if got[0] != node || !slices.Equal(got[1:], r) {
					t.Errorf("%s, node %s's row %d: %q, want %q", name, node, j+2, got, r)
				}
			}
		}
		extra := len(rows) - 1 - 2*(len(own)-1)
		if name == reports.SheetReconciliation {
			if want := len(rep.Checks) + len(rep.Sources[0].Checks)*len(rep.Sources); extra != want || rows[len(rows)-1][0] != reports.FleetRowsNode {
				t.Errorf("Reconciliation: %d rows after the nodes', want the fleet's %d checks", extra, want)
			}
		} else if extra != 0 {
			t.Errorf("%s: %d rows more than the nodes'", name, extra)
		}
	}
	// Every cell as stored, a date's serial to the digit.
	raw := func(b []byte, sheet string) [][]string {
		f, err := excelize.OpenReader(bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		rows, err := f.GetRows(sheet, excelize.Options{RawCellValue: true})
		if err != nil {
			t.Fatal(err)
		}
		return rows
	}
	for _, sheet := range []string{reports.SheetRuns, reports.SheetDispatches, reports.SheetWaits} {
		own, fleet := raw(node, sheet), raw(buf.Bytes(), sheet)
		for j, r := range own[1:] {
			if got := fleet[1+j]; !slices.Equal(got[1:], r) {
				t.Errorf("%s row %d as stored: %q, want %q", sheet, j+2, got[1:], r)
			}
		}
	}
	// The Manifest: each node's key, and each sheet's hash over its rows.
	fields := map[string][]string{}
	for _, r := range wb.sheets[reports.SheetManifest][1:] {
		fields[r[0]] = r
	}
	if got := fields["Node a: "+reports.ManifestFieldPublicKey]; got == nil || got[1] != (fixedCheckpoint{}).PublicKey() {
		t.Errorf("the Manifest's key of node a: %q", got)
	}
	for _, name := range wb.names[1:] {
		if got, want := fields[name], rowsHash(wb.sheets[name]); got == nil || got[2] != want {
			t.Errorf("the Manifest's hash of %s: %q, want %s", name, got, want)
		}
	}
	// A node whose workbook is not a run's is named.
	bad := []reports.FleetWorkbook{parts[0], {Node: "c", Book: bytes.NewReader(buf.Bytes()), Size: int64(buf.Len())}}
	if err := reports.WriteFleetEvidence(io.Discard, reports.FleetEvidence{RunID: fixtureRun, Parts: bad}); err == nil || !strings.Contains(err.Error(), "node c") {
		t.Errorf("a node's workbook with a Node column already: %v", err)
	}
}

// R9 of a fleet run holds every node's dispatches together to the limit
// the fleet shares: two nodes each within it, together over it, fail R9
// of the total and of the source, naming the node and event that passed
// it; parts that carry no dispatches leave R9 the nodes' sum.
func TestCombineFleetR9(t *testing.T) {
	a, b := nodePart(t, "a", 10), nodePart(t, "b", 10)
	src := a.Report.Sources[0].SourceID
	limit := []reports.FleetLimit{{Source: src, Limit: 4, Window: int64(time.Second)}}
	at := func(ms ...int64) []int64 {
		out := make([]int64, len(ms))
		for i, m := range ms {
			out[i] = 1_800_000_000_000_000_000 + m*int64(time.Millisecond)
		}
		return out
	}
	// a dispatches at 0, 300, 600 ms; b at 100, 400, 2000 ms: the window
	// ending at a's 600 ms holds 5.
	a.Dispatches = &reports.PartDispatches{Limits: limit, Sources: []reports.SourceDispatches{{Source: src, At: at(0, 300, 600), Seq: []uint64{3, 7, 9}}}}
	b.Dispatches = &reports.PartDispatches{Limits: limit, Sources: []reports.SourceDispatches{{Source: src, At: at(100, 400, 2000), Seq: []uint64{4, 8, 12}}}}
	for _, p := range []*reports.FleetPart{&a, &b} { // as a node's API sends it
		raw, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		*p = reports.FleetPart{}
		if err := json.Unmarshal(raw, p); err != nil {
			t.Fatal(err)
		}
	}
	rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, b})
	r9 := check(rep, reports.R9)
	if rep.Balanced || r9.Pass || r9.Expected-r9.Actual != 1 || !strings.Contains(r9.Note, "5 dispatches") || !strings.Contains(r9.Note, "node a's event 9") {
		t.Errorf("R9 over two nodes together over the limit: balanced %t, %+v", rep.Balanced, r9)
	}
	if s := rep.Sources[0]; s.Balanced || !strings.Contains(fmt.Sprint(s.Checks), "node a's event 9") {
		t.Errorf("the source's R9: %+v", s)
	}
	if rep.Parts[0].Dispatches != nil {
		t.Error("the report repeats the parts' dispatches")
	}
	a.Dispatches.Limits[0].Limit, b.Dispatches.Limits[0].Limit = 5, 6 // the same dispatches within 5, the strictest
	if rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, b}); !rep.Balanced {
		t.Errorf("R9 within the limit: %v %+v", rep.Failed(), check(rep, reports.R9))
	}
	a.Dispatches, b.Dispatches = nil, nil
	if rep := reports.CombineFleet(synthRunID, []reports.FleetPart{a, b}); !rep.Balanced {
		t.Errorf("parts without dispatches: %v", rep.Failed())
	}
}

// The merge reads node workbooks with a byte scanner of the sheets' XML:
// it reads a run's workbook, and a fleet workbook, cell for cell as
// excelize does.
func TestFleetMergeReadsAsExcelize(t *testing.T) {
	node, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	x := reports.NewExporter(reports.NewReconciler(newSynthReader(synthRun{items: 200, pages: 2, throttleEvery: 7})))
	x.Ledger = fixedCheckpoint{}
	synth, _ := export(t, x, reports.Request{ExportID: "synth", RunIDs: []string{synthRunID}, Filters: "run " + synthRunID})
	var fleet bytes.Buffer
	parts := []reports.FleetWorkbook{{Node: "a", Book: bytes.NewReader(node), Size: int64(len(node))},
		{Node: "b", Book: bytes.NewReader(synth), Size: int64(len(synth))}}
	rep := reports.CombineFleet(fixtureRun, []reports.FleetPart{nodePart(t, "a", 3), nodePart(t, "b", 4)})
	if err := reports.WriteFleetEvidence(&fleet, reports.FleetEvidence{RunID: fixtureRun, Parts: parts, Report: rep, GeneratedAt: generatedAt}); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"clean": node, "synth": synth, "fleet": fleet.Bytes()} {
		if err := reports.SameRowsAsExcelize(b); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// A fleet sheet past its row limit continues on numbered sheets, each with
// the header, the rows in order across them, each hashed in the Manifest;
// node workbooks split the same way merge whole.
func TestWriteFleetEvidenceRowLimit(t *testing.T) {
	x := newExporter(newMemLedger(loadFixture(t, "clean.ndjson")))
	x.RowLimit = 4
	node, _ := export(t, x, cleanRequest())
	own := readWorkbook(t, node)
	parts := []reports.FleetWorkbook{{Node: "b", Book: bytes.NewReader(node), Size: int64(len(node))},
		{Node: "a", Book: bytes.NewReader(node), Size: int64(len(node))}}
	rep := reports.CombineFleet(fixtureRun, []reports.FleetPart{nodePart(t, "a", 3), nodePart(t, "b", 4)})
	var buf bytes.Buffer
	if err := reports.WriteFleetEvidence(&buf, reports.FleetEvidence{RunID: fixtureRun, Parts: parts, Report: rep, RowLimit: 5}); err != nil {
		t.Fatal(err)
	}
	wb := readWorkbook(t, buf.Bytes())
	// population is a sheet's rows across its continuations, and the parts.
	population := func(w workbook, name string) (header []string, rows [][]string, names []string) {
		for n := 1; ; n++ {
			part := reports.ContinuationName(name, n)
			sheet, ok := w.sheets[part]
			if !ok {
				return header, rows, names
			}
			header, rows, names = sheet[0], append(rows, sheet[1:]...), append(names, part)
		}
	}
	fields := map[string][]string{}
	for _, r := range wb.sheets[reports.SheetManifest][1:] {
		fields[r[0]] = r
	}
	for _, name := range []string{reports.SheetDispatches, reports.SheetWaits, reports.SheetReconciliation} {
		_, ownRows, _ := population(own, name)
		header, rows, names := population(wb, name)
		if len(names) < 2 {
			t.Errorf("%s: %d sheets, want it continued", name, len(names))
		}
		var want [][]string
		for _, n := range []string{"a", "b"} {
			for _, r := range ownRows {
				want = append(want, append([]string{n}, r...))
			}
		}
		if len(rows) < len(want) || !slices.EqualFunc(rows[:len(want)], want, slices.Equal) || header[0] != reports.FleetNodeColumn {
			t.Errorf("%s: the fleet sheets hold %d rows, not the nodes' %d in order", name, len(rows), len(want))
		}
		for _, part := range names {
			sheet := wb.sheets[part]
			if len(sheet) > 5 || !slices.Equal(sheet[0], header) {
				t.Errorf("%s: %d rows (limit 5), header %q", part, len(sheet), sheet[0])
			}
			if got := fields[part]; got == nil || got[1] != fmt.Sprint(len(sheet)-1) || got[2] != rowsHash(sheet) {
				t.Errorf("the Manifest's row of %s: %q, want %d rows, hash %s", part, got, len(sheet)-1, rowsHash(sheet))
			}
		}
	}
}

// A node workbook holding a cell a run's export does not write (here a
// shared string, as a spreadsheet program saves one) is not merged: the
// error names the node and the sheet.
func TestWriteFleetEvidenceRefusesOtherCells(t *testing.T) {
	node, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	f, err := excelize.OpenReader(bytes.NewReader(node))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.SetCellStr(reports.SheetDispatches, "D2", "edited"); err != nil {
		t.Fatal(err)
	}
	var edited bytes.Buffer
	if err := f.Write(&edited); err != nil {
		t.Fatal(err)
	}
	f.Close()
	parts := []reports.FleetWorkbook{{Node: "a", Book: bytes.NewReader(node), Size: int64(len(node))},
		{Node: "b", Book: bytes.NewReader(edited.Bytes()), Size: int64(edited.Len())}}
	err = reports.WriteFleetEvidence(io.Discard, reports.FleetEvidence{RunID: fixtureRun, Parts: parts})
	if err == nil || !strings.Contains(err.Error(), "node b: sheet "+reports.SheetDispatches) || !strings.Contains(err.Error(), `type "s"`) {
		t.Errorf("a node workbook with a shared string: %v", err)
	}
}
