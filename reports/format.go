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
