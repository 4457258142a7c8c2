package reports

import (
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd"
)

// FleetNodeColumn is the first column of every sheet of a fleet run's
// evidence workbook but the Manifest: the node a row came from.
const FleetNodeColumn = "Node"

// FleetRowsNode is the Node of the Reconciliation rows that are the
// fleet's own checks (R1 to R10 over the sum, F1, F2), after the nodes'.
const FleetRowsNode = "fleet"

// FleetWorkbook is one node's evidence workbook of its part of a fleet
// run (GET /v1/runs/{id}/evidence.xlsx on that node).
type FleetWorkbook struct {
	Node string
	Book io.ReaderAt
	Size int64
}

// FleetEvidence says what a fleet run's evidence workbook covers.
type FleetEvidence struct {
	RunID string
	// Parts are the nodes' workbooks, one per node holding a part.
	Parts []FleetWorkbook
	// Report is the fleet reconciliation; its checks end the
	// Reconciliation sheet, as node FleetRowsNode.
	Report *FleetReport
	// GeneratedAt is recorded in the Manifest (zero: nothing).
	GeneratedAt time.Time
	// TmpDir holds the temporary files of the ZIP and of the copied rows
	// ("" is os.TempDir).
	TmpDir string
	// RowLimit caps the rows of a sheet, its header included; a sheet
	// continues on "Name (2)" and so on (0 is DefaultRowLimit).
	RowLimit int
}

// fleetSheets are the populations a fleet workbook may carry, in order.
var fleetSheets = append(slices.Clone(sheetOrder[1:]), SheetRetention)

var fleetSpecs = func() map[string]sheetSpec {
	m := map[string]sheetSpec{}
	for _, s := range append(eventSpecs[:], specAward, specRuns, specControl, specReconciliation, specCached, specRetention) {
		m[s.name] = sheetSpec{s.name, append([]column{{FleetNodeColumn, 12}}, s.columns...)}
	}
	return m
}()

// WriteFleetEvidence writes the evidence workbook of a fleet run: the
// sheets a run's workbook has, each holding every node's rows, node after
// node in name order, behind a Node column; the Reconciliation sheet ends
// with the fleet's checks. The Manifest names each node's signed
// checkpoint and public key, which its rows are proven against (the fleet
// pack), and each sheet's rows and SHA-256 as a run's Manifest does.
// Nothing is written to w unless every node's workbook was read whole; a
// node's workbook whose sheet has other columns than a run's, or a cell a
// run's export does not write (copyable), is an error naming the node and
// the sheet. Node rows are copied as stored (fleet_copy.go).
func WriteFleetEvidence(w io.Writer, fe FleetEvidence) error {
	parts := slices.Clone(fe.Parts)
	slices.SortFunc(parts, func(a, b FleetWorkbook) int { return strings.Compare(a.Node, b.Node) })
	books := make([]*nodeBook, len(parts))
	for i, p := range parts {
		b, err := openNodeBook(p.Book, p.Size)
		if err != nil {
			return fmt.Errorf("node %s: its evidence workbook: %w", p.Node, err)
		}
		books[i] = b
	}
	out := excelize.NewFile()
	defer out.Close()
	id := "fleet run=" + fe.RunID
	if err := docProps(out, "Evidence: "+id, id, fe.GeneratedAt); err != nil {
		return err
	}
	st, err := newStyles(out)
	if err != nil {
		return err
	}
	if err := out.SetSheetName("Sheet1", SheetManifest); err != nil {
		return err
	}
	rc := newRowCopier(fe.TmpDir)
	defer rc.close()
	var stats []SheetStat
	for _, name := range fleetSheets {
		s, err := fleetSheet(out, st, rc, name, parts, books, fe)
		if err != nil {
			return err
		}
		stats = append(stats, s...)
	}
	if err := fleetManifest(out, st, fe, parts, books, stats); err != nil {
		return err
	}
	if err := rc.flush(); err != nil {
		return err
	}
	return writeFleetWorkbook(out, w, fe.TmpDir, rc.rows)
}

// writeFleetWorkbook writes out as writeWorkbook does, with the node rows
// rc copied spliced into their sheets.
func writeFleetWorkbook(out *excelize.File, w io.Writer, tmpDir string, rows map[string]*os.File) error {
	z, err := newSortedZip(w, tmpDir)
	if err != nil {
		return err
	}
	defer z.discard()
	out.SetZipWriter(func(io.Writer) excelize.ZipWriter { return &splicedZip{ZipWriter: z, rows: rows} })
	if _, err := out.WriteTo(io.Discard); err != nil {
		return fmt.Errorf("write workbook: %w", err)
	}
	return nil
}

