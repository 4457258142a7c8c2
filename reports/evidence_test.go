package reports_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// fixedCheckpoint stands in for the ledger's signed checkpoint.
type fixedCheckpoint struct{}

func (fixedCheckpoint) Checkpoint() ([]byte, error) {
	return []byte("auditd.example/ledger\n60\nq2VwY2hlY2twb2ludHJvb3Q=\n\n— auditd.example/ledger Az3grlgAAAAA\n"), nil
}
func (fixedCheckpoint) PublicKey() string {
	return "auditd.example/ledger+3cc0d7b5+AQ0tZXhhbXBsZS1wdWJsaWMta2V5"
}

var generatedAt = time.Date(2026, 3, 3, 9, 30, 0, 123e6, time.UTC)

func cleanRequest() reports.Request {
	return reports.Request{
		ExportID:    "exp-0001",
		RunIDs:      []string{fixtureRun},
		Filters:     "run " + fixtureRun,
		GeneratedAt: generatedAt,
		Live:        map[string]*reports.LiveCounters{fixtureRun: cleanLive()},
	}
}

func newExporter(l *memLedger) *reports.Exporter {
	x := reports.NewExporter(newReconciler(l))
	x.Ledger = fixedCheckpoint{}
	return x
}

func export(tb testing.TB, x *reports.Exporter, req reports.Request) ([]byte, *reports.Manifest) {
	tb.Helper()
	var buf bytes.Buffer
	m, err := x.Export(context.Background(), &buf, req)
	if err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes(), m
}

// workbook is a workbook read back with excelize: its sheets in order and
// their rows as Excel shows them, padded to the header's width.
type workbook struct {
	names  []string
	sheets map[string][][]string
}

func readWorkbook(tb testing.TB, b []byte) workbook {
	tb.Helper()
	f, err := excelize.OpenReader(bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	wb := workbook{names: f.GetSheetList(), sheets: make(map[string][][]string)}
	for _, name := range wb.names {
		rows, err := f.GetRows(name, excelize.Options{RawCellValue: true})
		if err != nil {
			tb.Fatal(err)
		}
		for i, r := range rows {
			for j, v := range r {
				if v == "" {
					continue
				}
				cell, _ := excelize.CoordinatesToCellName(j+1, i+1)
				if rows[i][j], err = showCell(f, name, cell, v); err != nil {
					tb.Fatalf("%s!%s: %v", name, cell, err)
				}
			}
		}
		width := 0
		for _, r := range rows {
			width = max(width, len(r))
		}
		for i := range rows {
			for len(rows[i]) < width {
				rows[i] = append(rows[i], "")
			}
		}
		wb.sheets[name] = rows
	}
	return wb
}

// showCell renders a raw cell value as a reader sees it: booleans as
// TRUE/FALSE, date cells as RFC 3339 UTC with milliseconds (excelize's own
// formatter drops the milliseconds), everything else as stored.
func showCell(f *excelize.File, sheet, cell, raw string) (string, error) {
	typ, err := f.GetCellType(sheet, cell)
	if err != nil {
		return "", err
	}
	if typ == excelize.CellTypeBool {
		if raw == "1" {
			return "TRUE", nil
		}
		return "FALSE", nil
	}
	id, err := f.GetCellStyle(sheet, cell)
	if err != nil || id == 0 {
		return raw, err
	}
	st, err := f.GetStyle(id)
	if err != nil || st.CustomNumFmt == nil || !strings.HasPrefix(*st.CustomNumFmt, "yyyy-mm-dd") {
		return raw, err
	}
	serial, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		return "", err
	}
	// excelize.ExcelDateToTime drops the milliseconds too.
	t := excelEpoch.Add(time.Duration(serial * float64(24*time.Hour)))
	return t.Round(time.Millisecond).Format("2006-01-02T15:04:05.000Z07:00"), nil
}

// excelEpoch is day 0 of Excel's 1900 date system (as corrected for its
// 1900 leap year bug for every date after February 1900).
var excelEpoch = time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC)

// dump is the text form of a workbook that golden files hold.
func (wb workbook) dump() string {
	var b strings.Builder
	for _, name := range wb.names {
		fmt.Fprintf(&b, "== %s ==\n", name)
		for _, r := range wb.sheets[name] {
			b.WriteString(strings.Join(r, "\t"))
			b.WriteByte('\n')
		}
	}
	return b.String()
}

