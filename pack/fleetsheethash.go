package pack

import (
	"math"
	"strconv"
	"time"

	"github.com/auditd/auditd/reports"
)

// The fleet workbook's sheet hashes: the merge (reports.WriteFleetEvidence)
// hashes each sheet over the values it read from the node workbooks, and
// copies the cells as stored; a verifier reads those cells back to the
// same values and hashes them the same way (docs/EVIDENCE-PACK.md, "Fleet
// packs", step 5).

// dateStyles are the cell styles (cellXfs indexes) of the workbook whose
// number format is the date style (reports.Styles).
func (b *book) dateStyles() (map[int]bool, error) {
	var st reports.Styles
	if err := b.decodeXML("xl/styles.xml", &st); err != nil {
		return nil, err
	}
	return st.DateStyles(), nil
}

// sheetHasher hashes one sheet's rows as the fleet merge does.
type sheetHasher struct {
	dates map[int]bool
	sum   hashWriter
	line  []byte
	width int // the header row's columns
}

// header starts the sheet's hash with its header row.
func (h *sheetHasher) header(cells []cell, texts []string) bool {
	h.width = 0
	for _, c := range cells {
		h.width = max(h.width, c.col+1)
	}
	return h.row(cells, texts)
}

// row adds a row's canonical text: its cells' texts (appendCell) joined
// by tabs up to the header's last column or the row's, ended by a
// newline; texts are the cells' texts by column, as texts gives them. It
// reports false for cells out of column order, which the merge never
// writes (a verifier says so rather than hash them).
func (h *sheetHasher) row(cells []cell, texts []string) bool {
	b := h.line[:0]
	tabs := 0
	for i, c := range cells {
		if i > 0 && c.col <= cells[i-1].col {
			return false
		}
		for ; tabs < c.col; tabs++ {
			b = append(b, '\t')
		}
		b = h.appendCell(b, c, texts[c.col])
	}
	for ; tabs < h.width-1; tabs++ {
		b = append(b, '\t')
	}
	b = append(b, '\n')
	h.sum.Write(b)
	h.line = b
	return true
}

// appendCell appends a cell's text as the merge hashes it: the value it
// reads (reports' nodeBook.value) as reports.AppendCellText renders it,
// written out here so that a million rows box no value. A boolean is
// TRUE or FALSE; a number in a date style the time it holds to the
// microsecond, shown to the millisecond (the rest dropped); another
// number the shortest decimal that reads back as it; any other cell, and
// a number that does not parse (which the merge never hashes), its text,
// escaped. text is c's text as a string.
func (h *sheetHasher) appendCell(b []byte, c cell, text string) []byte {
	switch c.typ {
	case "b":
		if string(c.text) == "1" {
			return append(b, "TRUE"...)
		}
		return append(b, "FALSE"...)
	case "", "n":
	default:
		return reports.AppendEscapedText(b, text)
	}
	if len(c.text) == 0 {
		return b
	}
	x, err := strconv.ParseFloat(text, 64)
	switch {
	case err != nil:
		return reports.AppendEscapedText(b, text)
	case h.dates[c.style]:
		days, frac := math.Modf(x)
		t := fleetEpoch.Add(time.Duration(days)*24*time.Hour + time.Duration(math.Round(frac*86400e9)))
		return t.Round(time.Microsecond).AppendFormat(b, "2006-01-02T15:04:05.000Z07:00")
	}
	return strconv.AppendFloat(b, x, 'f', -1, 64)
}

// fleetEpoch is day 0 of a date serial: 1899-12-30T00:00:00Z.
var fleetEpoch = time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC)
