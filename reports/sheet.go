package reports

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"strings"
	"time"

	"github.com/xuri/excelize/v2"
)

// timeLayout is how timestamps render in row hashes and how the date style
// shows them: RFC 3339, UTC, milliseconds.
const timeLayout = "2006-01-02T15:04:05.000Z07:00"

// dateFormat is the Excel number format that shows a date cell as
// timeLayout does.
const dateFormat = `yyyy-mm-dd"T"hh:mm:ss.000"Z"`

// column is one column of a sheet.
type column struct {
	title string
	width float64
}

// sheetSpec is a population: its base sheet name and columns.
type sheetSpec struct {
	name    string
	columns []column
}

// SheetStat is what the Manifest says about one sheet.
type SheetStat struct {
	Name string `json:"name"`
	// Rows counts data rows; the header row is not one.
	Rows   int64  `json:"rows"`
	SHA256 string `json:"sha256"`
}

// styles are the workbook's cell styles.
type styles struct {
	header, date int
}

func newStyles(f *excelize.File) (styles, error) {
	var s styles
	var err error
	fmtCode := dateFormat
	if s.date, err = f.NewStyle(&excelize.Style{CustomNumFmt: &fmtCode}); err != nil {
		return s, err
	}
	s.header, err = f.NewStyle(&excelize.Style{
		Font:      &excelize.Font{Bold: true},
		Fill:      excelize.Fill{Type: "pattern", Pattern: 1, Color: []string{"DDE4EE"}},
		Border:    []excelize.Border{{Type: "bottom", Color: "5B6B82", Style: 1}},
		Alignment: &excelize.Alignment{Vertical: "top"},
	})
	return s, err
}

// partName names part n (from 1) of a population's sheets.
func partName(base string, n int) string {
	if n == 1 {
		return base
	}
	return fmt.Sprintf("%s (%d)", base, n)
}

// sheetWriter streams one population's rows, continuing on a numbered sheet
// when a sheet is full, and hashes every row it writes.
type sheetWriter struct {
	f      *excelize.File
	st     styles
	spec   sheetSpec
	limit  int
	part   int
	sw     *excelize.StreamWriter
	rows   int // rows in the current sheet, header included
	h      hash.Hash
	line   []byte
	vals   []any
	stats  []SheetStat
	closed bool
}

func newSheetWriter(f *excelize.File, st styles, spec sheetSpec, limit int) (*sheetWriter, error) {
	w := &sheetWriter{f: f, st: st, spec: spec, limit: limit, h: sha256.New(), vals: make([]any, len(spec.columns))}
	return w, w.open()
}

func (w *sheetWriter) open() error {
	w.part++
	name := partName(w.spec.name, w.part)
	if idx, _ := w.f.GetSheetIndex(name); idx < 0 {
		// A continuation: created last, moved after its first sheet at the end.
		if _, err := w.f.NewSheet(name); err != nil {
			return err
		}
	}
	sw, err := w.f.NewStreamWriter(name)
	if err != nil {
		return err
	}
	for i, c := range w.spec.columns {
		if err := sw.SetColWidth(i+1, i+1, c.width); err != nil {
			return err
		}
	}
	if err := sw.SetPanes(&excelize.Panes{Freeze: true, YSplit: 1, TopLeftCell: "A2", ActivePane: "bottomLeft"}); err != nil {
		return err
	}
	w.sw, w.rows = sw, 0
	w.h.Reset()
	header := make([]any, len(w.spec.columns))
	for i, c := range w.spec.columns {
		header[i] = excelize.Cell{StyleID: w.st.header, Value: c.title}
		w.vals[i] = c.title
	}
	w.hashRow(w.vals)
	return w.setRow(header)
}

func (w *sheetWriter) setRow(vals []any) error {
	w.rows++
	cell, err := excelize.CoordinatesToCellName(1, w.rows)
	if err != nil {
		return err
	}
	return w.sw.SetRow(cell, vals)
}

