package reports

import (
	"archive/zip"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"path"
	"strconv"
	"strings"
	"time"
)

// A node's run workbook is read for the fleet workbook by a scan of its
// sheets' XML bytes (sheetScanner) rather than excelize's cell by cell
// look-ups, which take minutes over sheets of a hundred thousand rows.

// nodeBook is a run workbook opened for its cells.
type nodeBook struct {
	files  map[string]*zip.File
	sheets map[string]string // sheet name -> part
	dates  map[int]bool      // cell style index -> the date style
	shared []string
}

// nodeCell is one cell as a sheet stores it.
type nodeCell struct {
	col   int // from 0
	style int
	typ   string // the t attribute: "" (number), "b", "s", "inlineStr", "str", ...
	text  string
	// stored is the text as the sheet's XML has it, escaped.
	stored string
}

func openNodeBook(ra io.ReaderAt, size int64) (*nodeBook, error) {
	zr, err := zip.NewReader(ra, size)
	if err != nil {
		return nil, err
	}
	b := &nodeBook{files: map[string]*zip.File{}, sheets: map[string]string{}}
	for _, f := range zr.File {
		b.files[f.Name] = f
	}
	var wb struct {
		Sheets []struct {
			Name string `xml:"name,attr"`
			ID   string `xml:"http://schemas.openxmlformats.org/officeDocument/2006/relationships id,attr"`
		} `xml:"sheets>sheet"`
	}
	var rels struct {
		Rels []struct {
			ID     string `xml:"Id,attr"`
			Target string `xml:"Target,attr"`
		} `xml:"Relationship"`
	}
	var st Styles
	for _, d := range []struct {
		name string
		v    any
	}{{"xl/workbook.xml", &wb}, {"xl/_rels/workbook.xml.rels", &rels}, {"xl/styles.xml", &st}} {
		if err := b.decode(d.name, d.v); err != nil {
			return nil, err
		}
	}
	targets := map[string]string{}
	for _, r := range rels.Rels {
		if t, ok := strings.CutPrefix(r.Target, "/"); ok {
			targets[r.ID] = t
		} else {
			targets[r.ID] = path.Join("xl", r.Target)
		}
	}
	for _, s := range wb.Sheets {
		b.sheets[s.Name] = targets[s.ID]
	}
	b.dates = st.DateStyles()
	if _, ok := b.files["xl/sharedStrings.xml"]; ok {
		var sst struct {
			SI []struct {
				T string `xml:"t"`
				R []struct {
					T string `xml:"t"`
				} `xml:"r"`
			} `xml:"si"`
		}
		if err := b.decode("xl/sharedStrings.xml", &sst); err != nil {
			return nil, err
		}
		for _, si := range sst.SI {
			s := si.T
			for _, r := range si.R { // rich text: its runs' texts
				s += r.T
			}
			b.shared = append(b.shared, s)
		}
	}
	return b, nil
}

func (b *nodeBook) decode(name string, v any) error {
	f, ok := b.files[name]
	if !ok {
		return fmt.Errorf("the workbook has no %s", name)
	}
	rc, err := f.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	return xml.NewDecoder(rc).Decode(v)
}

func (b *nodeBook) has(sheet string) bool { _, ok := b.sheets[sheet]; return ok }

// cellColumn is the column (from 0) of a cell reference such as "AB12".
func cellColumn(ref string) (int, string, error) {
	col := 0
	i := 0
	for ; i < len(ref) && ref[i] >= 'A' && ref[i] <= 'Z'; i++ {
		col = col*26 + int(ref[i]-'A'+1)
	}
	if i == 0 {
		return 0, "", fmt.Errorf("cell reference %q", ref)
	}
	return col - 1, ref[i:], nil
}

// value is a cell's value as the run's export gave it: a bool, a date
// (a number in the date style) as a time.Time to the microsecond, a
// serial's precision, a float64, a string, or nil when empty.
func (b *nodeBook) value(c nodeCell) (any, error) {
	switch c.typ {
	case "b":
		return c.text == "1", nil
	case "s":
		i, err := strconv.Atoi(c.text)
		if err != nil || i < 0 || i >= len(b.shared) {
			return nil, fmt.Errorf("shared string %q", c.text)
		}
		return b.shared[i], nil
	case "", "n":
	default:
		return c.text, nil
	}
	if c.text == "" {
		return nil, nil
	}
	x, err := strconv.ParseFloat(c.text, 64)
	if err != nil {
		return nil, err
	}
	if b.dates[c.style] {
		// The day and its fraction apart: x * 86400e9 whole is past
		// float64's integers, and would lose the microseconds.
		days, frac := math.Modf(x)
		t := excelEpoch.Add(time.Duration(days)*24*time.Hour + time.Duration(math.Round(frac*86400e9)))
		return t.Round(time.Microsecond), nil
	}
	return x, nil
}

// texts are a row's cells as text by column, n columns at least.
func (b *nodeBook) texts(row []nodeCell, n int) []string {
	out := make([]string, n)
	for _, c := range row {
		for c.col >= len(out) {
			out = append(out, "")
		}
		if v, err := b.value(c); err == nil && v != nil {
			if s, ok := v.(string); ok {
				out[c.col] = s
				continue
			}
		}
		out[c.col] = c.text
	}
	return out
}
