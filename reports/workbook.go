package reports

import (
	"io"
	"strings"
	"time"

	"github.com/xuri/excelize/v2"
)

// Sheets of the reconciliation workbook.
const (
	SheetSummary = "Summary"
	SheetDetail  = "Detail per source"
	SheetChecks  = "Checks"
	SheetSignOff = "Sign-off"
)

// countColumns name LedgerCounts' fields in the order countValues gives them.
var countColumns = []string{"Events", "Queued", "Succeeded", "Cached", "Failed", "Shed", "Pending",
	"Dispatches", "First attempts", "Retries", "2xx", "429", "5xx", "Other status", "Transport errors",
	"Interrupted", "In flight", "Throttles", "Waits", "Breaker transitions", "Breaker opens", "Registry events",
	"Staged", "Served from cache", "Acknowledged"}

func countValues(c LedgerCounts) []any {
	return []any{c.Events, c.Queued, c.Succeeded, c.Cached, c.Failed, c.Shed, c.Pending, c.Dispatches,
		c.FirstAttempts, c.Retries, c.Status2xx, c.Status429, c.Status5xx, c.StatusOther, c.TransportErrors,
		c.Interrupted, c.InFlight, c.Throttles, c.Waits, c.Breaker, c.BreakerOpens, c.Registry, c.Staged,
		c.CacheServed, c.Acknowledged}
}

var (
	specSummary = sheetSpec{SheetSummary, []column{{"Field", 34}, {"Value", 70}}}
	specChecks  = sheetSpec{SheetChecks, specReconciliation.columns}
	specSignOff = sheetSpec{SheetSignOff, []column{{"Role", 22}, {"Name", 30}, {"Title", 30}, {"Date", 16}, {"Signature", 30}}}
)

func specDetail() sheetSpec {
	cols := []column{{"Source", 18}, {"Balanced", 10}, {"Failed checks", 18}}
	for _, c := range countColumns {
		cols = append(cols, column{c, 11})
	}
	return sheetSpec{SheetDetail, cols}
}

// WriteXLSX writes rep as a reconciliation workbook: Summary, Detail per
// source, Checks, the items Served from cache and a Sign-off sheet for the people who review it. at is
// recorded as the time it was prepared; zero records none, and the same
// report then always gives the same bytes.
func WriteXLSX(w io.Writer, rep *Report, at time.Time) error {
	f := excelize.NewFile()
	defer f.Close()
	if err := docProps(f, "Reconciliation: run "+rep.Run.ID, rep.Run.ID, at); err != nil {
		return err
	}
	if err := f.SetSheetName("Sheet1", SheetSummary); err != nil {
		return err
	}
	for _, name := range []string{SheetDetail, SheetChecks, SheetCached, SheetSignOff} {
		if _, err := f.NewSheet(name); err != nil {
			return err
		}
	}
	st, err := newStyles(f)
	if err != nil {
		return err
	}
	write := func(spec sheetSpec, rows [][]any) error {
		sw, err := newSheetWriter(f, st, spec, DefaultRowLimit)
		if err != nil {
			return err
		}
		for _, r := range rows {
			if err := sw.row(r...); err != nil {
				return err
			}
		}
		_, err = sw.close()
		return err
	}

	var prepared any
	if !at.IsZero() {
		prepared = at
	}
	failed := strings.Join(rep.Failed(), ", ")
	if failed == "" {
		failed = "none"
	}
	summary := [][]any{
		{"Label", Label},
		{"Run", rep.Run.ID},
		{"Name", rep.Run.Name},
		{"Status", rep.Run.Status},
		{"FAIN", rep.Run.Award.FAIN},
		{"Started at (UTC)", rep.Run.StartedAt},
		{"Finished at (UTC)", rep.Run.FinishedAt},
		{"First seq", rep.Run.FirstSeq},
		{"Last seq", rep.Run.LastSeq},
		{"Chain head at start", rep.Run.HeadAtStart},
		{"Chain head at end", rep.Run.HeadAtEnd},
		{"Balanced", rep.Balanced},
		{"Failed checks", failed},
		{"Prepared at (UTC)", prepared},
	}
	for i, name := range countColumns {
		summary = append(summary, []any{"Total: " + strings.ToLower(name), countValues(rep.Counts)[i]})
	}
	var detail [][]any
	for _, s := range rep.Sources {
		var failed []string
		for _, c := range s.Checks {
			if c.Status == StatusFail {
				failed = append(failed, c.ID)
			}
		}
		detail = append(detail, append([]any{s.SourceID, s.Balanced, strings.Join(failed, ", ")}, countValues(s.Counts)...))
	}
	var checks [][]any
	for _, c := range allChecks(rep) {
		checks = append(checks, []any{rep.Run.ID, c.Scope, c.ID, string(c.Status), c.Expected, c.Actual, c.Difference,
			joinSeqs(c.Offending), c.Note, c.Description})
	}
	signOff := [][]any{
		{"Prepared by", "", "", "", ""},
		{"Reviewed by", "", "", "", ""},
		{"Approved by", "", "", "", ""},
		{"Statement", "I have reviewed this reconciliation against the ledger and its checkpoint; exceptions are explained in the notes.", "", "", ""},
	}
	for _, s := range []struct {
		spec sheetSpec
		rows [][]any
	}{{specSummary, summary}, {specDetail(), detail}, {specChecks, checks}, {specCached, cachedRows(rep)}, {specSignOff, signOff}} {
		if err := write(s.spec, s.rows); err != nil {
			return err
		}
	}
	return writeWorkbook(f, w, "")
}
