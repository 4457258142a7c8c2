package reports

import (
	"github.com/auditd/auditd"
)

// Fields of the Manifest sheet that a verifier of an evidence pack reads.
const (
	ManifestFieldCheckpoint = "Signed checkpoint"
	ManifestFieldPublicKey  = "Public key (ed25519, note verifier)"
	ManifestFieldSheet      = "Sheet"
)

// EventSheets names the populations written straight from the ledger's
// events, in workbook order, the Retention sheet last: the sheets
// EventRows recomputes.
func EventSheets() []string {
	out := make([]string, 0, len(eventSpecs)+1)
	for _, s := range eventSpecs {
		out = append(out, s.name)
	}
	return append(out, SheetRetention)
}

// SheetColumns returns the column titles of a population (its header
// row), or nil for a name that is no population.
func SheetColumns(name string) []string {
	for _, s := range append(eventSpecs[:], specRetention, specManifest, specAward, specRuns, specControl, specReconciliation, specCached) {
		if s.name == name {
			out := make([]string, len(s.columns))
			for i, c := range s.columns {
				out[i] = c.title
			}
			return out
		}
	}
	return nil
}

// ContinuationName is the name of part n (from 1) of a population that
// passed a sheet's row limit: the base name, then "name (2)", ...
func ContinuationName(base string, n int) string { return partName(base, n) }

// EventRows computes, from events, the rows Export writes to the event
// populations (EventSheets) for runIDs over ranges (each run's first and
// last sequence number, as the Runs sheet states them), the access events
// after the ranges access (Manifest.Access's) and the retention events
// retention (Manifest.Retention's), in the order it writes them,
// and calls fn with each: the population's name and the row's values
// (string, int, int64, uint32, uint64, float64, bool, time.Time or nil;
// see AppendCellText). An evidence pack's verifier checks a workbook's
// rows against the pack's leaves this way. fn must not keep vals.
func EventRows(events auditd.EventReader, runIDs []string, ranges [][2]uint64, access, retention []auditd.Event, fn func(sheet string, vals []any) error) error {
	var rows [5]rowWriter
	for i, s := range eventSpecs {
		rows[i] = rowFunc(func(vals ...any) error { return fn(s.name, vals) })
	}
	ret := rowFunc(func(vals ...any) error { return fn(SheetRetention, vals) })
	return eventRows(events, runIDs, ranges, access, retention, rows, ret, DefaultMaxPendingRows, newRedactor(), func() error { return nil })
}

type rowFunc func(vals ...any) error

func (f rowFunc) row(vals ...any) error { return f(vals...) }

// AppendCellText appends a cell value as a sheet's row hash renders it
// (see the package doc): the text a spreadsheet shows.
func AppendCellText(b []byte, v any) []byte { return appendCanonical(b, v) }

// AppendEscapedText appends a string cell's text as a row hash renders it:
// backslash, tab and newline escaped as \\, \t and \n.
func AppendEscapedText(b []byte, s string) []byte { return appendEscaped(b, s) }

// Styles is what a workbook's xl/styles.xml says of its number formats,
// read with encoding/xml.
type Styles struct {
	NumFmts []struct {
		ID   int    `xml:"numFmtId,attr"`
		Code string `xml:"formatCode,attr"`
	} `xml:"numFmts>numFmt"`
	Xfs []struct {
		NumFmt int `xml:"numFmtId,attr"`
	} `xml:"cellXfs>xf"`
}

// DateStyles returns the cell styles (cellXfs indexes) whose number
// format is the date style a run's workbook writes times in: a number in
// one of them is a time.
func (st *Styles) DateStyles() map[int]bool {
	dateFmt := map[int]bool{}
	for _, f := range st.NumFmts {
		dateFmt[f.ID] = f.Code == dateFormat
	}
	out := map[int]bool{}
	for i, x := range st.Xfs {
		if dateFmt[x.NumFmt] {
			out[i] = true
		}
	}
	return out
}