// rowsHash recomputes a sheet's row hash from its cells as shown, the way a
// third party would.
func rowsHash(rows [][]string) string {
	h := sha256.New()
	esc := strings.NewReplacer(`\`, `\\`, "\t", `\t`, "\n", `\n`)
	for _, r := range rows {
		for i, c := range r {
			if i > 0 {
				h.Write([]byte{'\t'})
			}
			h.Write([]byte(esc.Replace(c)))
		}
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func TestExport_Golden(t *testing.T) {
	b, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	goldenCompare(t, "clean.evidence.txt", []byte(readWorkbook(t, b).dump()))
}

func TestExport_Sheets(t *testing.T) {
	b, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	wb := readWorkbook(t, b)
	want := []string{"Manifest", "Award context", "Runs", "Dispatches", "Waits and throttles", "Breaker transitions",
		"Registry snapshots", "Control evidence", "Reconciliation", "Served from cache", "Access log"}
	if !slices.Equal(wb.names, want) {
		t.Fatalf("sheets %q, want %q", wb.names, want)
	}
	manifest := wb.sheets["Manifest"]
	if manifest[1][1] != reports.Label {
		t.Errorf("label %q, want %q", manifest[1][1], reports.Label)
	}
	if got := manifest[3][1]; got != "2026-03-03T09:30:00.123Z" {
		t.Errorf("generated at shows %q, want RFC 3339 UTC with milliseconds", got)
	}
}

func TestExport_Deterministic(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	a, _ := export(t, newExporter(l), cleanRequest())
	b, _ := export(t, newExporter(l), cleanRequest())
	if !bytes.Equal(a, b) {
		t.Fatal("two exports of the same range differ")
	}
	req := cleanRequest()
	req.GeneratedAt = req.GeneratedAt.Add(time.Second)
	c, _ := export(t, newExporter(l), req)
	if bytes.Equal(a, c) {
		t.Fatal("generated-at does not reach the file: the determinism check cannot fail")
	}
}

// TestExport_TiesToReconciliation reads the workbook back and ties every
// total to the JSON reconciliation.
func TestExport_TiesToReconciliation(t *testing.T) {
	b, m := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	wb := readWorkbook(t, b)
	rep := m.Reports[0]

	// Populations: data rows (the header is not one) equal the recount.
	for _, tc := range []struct {
		sheet string
		want  int64
	}{
		{"Dispatches", rep.Counts.Dispatches},
		{"Waits and throttles", rep.Counts.Waits + rep.Counts.Throttles},
		{"Breaker transitions", rep.Counts.Breaker},
		{"Registry snapshots", rep.Counts.Registry},
		{"Access log", int64(len(m.Access))}, // the fixture's one export, after the run's range
		{"Control evidence", int64(len(rep.Control))},
		{"Reconciliation", int64(len(rep.Checks) * (1 + len(rep.Sources)))},
		{"Served from cache", rep.Counts.CacheServed},
	} {
		if got := int64(len(wb.sheets[tc.sheet]) - 1); got != tc.want {
			t.Errorf("%s: %d rows, reconciliation says %d", tc.sheet, got, tc.want)
		}
	}

	// Dispatch outcomes tie to R2's terms.
	byOutcome := map[string]int64{}
	for _, r := range wb.sheets["Dispatches"][1:] {
		byOutcome[r[11]]++
	}
	if got := byOutcome["response"] + byOutcome["throttle"]; got != rep.Counts.Status2xx+rep.Counts.Status429+rep.Counts.Status5xx+rep.Counts.StatusOther {
		t.Errorf("dispatch rows with a status: %d, reconciliation %+v", got, rep.Counts)
	}
	if byOutcome["transport.error"] != rep.Counts.TransportErrors || byOutcome["dispatch.interrupted"] != rep.Counts.Interrupted {
		t.Errorf("dispatch rows by result %v, reconciliation %+v", byOutcome, rep.Counts)
	}
	var staged int64
	for _, r := range wb.sheets["Dispatches"][1:] {
		if r[18] != "" {
			staged++
		}
	}
	if staged != rep.Counts.Staged {
		t.Errorf("dispatch rows with a payload hash: %d, staged payloads %d", staged, rep.Counts.Staged)
	}

	// Runs sheet counts equal the JSON counts.
	runs := wb.sheets["Runs"]
	col := func(name string) int { return slices.Index(runs[0], name) }
	for name, want := range map[string]int64{"Events": rep.Counts.Events, "Items queued": rep.Counts.Queued,
		"Succeeded": rep.Counts.Succeeded, "Cached": rep.Counts.Cached, "Failed": rep.Counts.Failed,
		"Shed": rep.Counts.Shed, "Dispatches": rep.Counts.Dispatches, "Retries": rep.Counts.Retries,
		"Throttles": rep.Counts.Throttles, "Last seq": int64(rep.Run.LastSeq)} {
		if got := runs[1][col(name)]; got != strconv.FormatInt(want, 10) {
			t.Errorf("Runs %s = %q, reconciliation %d", name, got, want)
		}
	}

	// Every reconciliation row equals the JSON check.
	var checks []reports.Check
	checks = append(checks, rep.Checks...)
	for _, s := range rep.Sources {
		checks = append(checks, s.Checks...)
	}
	for i, r := range wb.sheets["Reconciliation"][1:] {
		c := checks[i]
		got := []string{r[2], r[3], r[4], r[5], r[6]}
		want := []string{c.ID, string(c.Status), strconv.FormatInt(c.Expected, 10), strconv.FormatInt(c.Actual, 10), strconv.FormatInt(c.Difference, 10)}
		if !slices.Equal(got, want) {
			t.Errorf("Reconciliation row %d = %q, JSON %q", i+1, got, want)
		}
	}

	// The manifest's row counts and hashes match the sheets as read back.
	if len(m.Sheets) != len(wb.names)-1 {
		t.Fatalf("manifest lists %d sheets, workbook has %d besides it", len(m.Sheets), len(wb.names)-1)
	}
	manifest := wb.sheets["Manifest"]
	at := slices.IndexFunc(manifest, func(r []string) bool { return r[0] == "Sheet" })
	for i, s := range m.Sheets {
		rows := wb.sheets[s.Name]
		if s.Rows != int64(len(rows)-1) {
			t.Errorf("manifest: %s has %d rows, sheet %d", s.Name, s.Rows, len(rows)-1)
		}
		if got := rowsHash(rows); got != s.SHA256 {
			t.Errorf("manifest: %s hash %s, recomputed from the cells %s", s.Name, s.SHA256, got)
		}
		if row := manifest[at+1+i]; row[0] != s.Name || row[1] != strconv.FormatInt(s.Rows, 10) || row[2] != s.SHA256 {
			t.Errorf("manifest row %q, want %s %d %s", row, s.Name, s.Rows, s.SHA256)
		}
	}
}

func TestExport_RowLimit(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	whole, _ := export(t, newExporter(l), cleanRequest())
	x := newExporter(l)
	x.RowLimit = 4 // a header and three rows per sheet
	split, m := export(t, x, cleanRequest())

	a, b := readWorkbook(t, whole), readWorkbook(t, split)
	wantParts := []string{"Dispatches", "Dispatches (2)", "Dispatches (3)", "Dispatches (4)"}
	var got []string
	for _, n := range b.names {
		if strings.HasPrefix(n, "Dispatches") {
			got = append(got, n)
		}
	}
	if !slices.Equal(got, wantParts) {
		t.Fatalf("dispatch sheets %q, want %q", got, wantParts)
	}
	if i, j := slices.Index(b.names, "Dispatches (4)"), slices.Index(b.names, "Waits and throttles"); i+1 != j {
		t.Errorf("continuation sheets out of order: %q", b.names)
	}
	var rows [][]string
	for _, n := range wantParts {
		part := b.sheets[n]
		if len(part) > 4 {
			t.Errorf("%s has %d rows, limit 4", n, len(part))
		}
		if !slices.Equal(part[0], a.sheets["Dispatches"][0]) {
			t.Errorf("%s lacks the header", n)
		}
		rows = append(rows, part[1:]...)
	}
	if want := a.sheets["Dispatches"][1:]; !slices.EqualFunc(rows, want, slices.Equal) {
		t.Errorf("split sheets hold other rows than the whole sheet")
	}
	var listed int
	for _, s := range m.Sheets {
		if strings.HasPrefix(s.Name, "Dispatches") {
			listed++
		}
	}
	if listed != len(wantParts) {
		t.Errorf("manifest lists %d dispatch sheets, want %d", listed, len(wantParts))
	}
}

func TestExport_NoCredentials(t *testing.T) {
	b, _ := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
	dump := readWorkbook(t, b).dump()
	for _, secret := range []string{"leaked-secret", "abc123"} {
		if strings.Contains(dump, secret) {
			t.Errorf("workbook contains %q", secret)
		}
	}
	// The value is replaced, as the loop records it; the rest stays.
	if !strings.Contains(dump, "where=1%3D1&outFields=*&resultOffset=0&api_key=REDACTED&f=json") {
		t.Error("redaction changed more than the credential's value")
	}
}

// TestExport_RedactsAsTheLoop: the exports' second guard is package
// redact's rule: a value that slipped into the ledger under any of its
// credential names, or a source's declared name, is replaced in the paths
// and error texts of the workbook, the name kept, as the loop would have
// recorded it; with or without the sources' declarations.
func TestExport_RedactsAsTheLoop(t *testing.T) {
	builtIn := append(slices.Clone(onceMissedNames), "api_key")
	for _, tc := range []struct {
		name     string
		declared []string
	}{
		{"BuiltInNames", nil},
		{"DeclaredNames", []string{"sq"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			names := append(slices.Clone(builtIn), tc.declared...)
			var query string
			for _, n := range names {
				query += "&" + n + "=leaked-" + n
			}
			evs := loadFixture(t, "clean.ndjson")
			var paths, texts int
			for i := range evs {
				e := &evs[i]
				switch {
				case e.Type == auditd.EventDispatch && e.Path != "":
					if !strings.Contains(e.Path, "?") {
						e.Path += "?f=json"
					}
					e.Path += query
					paths++
				case e.Type == auditd.EventTransportError:
					e.ErrorText = `Get "https://up.example/q?f=json` + query + `": EOF`
					texts++
				}
			}
			if paths == 0 || texts == 0 {
				t.Fatalf("fixture has %d dispatches with a path and %d transport errors", paths, texts)
			}
			x := newExporter(newMemLedger(evs))
			if tc.declared != nil {
				x.SecretQuery = func(string) []string { return tc.declared }
			}
			b, _ := export(t, x, cleanRequest())
			dump := readWorkbook(t, b).dump()
			if i := strings.Index(dump, "leaked-"); i >= 0 {
				t.Errorf("workbook keeps a credential's value: ...%s...", dump[max(0, i-60):min(len(dump), i+20)])
			}
			for _, n := range names {
				if got := strings.Count(dump, "&"+n+"=REDACTED"); got < paths+texts {
					t.Errorf("%s=REDACTED appears %d times, want at least %d (each path and error text)", n, got, paths+texts)
				}
			}
		})
	}
}

func TestExport_Errors(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	tests := []struct {
		name string
		req  reports.Request
		want error
	}{
		{"NoRuns", reports.Request{}, reports.ErrNoRuns},
		{"UnknownRun", reports.Request{RunIDs: []string{"01JNOSUCHRUN00000000000000"}}, reports.ErrRunNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			_, err := newExporter(l).Export(context.Background(), &buf, tt.req)
			if !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("%d bytes written on error", buf.Len())
			}
		})
	}
}

// TestExport_TwoInterleavedRuns exports two runs whose events interleave in
// the ledger, as an award over a period does: each run is reconciled from
// its own events, and every sheet holds both.
func TestExport_TwoInterleavedRuns(t *testing.T) {
	const other = "01JQ8Z6X0RUN0000000000000B"
	a := loadFixture(t, "clean.ndjson")
	var evs []auditd.Event
	for _, e := range a {
		b := e
		if b.RunID != "" {
			b.RunID = other
		}
		evs = append(evs, e, b)
	}
	x := newExporter(newMemLedger(evs))
	req := cleanRequest()
	req.RunIDs = []string{fixtureRun, other}
	req.Filters = "award NA24OAR4310001 from 2026-03-01 to 2026-03-31"
	b, m := export(t, x, req)
	wb := readWorkbook(t, b)
	// The second run has no live counters: R7 n/a, still balanced.
	for _, rep := range m.Reports {
		if !rep.Balanced {
			t.Errorf("run %s not balanced: %v", rep.Run.ID, rep.Failed())
		}
	}
	if got := len(wb.sheets["Runs"]) - 1; got != 2 {
		t.Errorf("Runs has %d rows, want 2", got)
	}
	if got, want := int64(len(wb.sheets["Dispatches"])-1), m.Reports[0].Counts.Dispatches+m.Reports[1].Counts.Dispatches; got != want {
		t.Errorf("Dispatches has %d rows, want %d", got, want)
	}
	for _, r := range wb.sheets["Dispatches"][1:] {
		if r[9] == "" { // completed at: every dispatch found its outcome across the interleaving
			t.Errorf("dispatch %s of run %s has no outcome", r[0], r[1])
		}
	}
}

// TestExport_OpensOnTheManifest: the workbook opens on the Manifest, the
// only sheet selected, continuation sheets moved into place included.
func TestExport_OpensOnTheManifest(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	x := newExporter(l)
	x.RowLimit = 4 // continuation sheets, moved after their first
	b, _ := export(t, x, cleanRequest())
	f, err := excelize.OpenReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if i := f.GetActiveSheetIndex(); f.GetSheetName(i) != reports.SheetManifest {
		t.Errorf("the active sheet is %q, want %q", f.GetSheetName(i), reports.SheetManifest)
	}
	if f.GetSheetMap()[1] != reports.SheetManifest {
		t.Fatalf("sheet 1 is %q, want the Manifest", f.GetSheetMap()[1])
	}
	z, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var selected []string
	for _, part := range z.File {
		if !strings.HasPrefix(part.Name, "xl/worksheets/") {
			continue
		}
		r, err := part.Open()
		if err != nil {
			t.Fatal(err)
		}
		x, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(x, []byte(`tabSelected="1"`)) || bytes.Contains(x, []byte(`tabSelected="true"`)) {
			selected = append(selected, part.Name)
		}
	}
	if !slices.Equal(selected, []string{"xl/worksheets/sheet1.xml"}) {
		t.Errorf("selected sheets %q, want only the Manifest's (sheet1.xml)", selected)
	}
}