// fleetSheet writes population name from every node's workbook (the
// Retention sheet only when a node has one).
func fleetSheet(out *excelize.File, st styles, rc *rowCopier, name string, parts []FleetWorkbook, books []*nodeBook, fe FleetEvidence) ([]SheetStat, error) {
	if name == SheetRetention && !slices.ContainsFunc(books, func(b *nodeBook) bool { return b.has(name) }) {
		return nil, nil
	}
	spec := fleetSpecs[name]
	limit := fe.RowLimit
	if limit <= 0 {
		limit = DefaultRowLimit
	}
	sw, err := newSheetWriter(out, st, spec, limit)
	if err != nil {
		return nil, err
	}
	for i, f := range books {
		for n := 1; ; n++ {
			sheet := partName(name, n)
			if !f.has(sheet) {
				break
			}
			if err := copyRows(sw, rc, f, sheet, parts[i].Node, spec); err != nil {
				return nil, fmt.Errorf("node %s: sheet %s: %w", parts[i].Node, sheet, err)
			}
		}
	}
	if rep := fe.Report; name == SheetReconciliation && rep != nil {
		checks := slices.Clone(rep.Checks)
		for _, s := range rep.Sources {
			checks = append(checks, s.Checks...)
		}
		for _, c := range checks {
			if err := sw.row(FleetRowsNode, rep.RunID, c.Scope, c.ID, string(c.Status), c.Expected, c.Actual, c.Difference,
				joinSeqs(c.Offending), c.Note, c.Description); err != nil {
				return nil, err
			}
		}
	}
	return sw.close()
}

// copyRows writes the data rows of a node's sheet to sw, the node first,
// each cell as stored (rc), and adds them as read to the sheet's hash.
func copyRows(sw *sheetWriter, rc *rowCopier, b *nodeBook, sheet, node string, spec sheetSpec) error {
	want := make([]string, len(spec.columns)-1)
	for i, c := range spec.columns[1:] {
		want[i] = c.title
	}
	nodeXML, err := nodeCellXML(node)
	if err != nil {
		return err
	}
	r := 0
	vals := make([]any, len(spec.columns))
	return b.rows(sheet, func(row []nodeCell) error {
		if r++; r == 1 {
			if got := b.texts(row, 0); !slices.Equal(got, want) {
				return fmt.Errorf("its header is not a run workbook's (%q)", got)
			}
			return nil
		}
		clear(vals)
		vals[0] = node
		for i, c := range row {
			if c.col >= len(want) {
				return fmt.Errorf("row %d has a cell past its %d columns", r, len(want))
			}
			if i > 0 && c.col <= row[i-1].col {
				return fmt.Errorf("row %d has its cells out of order", r) // copied as they are, they must be in order
			}
			v, err := b.value(c)
			if err == nil {
				err = copyable(c, v)
			}
			if err != nil {
				return fmt.Errorf("row %d, column %s: %w", r, want[c.col], err)
			}
			vals[c.col+1] = v
		}
		if err := sw.room(); err != nil {
			return err
		}
		sw.hashRow(vals)
		sw.rows++
		return rc.row(sw, sw.rows, nodeXML, row, b.dates)
	})
}

// excelEpoch is day 0 of a spreadsheet date serial (1900 date system).
var excelEpoch = time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC)

// FleetHowToVerify and FleetTimestamps are the fleet Manifest's "How to
// verify" and "Timestamps" values, which a verifier holds it to.
const (
	FleetHowToVerify = "Each row's Node column names the node whose ledger holds it; its Seq is that node's sequence number. The fleet run's evidence pack (GET /v1/fleet/runs/{id}/evidence-pack.zip, auditd pack --fleet) holds every node's leaves and proofs against the checkpoints above and the fleet checkpoint the nodes cosigned: auditd verify --pack FILE --node-key NAME=KEY for each node. Each sheet's SHA-256 below is over its rows as shown: cells as text joined by tabs (tab, newline and backslash escaped as \\t, \\n, \\\\), one line per row, header row first."
	FleetTimestamps  = "UTC, RFC 3339 with milliseconds; durations in seconds"
)

