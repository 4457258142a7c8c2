package reports

import (
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/xuri/excelize/v2"
)

// The fleet workbook's node rows are copied as XML: each cell of a node's
// sheet is written as stored, its reference moved one column right for the
// Node column and to its row in the fleet sheet, instead of being read to
// a value and written again through excelize's StreamWriter, which took
// half of the merge's CPU once the rows were scanned (fleet_scan.go): the
// three node workbooks of BenchmarkFleetPack1M's 1M-event run merge in
// 6.1 s, against 16.6 s read through encoding/xml and written again.
// The StreamWriter writes each sheet's header row and the fleet's own
// rows; the copied rows wait in a temporary file per sheet and are spliced
// in after the header row as the workbook is written (splicedZip). A cell
// holds what the StreamWriter would write for its value (a run's workbook
// is its output), and the sheet's hash is taken over the values read.

// rowCopier writes the node rows of a fleet workbook's sheets.
type rowCopier struct {
	tmpDir string
	// rows are the copied rows by the sheet's part in the ZIP.
	rows  map[string]*os.File
	sheet int // the excelize sheet ID being written
	w     *bufio.Writer
	line  []byte
}

func newRowCopier(tmpDir string) *rowCopier {
	return &rowCopier{tmpDir: tmpDir, rows: map[string]*os.File{}}
}

// row writes row n of sw's current sheet: the node's cell, then cells.
func (rc *rowCopier) row(sw *sheetWriter, n int, node []byte, cells []nodeCell, dates map[int]bool) error {
	if sw.sw.SheetID != rc.sheet {
		if err := rc.flush(); err != nil {
			return err
		}
		f, err := os.CreateTemp(rc.tmpDir, "auditd-fleet-rows-*")
		if err != nil {
			return err
		}
		part := "xl/worksheets/sheet" + strconv.Itoa(sw.sw.SheetID) + ".xml"
		rc.rows[part], rc.sheet, rc.w = f, sw.sw.SheetID, bufio.NewWriterSize(f, 1<<16)
	}
	b := append(rc.line[:0], `<row r="`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, `"><c r="A`...)
	b = strconv.AppendInt(b, int64(n), 10)
	b = append(b, node...)
	for _, c := range cells {
		if c.typ == "" && c.stored == "" {
			continue // no value: the StreamWriter writes no cell
		}
		b = append(b, `<c r="`...)
		b = appendColumnName(b, c.col+1)
		b = strconv.AppendInt(b, int64(n), 10)
		b = append(b, '"')
		switch {
		case c.typ == "inlineStr":
			b = append(b, ` t="inlineStr"><is><t`...)
			if preserveSpace(c.text) {
				b = append(b, ` xml:space="preserve"`...)
			}
			b = append(b, '>')
			b = append(b, c.stored...)
			b = append(b, `</t></is></c>`...)
			continue
		case c.typ == "b":
			b = append(b, ` t="b"><v>`...)
			if c.text == "1" {
				b = append(b, '1')
			} else {
				b = append(b, '0')
			}
		case dates[c.style]:
			b = append(b, ` s="`...)
			b = strconv.AppendInt(b, int64(sw.st.date), 10)
			b = append(b, `"><v>`...)
			b = append(b, c.stored...)
		default:
			b = append(b, `><v>`...)
			b = append(b, c.stored...)
		}
		b = append(b, `</v></c>`...)
	}
	b = append(b, `</row>`...)
	rc.line = b
	_, err := rc.w.Write(b)
	return err
}

func (rc *rowCopier) flush() error {
	if rc.w == nil {
		return nil
	}
	return rc.w.Flush()
}

// close removes the temporary files.
func (rc *rowCopier) close() {
	for _, f := range rc.rows {
		f.Close()
		os.Remove(f.Name())
	}
}

