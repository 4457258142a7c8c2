package pack

import (
	"archive/zip"
	"bufio"
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The workbook is read with a small scanner of its sheets' XML rather
// than excelize: a verifier reads every cell of sheets of a million rows,
// which an XML decoder takes many seconds over, and needs nothing of a
// sheet but its cells' values.

// Limits of what the scanner accepts from a workbook.
const (
	maxCellText     = 1 << 20
	maxCellsPerRow  = 16384 // Excel's columns
	maxSharedString = 1 << 24
)

// book is an opened workbook: its sheets by name.
type book struct {
	zr      *zip.Reader
	files   map[string]*zip.File
	sheets  map[string]string // sheet name -> part name
	strings []string          // shared strings, when the workbook has them
}

func openBook(zr *zip.Reader) (*book, error) {
	b := &book{zr: zr, files: map[string]*zip.File{}, sheets: map[string]string{}}
	for _, f := range zr.File {
		b.files[f.Name] = f
	}
	var wb struct {
		Sheets []struct {
			Name string `xml:"name,attr"`
			ID   string `xml:"http://schemas.openxmlformats.org/officeDocument/2006/relationships id,attr"`
		} `xml:"sheets>sheet"`
	}
	if err := b.decodeXML("xl/workbook.xml", &wb); err != nil {
		return nil, err
	}
	var rels struct {
		Rels []struct {
			ID     string `xml:"Id,attr"`
			Target string `xml:"Target,attr"`
		} `xml:"Relationship"`
	}
	if err := b.decodeXML("xl/_rels/workbook.xml.rels", &rels); err != nil {
		return nil, err
	}
	targets := map[string]string{}
	for _, r := range rels.Rels {
		t := r.Target
		if strings.HasPrefix(t, "/") {
			t = strings.TrimPrefix(t, "/")
		} else {
			t = path.Join("xl", t)
		}
		targets[r.ID] = t
	}
	for _, s := range wb.Sheets {
		if t, ok := targets[s.ID]; ok {
			b.sheets[s.Name] = t
		}
	}
	if _, ok := b.files["xl/sharedStrings.xml"]; ok {
		var sst struct {
			SI []struct {
				T string `xml:"t"`
				R []struct {
					T string `xml:"t"`
				} `xml:"r"`
			} `xml:"si"`
		}
		if err := b.decodeXML("xl/sharedStrings.xml", &sst); err != nil {
			return nil, err
		}
		for _, si := range sst.SI {
			s := si.T
			for _, r := range si.R {
				s += r.T
			}
			b.strings = append(b.strings, s)
		}
	}
	return b, nil
}

// checkParts reads every part of the workbook to its end, so that damage
// anywhere in it (a part no check reads, the tail of a sheet after its
// last row, styles) fails the part's inflate or its zip checksum and is
// named, with the sheet when the part is one.
func (b *book) checkParts() error {
	sheetOf := map[string]string{}
	for name, part := range b.sheets {
		sheetOf[part] = name
	}
	for _, f := range b.zr.File {
		rc, err := f.Open()
		if err == nil {
			_, err = io.Copy(io.Discard, rc)
			rc.Close()
		}
		if err != nil {
			if name, ok := sheetOf[f.Name]; ok {
				return fmt.Errorf("sheet %q (part %s) is damaged: %w", name, f.Name, err)
			}
			return fmt.Errorf("part %s is damaged: %w", f.Name, err)
		}
	}
	return nil
}

func (b *book) decodeXML(name string, v any) error {
	f, ok := b.files[name]
	if !ok {
		return fmt.Errorf("workbook has no %s", name)
	}
	rc, err := f.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	if err := xml.NewDecoder(io.LimitReader(rc, maxSharedString)).Decode(v); err != nil {
		return fmt.Errorf("workbook %s: %w", name, err)
	}
	return nil
}

// rows opens the sheet called name; ok is false when there is none.
func (b *book) rows(name string) (*rowReader, bool, error) {
	part, ok := b.sheets[name]
	if !ok {
		return nil, false, nil
	}
	f, ok := b.files[part]
	if !ok {
		return nil, false, fmt.Errorf("workbook lacks sheet %q's part %s", name, part)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, false, err
	}
	return &rowReader{r: bufio.NewReaderSize(rc, 1<<16), rc: rc, strings: b.strings}, true, nil
}

// cell is one cell as the sheet stores it.
type cell struct {
	col  int    // from 0
	typ  string // the t attribute: "" (number), "s", "inlineStr", "str", "b", ...
	text []byte // the value's text, shared strings resolved; valid until the next row
	// style is the s attribute (a cellXfs index), read when the reader's
	// style is set.
	style int
}

// rowReader scans a sheet's rows in order.
type rowReader struct {
	r       *bufio.Reader
	rc      io.Closer
	strings []string
	tag     []byte
	cells   []cell
	arena   []byte // the current row's cell texts
	done    bool
	style   bool // read each cell's style too
}

func (rr *rowReader) Close() error { return rr.rc.Close() }

var errBadSheet = errors.New("sheet XML not understood")

// readTag reads up to the next tag and returns it (the text between <
// and >). The text before it is appended to *keep when keep is not nil,
// and dropped otherwise: the reader's buffer is reused by the next read.
func (rr *rowReader) readTag(keep *[]byte) (tag []byte, err error) {
	for {
		t, err := rr.r.ReadSlice('<')
		if keep != nil {
			text := t
			if err == nil {
				text = t[:len(t)-1]
			}
			*keep = append(*keep, text...)
			if len(*keep) > maxCellText {
				return nil, errBadSheet
			}
		}
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull {
			return nil, err
		}
	}
	rr.tag = rr.tag[:0]
	for {
		s, err := rr.r.ReadSlice('>')
		rr.tag = append(rr.tag, s...)
		if err == nil {
			break
		}
		if err != bufio.ErrBufferFull || len(rr.tag) > 1<<20 {
			return nil, errBadSheet
		}
	}
	return rr.tag[:len(rr.tag)-1], nil
}

func tagName(tag []byte) []byte {
	end := bytes.IndexAny(tag, " \t\r\n/")
	if end < 0 {
		return tag
	}
	if end == 0 && len(tag) > 0 && tag[0] == '/' {
		e := bytes.IndexAny(tag[1:], " \t\r\n")
		if e < 0 {
			return tag
		}
		return tag[:e+1]
	}
	return tag[:end]
}

func attr(tag []byte, name string) ([]byte, bool) {
	for i := 0; ; {
		j := bytes.Index(tag[i:], []byte(name+`="`))
		if j < 0 {
			return nil, false
		}
		j += i
		if j > 0 && (tag[j-1] == ' ' || tag[j-1] == '\t' || tag[j-1] == '\n' || tag[j-1] == '\r') {
			v := tag[j+len(name)+2:]
			end := bytes.IndexByte(v, '"')
			if end < 0 {
				return nil, false
			}
			return v[:end], true
		}
		i = j + 1
	}
}

// cellType interns a cell's t attribute.
func cellType(t []byte) string {
	for _, known := range []string{"", "n", "s", "inlineStr", "str", "b", "e", "d"} {
		if string(t) == known {
			return known
		}
	}
	return "?"
}

// next returns the next row's cells, io.EOF after the last row.
func (rr *rowReader) next() ([]cell, error) {
	if rr.done {
		return nil, io.EOF
	}
	rr.cells, rr.arena = rr.cells[:0], rr.arena[:0]
	inRow := false
	var cur *cell
	var val []byte
	inValue := false
	for {
		var keep *[]byte
		if inValue {
			keep = &val
		}
		tag, err := rr.readTag(keep)
		if err == io.EOF {
			rr.done = true
			if inRow {
				return nil, errBadSheet
			}
			return nil, io.EOF
		}
		if err != nil {
			return nil, err
		}
		name := tagName(tag)
		selfClosing := len(tag) > 0 && tag[len(tag)-1] == '/'
		switch string(name) {
		case "row":
			if inRow {
				return nil, errBadSheet
			}
			if selfClosing {
				return rr.cells, nil
			}
			inRow = true
		case "/row":
			if !inRow || cur != nil {
				return nil, errBadSheet
			}
			return rr.cells, nil
		case "c":
			if !inRow || cur != nil || len(rr.cells) >= maxCellsPerRow {
				return nil, errBadSheet
			}
			c := cell{col: len(rr.cells)}
			if len(rr.cells) > 0 {
				c.col = rr.cells[len(rr.cells)-1].col + 1
			}
			if ref, ok := attr(tag, "r"); ok {
				col, ok := columnIndex(string(ref))
				if !ok {
					return nil, errBadSheet
				}
				c.col = col
			}
			t, _ := attr(tag, "t")
			c.typ = cellType(t)
			if rr.style {
				if s, ok := attr(tag, "s"); ok { // none: style 0
					c.style, _ = strconv.Atoi(string(s))
				}
			}
			if selfClosing {
				rr.cells = append(rr.cells, c)
				continue
			}
			rr.cells = append(rr.cells, c)
			cur, val = &rr.cells[len(rr.cells)-1], val[:0]
		case "v", "t":
			if cur == nil {
				return nil, errBadSheet
			}
			inValue = !selfClosing
		case "/v", "/t":
			inValue = false
		case "/c":
			if cur == nil {
				return nil, errBadSheet
			}
			start := len(rr.arena)
			var err error
			if rr.arena, err = appendUnescaped(rr.arena, val); err != nil {
				return nil, err
			}
			if cur.typ == "s" {
				i, err := strconv.Atoi(string(rr.arena[start:]))
				if err != nil || i < 0 || i >= len(rr.strings) {
					return nil, errBadSheet
				}
				rr.arena = append(rr.arena[:start], rr.strings[i]...)
			}
			cur.text, cur = rr.arena[start:len(rr.arena):len(rr.arena)], nil
		case "/sheetData":
			rr.done = true
			if inRow {
				return nil, errBadSheet
			}
			return nil, io.EOF
		}
	}
}

// columnIndex reads the column of a cell reference ("AB12" is 27).
func columnIndex(ref string) (int, bool) {
	col, i := 0, 0
	for ; i < len(ref) && ref[i] >= 'A' && ref[i] <= 'Z'; i++ {
		col = col*26 + int(ref[i]-'A'+1)
		if col > maxCellsPerRow {
			return 0, false
		}
	}
	return col - 1, i > 0
}

// appendUnescaped appends b to dst with XML's character references and
// the five entities resolved, and its line ends made \n as XML reads them
// (a CR written &#xD; stays one).
func appendUnescaped(dst, b []byte) ([]byte, error) {
	if bytes.IndexByte(b, '\r') >= 0 { // never in what excelize writes
		b = bytes.ReplaceAll(bytes.ReplaceAll(b, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '&')
		if i < 0 {
			return append(dst, b...), nil
		}
		dst = append(dst, b[:i]...)
		b = b[i:]
		end := bytes.IndexByte(b, ';')
		if end < 0 || end > 12 {
			return dst, errBadSheet
		}
		ent := string(b[1:end])
		b = b[end+1:]
		switch ent {
		case "lt":
			dst = append(dst, '<')
		case "gt":
			dst = append(dst, '>')
		case "amp":
			dst = append(dst, '&')
		case "quot":
			dst = append(dst, '"')
		case "apos":
			dst = append(dst, '\'')
		default:
			var n uint64
			var err error
			switch {
			case strings.HasPrefix(ent, "#x"):
				n, err = strconv.ParseUint(ent[2:], 16, 32)
			case strings.HasPrefix(ent, "#"):
				n, err = strconv.ParseUint(ent[1:], 10, 32)
			default:
				err = errBadSheet
			}
			if err != nil {
				return dst, errBadSheet
			}
			dst = utf8.AppendRune(dst, rune(n))
		}
	}
	return dst, nil
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReaderSize(bytes.NewReader(b), 16) }