// fleetManifest writes the Manifest of a fleet workbook: the fleet run,
// its nodes, each node's checkpoint and key as its own Manifest says, and
// every sheet's rows and hash.
func fleetManifest(out *excelize.File, st styles, fe FleetEvidence, parts []FleetWorkbook, books []*nodeBook, stats []SheetStat) error {
	w, err := newSheetWriter(out, st, specManifest, 1<<30)
	if err != nil {
		return err
	}
	nodes := make([]string, len(parts))
	for i, p := range parts {
		nodes[i] = p.Node
	}
	var generated any
	if !fe.GeneratedAt.IsZero() {
		generated = fe.GeneratedAt
	}
	var balanced any
	if fe.Report != nil {
		balanced = fe.Report.Balanced
	}
	rows := [][]any{
		{"Label", Label, nil},
		{"Export id", "fleet run=" + fe.RunID, nil},
		{"Generated at (UTC)", generated, nil},
		{"Filters", "fleet run=" + fe.RunID, nil},
		{"Runs", fe.RunID, nil},
		{"Nodes", strings.Join(nodes, " "), nil},
		{"Reconciliation balanced", balanced, nil},
	}
	for i, f := range books {
		fields, err := manifestFields(f)
		if err != nil {
			return fmt.Errorf("node %s: %w", parts[i].Node, err)
		}
		rows = append(rows,
			[]any{"Node " + parts[i].Node + ": " + ManifestFieldCheckpoint, fields[ManifestFieldCheckpoint], nil},
			[]any{"Node " + parts[i].Node + ": " + ManifestFieldPublicKey, fields[ManifestFieldPublicKey], nil})
	}
	rows = append(rows,
		[]any{"How to verify", FleetHowToVerify, nil},
		[]any{"Timestamps", FleetTimestamps, nil},
		[]any{ManifestFieldSheet, "Rows", "SHA-256 of rows"})
	for _, r := range rows {
		if err := w.row(r...); err != nil {
			return err
		}
	}
	for _, s := range stats {
		if err := w.row(s.Name, s.Rows, s.SHA256); err != nil {
			return err
		}
	}
	_, err = w.close()
	return err
}

// manifestFields reads the Field and Value columns of a run workbook's
// Manifest, up to its list of sheets.
func manifestFields(b *nodeBook) (map[string]string, error) {
	out := map[string]string{}
	r, done := 0, false
	err := b.rows(SheetManifest, func(row []nodeCell) error {
		t := b.texts(row, 2)
		if r++; r == 1 || done {
			return nil
		}
		if t[0] == ManifestFieldSheet {
			done = true
			return nil
		}
		out[t[0]] = t[1]
		return nil
	})
	if err != nil {
		return nil, err
	}
	if out[ManifestFieldPublicKey] == "" {
		return nil, fmt.Errorf("its workbook's Manifest names no public key")
	}
	return out, nil
}

// FleetTimeline is a fleet run's timeline: every node's part of the run
// per source and time bucket, each row naming its node. Buckets are
// aligned to the same instants on every node (multiples of Bucket), so
// the rows of one Start add up to the fleet's.
type FleetTimeline struct {
	RunID string `json:"run_id"`
	// From is the earliest start of a node's first bucket and To the
	// latest end of a node's last; absent when no node recorded anything.
	From          time.Time       `json:"from,omitzero"`
	To            time.Time       `json:"to,omitzero"`
	Bucket        auditd.Duration `json:"bucket"`
	BucketSeconds float64         `json:"bucket_seconds"`
	// Sources are sorted by source, then node.
	Sources []FleetSourceTimeline `json:"sources"`
}

// FleetSourceTimeline is one node's share of one source's timeline.
type FleetSourceTimeline struct {
	Node     string                `json:"node"`
	Timeline auditd.SourceTimeline `json:"timeline"`
}

// CombineFleetTimelines puts the nodes' timelines of run runID, keyed by
// node, into one; every one must have the bucket width of the first.
func CombineFleetTimelines(runID string, parts map[string]*auditd.Timeline) (*FleetTimeline, error) {
	out := &FleetTimeline{RunID: runID, Sources: []FleetSourceTimeline{}}
	for _, node := range slices.Sorted(maps.Keys(parts)) {
		tl := parts[node]
		if out.Bucket == 0 {
			out.Bucket, out.BucketSeconds = tl.Bucket, tl.BucketSeconds
		} else if tl.Bucket != out.Bucket {
			return nil, fmt.Errorf("node %s's timeline has buckets of %v, not %v", node, tl.Bucket.D(), out.Bucket.D())
		}
		if !tl.From.IsZero() && (out.From.IsZero() || tl.From.Before(out.From)) {
			out.From = tl.From
		}
		if tl.To.After(out.To) {
			out.To = tl.To
		}
		for _, s := range tl.Sources {
			out.Sources = append(out.Sources, FleetSourceTimeline{Node: node, Timeline: s})
		}
	}
	slices.SortStableFunc(out.Sources, func(a, b FleetSourceTimeline) int { return strings.Compare(a.Timeline.SourceID, b.Timeline.SourceID) })
	return out, nil
}