// nodeCellXML is the rest of a row's Node cell after its reference, as
// the StreamWriter writes the string node; a name the StreamWriter would
// write otherwise than escaped (with _xHHHH_ in it) is an error.
func nodeCellXML(node string) ([]byte, error) {
	if bstrPattern.MatchString(node) {
		return nil, fmt.Errorf("node %q: a name with _xHHHH_ in it", node)
	}
	b := []byte(`" t="inlineStr"><is><t`)
	if preserveSpace(node) {
		b = append(b, ` xml:space="preserve"`...)
	}
	b = append(b, '>')
	var esc bytes.Buffer
	if err := xml.EscapeText(&esc, []byte(node)); err != nil {
		return nil, err
	}
	b = append(b, strings.ReplaceAll(esc.String(), "&#xA;", "\n")...)
	return append(b, `</t></is></c>`...), nil
}

// bstrPattern is what excelize writes escaped again in a string cell.
var bstrPattern = regexp.MustCompile(`_x[a-fA-F\d]{4}_`)

// preserveSpace reports whether the StreamWriter marks a string cell's
// text xml:space="preserve": it starts or ends with white space.
func preserveSpace(s string) bool {
	if s == "" {
		return false
	}
	return strings.IndexByte("\t\n\r ", s[0]) >= 0 || strings.IndexByte("\t\n\r ", s[len(s)-1]) >= 0
}

// appendColumnName appends the letters of column col (from 0).
func appendColumnName(b []byte, col int) []byte {
	var buf [4]byte
	i := len(buf)
	for col++; col > 0; col = (col - 1) / 26 {
		i--
		buf[i] = byte('A' + (col-1)%26)
	}
	return append(b, buf[i:]...)
}

// copyable reports why a node's cell cannot be copied as stored: it is
// not one a run's export writes.
func copyable(c nodeCell, v any) error {
	switch c.typ {
	case "", "n", "b", "inlineStr":
	default:
		return fmt.Errorf("a cell of type %q, which a run's export does not write", c.typ)
	}
	if x, ok := v.(float64); ok && (math.IsNaN(x) || math.IsInf(x, 0)) {
		return fmt.Errorf("the number %q, which a run's export does not write", c.stored)
	}
	return nil
}

// splicedZip is the fleet workbook's ZIP: each sheet with copied rows gets
// them after its header row.
type splicedZip struct {
	excelize.ZipWriter
	rows    map[string]*os.File
	spliced []*splice
}

func (z *splicedZip) Create(name string) (io.Writer, error) {
	w, err := z.ZipWriter.Create(name)
	if f, ok := z.rows[name]; ok && err == nil {
		s := &splice{name: name, w: w, rows: f}
		z.spliced = append(z.spliced, s)
		return s, nil
	}
	return w, err
}

// Close ends the ZIP once every sheet's rows are in.
func (z *splicedZip) Close() error {
	if len(z.spliced) != len(z.rows) || slices.ContainsFunc(z.spliced, func(s *splice) bool { return !s.done }) {
		return errors.New("fleet workbook: a sheet's copied rows found no header row")
	}
	return z.ZipWriter.Close()
}

// splice writes a sheet, its copied rows after the end of its first row.
type splice struct {
	name string
	w    io.Writer
	rows *os.File
	head []byte
	done bool
}

func (s *splice) Write(p []byte) (int, error) {
	if s.done {
		return s.w.Write(p)
	}
	s.head = append(s.head, p...)
	i := bytes.Index(s.head, []byte("</row>"))
	if i < 0 {
		if len(s.head) > 1<<20 {
			return 0, fmt.Errorf("%s: no header row in its first MiB", s.name)
		}
		return len(p), nil
	}
	i += len("</row>")
	if _, err := s.w.Write(s.head[:i]); err != nil {
		return 0, err
	}
	if _, err := s.rows.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	if _, err := io.Copy(s.w, s.rows); err != nil {
		return 0, err
	}
	s.done = true
	_, err := s.w.Write(s.head[i:])
	s.head = nil
	return len(p), err
}
