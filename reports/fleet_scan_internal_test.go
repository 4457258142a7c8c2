package reports

import (
	"archive/zip"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"
)

// SameRowsAsExcelize checks that the scanner reads every sheet of book
// as excelize does, each cell's text as stored (shared strings resolved).
func SameRowsAsExcelize(book []byte) error {
	b, err := openNodeBook(bytes.NewReader(book), int64(len(book)))
	if err != nil {
		return err
	}
	f, err := excelize.OpenReader(bytes.NewReader(book))
	if err != nil {
		return err
	}
	defer f.Close()
	trim := func(rows [][]string) [][]string {
		for i, r := range rows {
			for len(r) > 0 && r[len(r)-1] == "" {
				r = r[:len(r)-1]
			}
			rows[i] = r
		}
		for len(rows) > 0 && len(rows[len(rows)-1]) == 0 {
			rows = rows[:len(rows)-1]
		}
		return rows
	}
	for name := range b.sheets {
		want, err := f.GetRows(name, excelize.Options{RawCellValue: true})
		if err != nil {
			return err
		}
		var got [][]string
		if err := b.rows(name, func(r []nodeCell) error { got = append(got, b.texts(r, 0)); return nil }); err != nil {
			return fmt.Errorf("sheet %s: %w", name, err)
		}
		got, want = trim(got), trim(want)
		if len(got) != len(want) {
			return fmt.Errorf("sheet %s: %d rows, excelize %d", name, len(got), len(want))
		}
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				return fmt.Errorf("sheet %s row %d: %q, excelize %q", name, i+1, got[i], want[i])
			}
		}
	}
	return nil
}

