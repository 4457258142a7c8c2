package reports_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/auditd/auditd/reports"
)

// BenchmarkFleetEvidence merges three node workbooks of a 10k-dispatch
// run each (the fleet workbook of a 30k-dispatch fleet run), next to the
// export of one such node workbook.
func BenchmarkFleetEvidence(b *testing.B) {
	run := synthRun{items: 2_451, pages: 4, throttleEvery: 50}
	x := reports.NewExporter(reports.NewReconciler(newSynthReader(run)))
	x.Ledger = fixedCheckpoint{}
	req := reports.Request{ExportID: "bench", RunIDs: []string{synthRunID}, Filters: "run " + synthRunID}
	var node bytes.Buffer
	if _, err := x.Export(context.Background(), &node, req); err != nil {
		b.Fatal(err)
	}
	b.Run("node", func(b *testing.B) {
		for b.Loop() {
			if _, err := x.Export(context.Background(), io.Discard, req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fleet3", func(b *testing.B) {
		book := node.Bytes()
		parts := []reports.FleetWorkbook{{Node: "a", Book: bytes.NewReader(book), Size: int64(len(book))},
			{Node: "b", Book: bytes.NewReader(book), Size: int64(len(book))}, {Node: "c", Book: bytes.NewReader(book), Size: int64(len(book))}}
		for b.Loop() {
			if err := reports.WriteFleetEvidence(io.Discard, reports.FleetEvidence{RunID: synthRunID, Parts: parts}); err != nil {
				b.Fatal(err)
			}
		}
	})
}