// room continues on a new sheet when this one holds its limit of rows.
func (w *sheetWriter) room() error {
	if w.rows < w.limit {
		return nil
	}
	if err := w.flush(); err != nil {
		return err
	}
	return w.open()
}

// row writes one data row; vals are string, int, int64, uint32, uint64,
// float64, bool, time.Time (zero: empty) or nil, one per column.
func (w *sheetWriter) row(vals ...any) error {
	if err := w.room(); err != nil {
		return err
	}
	w.hashRow(vals)
	for i, v := range vals {
		if t, ok := v.(time.Time); ok {
			if t.IsZero() {
				vals[i] = nil
			} else {
				vals[i] = excelize.Cell{StyleID: w.st.date, Value: t.UTC()}
			}
		}
	}
	return w.setRow(vals)
}

// hashRow adds a row's canonical text (doc.go) to the sheet's hash.
func (w *sheetWriter) hashRow(vals []any) {
	b := w.line[:0]
	for i, v := range vals {
		if i > 0 {
			b = append(b, '\t')
		}
		b = appendCanonical(b, v)
	}
	b = append(b, '\n')
	w.h.Write(b)
	w.line = b
}

// appendCanonical renders one cell value as row hashes and text dumps see it.
func appendCanonical(b []byte, v any) []byte {
	switch v := v.(type) {
	case nil:
		return b
	case string:
		return appendEscaped(b, v)
	case int:
		return strconv.AppendInt(b, int64(v), 10)
	case int64:
		return strconv.AppendInt(b, v, 10)
	case uint32:
		return strconv.AppendUint(b, uint64(v), 10)
	case uint64:
		return strconv.AppendUint(b, v, 10)
	case float64:
		return strconv.AppendFloat(b, v, 'f', -1, 64)
	case bool:
		if v {
			return append(b, "TRUE"...)
		}
		return append(b, "FALSE"...)
	case time.Time:
		if v.IsZero() {
			return b
		}
		return appendTime(b, v)
	}
	panic(fmt.Sprintf("reports: no canonical form for %T", v))
}

// appendTime appends t as timeLayout does, several times faster: rows hash
// two timestamps each.
func appendTime(b []byte, t time.Time) []byte {
	t = t.UTC()
	y, mo, d := t.Date()
	h, mi, s := t.Clock()
	if y < 0 || y > 9999 {
		return t.AppendFormat(b, timeLayout)
	}
	ms := t.Nanosecond() / 1e6
	b = append(b, byte('0'+y/1000), byte('0'+y/100%10), byte('0'+y/10%10), byte('0'+y%10), '-',
		byte('0'+int(mo)/10), byte('0'+int(mo)%10), '-', byte('0'+d/10), byte('0'+d%10), 'T',
		byte('0'+h/10), byte('0'+h%10), ':', byte('0'+mi/10), byte('0'+mi%10), ':', byte('0'+s/10), byte('0'+s%10), '.',
		byte('0'+ms/100), byte('0'+ms/10%10), byte('0'+ms%10), 'Z')
	return b
}

func appendEscaped(b []byte, s string) []byte {
	if !strings.ContainsAny(s, "\\\t\n") {
		return append(b, s...)
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\\':
			b = append(b, `\\`...)
		case '\t':
			b = append(b, `\t`...)
		case '\n':
			b = append(b, `\n`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

func (w *sheetWriter) flush() error {
	if err := w.sw.Flush(); err != nil {
		return err
	}
	w.stats = append(w.stats, SheetStat{
		Name:   partName(w.spec.name, w.part),
		Rows:   int64(w.rows - 1),
		SHA256: hex.EncodeToString(w.h.Sum(nil)),
	})
	return nil
}

// close flushes the last sheet and returns the stats of every sheet written.
func (w *sheetWriter) close() ([]SheetStat, error) {
	if w.closed {
		return w.stats, nil
	}
	w.closed = true
	return w.stats, w.flush()
}

// seconds renders a duration as a number of seconds, the unit of every
// duration column.
func seconds(d time.Duration) float64 { return d.Seconds() }
