package reports

import (
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// ErrUnknownFormat means a report format other than json, csv or xlsx.
var ErrUnknownFormat = errors.New("unknown report format")

// Write writes rep in format: "json", "csv" or "xlsx" (WriteXLSX with no
// preparation time, so the bytes depend on the report only).
func Write(w io.Writer, rep *Report, format string) error {
	switch format {
	case "json":
		return WriteJSON(w, rep)
	case "csv":
		return WriteCSV(w, rep)
	case "xlsx":
		return WriteXLSX(w, rep, time.Time{})
	}
	return fmt.Errorf("%w %q", ErrUnknownFormat, format)
}

// WriteJSON writes rep as indented JSON, the form CI reads and the API
// serves. The same input always gives the same bytes.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(rep)
}

// csvHeader is the header of WriteCSV's output.
var csvHeader = []string{"run", "scope", "id", "status", "expected", "actual", "difference", "offending", "note", "description"}

// WriteCSV writes one row per check, in total (scope "total") and per
// source.
func WriteCSV(w io.Writer, rep *Report) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(csvHeader); err != nil {
		return err
	}
	for _, row := range checkRows(rep) {
		if err := cw.Write(row); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// allChecks lists every check of rep, in total first, then per source.
func allChecks(rep *Report) []Check {
	out := slices.Clone(rep.Checks)
	for _, s := range rep.Sources {
		out = append(out, s.Checks...)
	}
	return out
}

// checkRows renders every check of rep as CSV cells.
func checkRows(rep *Report) [][]string {
	var rows [][]string
	for _, c := range allChecks(rep) {
		rows = append(rows, []string{rep.Run.ID, c.Scope, c.ID, string(c.Status),
			strconv.FormatInt(c.Expected, 10), strconv.FormatInt(c.Actual, 10), strconv.FormatInt(c.Difference, 10),
			joinSeqs(c.Offending), c.Note, c.Description})
	}
	return rows
}

func joinSeqs(s []uint64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, " ")
}

// WriteTable writes rep as a table for a terminal: the verdict, then the
// checks in total, then a line per source that does not balance.
func WriteTable(w io.Writer, rep *Report) error {
	verdict := "BALANCED"
	if !rep.Balanced {
		verdict = "NOT BALANCED: failed " + strings.Join(rep.Failed(), ", ")
	}
	fmt.Fprintf(w, "run %s  seq %d..%d  status %s\n%s\n\n", rep.Run.ID, rep.Run.FirstSeq, rep.Run.LastSeq, rep.Run.Status, verdict)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tSTATUS\tEXPECTED\tACTUAL\tDIFF\tFIRST OFFENDING\tNOTE")
	for _, c := range rep.Checks {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%+d\t%s\t%s\n", c.ID, c.Status, c.Expected, c.Actual, c.Difference, joinSeqs(c.Offending), c.Note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, s := range rep.Sources {
		if s.Balanced {
			continue
		}
		var failed []string
		for _, c := range s.Checks {
			if c.Status == StatusFail {
				failed = append(failed, c.ID)
			}
		}
		fmt.Fprintf(w, "source %s: failed %s\n", s.SourceID, strings.Join(failed, ", "))
	}
	if len(rep.Cached) > 0 {
		fmt.Fprintf(w, "\nserved from cache: %d\n", len(rep.Cached))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "SEQ\tSOURCE\tITEM\tAGE\tFETCHED AT\tBY RUN\tREASON")
		for _, c := range rep.Cached {
			age, at, by := "unknown", "-", c.OriginRun
			if c.AgeKnown() {
				age, at = c.Age.D().String(), c.FetchedAt.UTC().Format(timeLayout)
			}
			if by == "" {
				by = "-"
			}
			fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Seq, c.SourceID, c.ItemKey, age, at, by, c.Reason)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	_, err := fmt.Fprintln(w)
	return err
}