// The scanner reads the cells a workbook may hold beside what a run's
// export streams: shared strings, rich text, escaped and spaced text,
// cells left empty or skipped, booleans, numbers and dates, as excelize
// reads them.
func TestSheetScannerOddCells(t *testing.T) {
	f := excelize.NewFile()
	st, err := newStyles(f)
	if err != nil {
		t.Fatal(err)
	}
	set := func(cell string, v any) {
		if err := f.SetCellValue("Sheet1", cell, v); err != nil {
			t.Fatal(err)
		}
	}
	set("A1", "shared")
	set("B1", "a<b>&\"c'\td\ne")
	set("D1", "  spaced  ")
	set("E1", true)
	set("F1", 1.5)
	set("G1", int64(1)<<53)
	if err := f.SetCellRichText("Sheet1", "H1", []excelize.RichTextRun{{Text: "rich "}, {Text: "text", Font: &excelize.Font{Bold: true}}}); err != nil {
		t.Fatal(err)
	}
	set("A2", "shared") // the same shared string
	if err := f.SetCellStyle("Sheet1", "C2", "C2", st.date); err != nil {
		t.Fatal(err)
	}
	if _, err := f.NewSheet("Streamed"); err != nil {
		t.Fatal(err)
	}
	sw, err := newSheetWriter(f, st, sheetSpec{"Streamed", []column{{"A", 1}, {"B", 1}, {"C", 1}, {"D", 1}}}, DefaultRowLimit)
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 3, 2, 9, 0, 0, 123_456_789, time.UTC)
	for _, r := range [][]any{
		{"x&y<z>", nil, at, false},
		{"\u00e9\u4e2d\U0001F600", 3.25, math.MaxInt64, "tab\there\\"},
		{nil, nil, nil, nil},
		{" lead", "trail ", "", "\r\n"},
	} {
		if err := sw.row(r...); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := sw.close(); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := f.Write(&buf); err != nil {
		t.Fatal(err)
	}
	if err := SameRowsAsExcelize(buf.Bytes()); err != nil {
		t.Fatal(err)
	}
	b, err := openNodeBook(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		t.Fatal(err)
	}
	var rows [][]string
	if err := b.rows("Sheet1", func(r []nodeCell) error { rows = append(rows, b.texts(r, 0)); return nil }); err != nil {
		t.Fatal(err)
	}
	want := [][]string{{"shared", "a<b>&\"c'\td\ne", "", "  spaced  ", "1", "1.5", "9007199254740992", "rich text"}, {"shared", "", ""}}
	if len(rows) != 2 || !slices.Equal(rows[0], want[0]) || !slices.Equal(rows[1], want[1]) {
		t.Errorf("Sheet1: %q, want %q", rows, want)
	}
	var streamed [][]any
	if err := b.rows("Streamed", func(r []nodeCell) error {
		vals := make([]any, 4)
		for _, c := range r {
			v, err := b.value(c)
			if err != nil {
				return err
			}
			vals[c.col] = v
		}
		streamed = append(streamed, vals)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(streamed) != 5 {
		t.Fatalf("Streamed: %d rows, want 5", len(streamed))
	}
	if got := streamed[1]; got[0] != "x&y<z>" || got[1] != nil || got[2] != at.Round(time.Microsecond) || got[3] != false {
		t.Errorf("Streamed row 2: %#v", got)
	}
	if got := streamed[2]; got[0] != "\u00e9\u4e2d\U0001F600" || got[1] != 3.25 || got[2] != float64(math.MaxInt64) || got[3] != "tab\there\\" {
		t.Errorf("Streamed row 3: %#v", got)
	}
	if got := streamed[4]; got[0] != " lead" || got[1] != "trail " || got[3] != "\r\n" {
		t.Errorf("Streamed row 5: %#v", got)
	}
}

// FuzzSheetScanner: the scanner never panics, ends, and holds a row to
// its limits, whatever a peer sends as a sheet.
func FuzzSheetScanner(f *testing.F) {
	f.Add([]byte(`<?xml version="1.0"?><worksheet><sheetData><row r="1"><c r="A1" s="1"><v>12</v></c><c r="B1" t="inlineStr"><is><t xml:space="preserve">a&#x9;b&lt; </t></is></c><c r="D1"/></row><row r="2"/></sheetData></worksheet>`))
	f.Add([]byte(`<x:row><x:c r='ZZZZ1' t="s"><x:v>0</x:v></x:c></x:row><!-- a > comment --><row><c><is><r><t>a</t></r><r><t>b</t></r></is></c></row>`))
	f.Add([]byte("<row><c><v>a\r\nb&amp;&#128512;&bogus;</v></c></row><row><c><v><![CDATA[x]]></v></c></row>"))
	f.Fuzz(func(t *testing.T, b []byte) {
		s := &sheetScanner{r: bufio.NewReaderSize(bytes.NewReader(b), 16)}
		rows := 0
		err := s.each(func(r []nodeCell) error {
			rows++
			if len(r) > maxScanColumns {
				t.Fatalf("a row of %d cells", len(r))
			}
			for _, c := range r {
				if c.col < 0 || c.col >= maxScanColumns || len(c.text) > 4*maxScanText {
					t.Fatalf("cell %+v", c)
				}
			}
			return nil
		})
		if rows > len(b) {
			t.Fatalf("%d rows from %d bytes (%v)", rows, len(b), err)
		}
	})
}

// A row's Node cell is written as excelize's StreamWriter writes the
// string, and a name it would write otherwise than escaped is refused.
func TestNodeCellAsStreamWriter(t *testing.T) {
	for _, node := range []string{"a", "node-2.example", "n<&>\"'1", "\u00e9\u4e2d", " spaced "} {
		f := excelize.NewFile()
		sw, err := f.NewStreamWriter("Sheet1")
		if err != nil {
			t.Fatal(err)
		}
		if err := sw.SetRow("A1", []any{node}); err != nil {
			t.Fatal(err)
		}
		if err := sw.Flush(); err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := f.Write(&buf); err != nil {
			t.Fatal(err)
		}
		zr, err := zip.NewReader(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil {
			t.Fatal(err)
		}
		rc, err := zr.Open("xl/worksheets/sheet1.xml")
		if err != nil {
			t.Fatal(err)
		}
		sheet, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		got, err := nodeCellXML(node)
		if err != nil {
			t.Fatal(err)
		}
		if want := append([]byte(`<c r="A1`), got...); !bytes.Contains(sheet, want) {
			t.Errorf("node %q: %s is not in the StreamWriter's %s", node, want, sheet)
		}
	}
	if _, err := nodeCellXML("a_x0041_"); err == nil {
		t.Error("a node named with _x0041_ in it is taken")
	}
}
