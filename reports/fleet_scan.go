package reports

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// A sheet's rows are read from its XML bytes, which excelize's stream
// writer keeps regular (<row r=".."><c r=".." s=".." t=".."><v>..</v></c>),
// by a scanner: encoding/xml's token reader, which it replaced, took
// longer than writing the rows (BenchmarkFleetEvidence/fleet3).

// Limits of what the scanner takes from a node's workbook, which another
// node sent.
const (
	maxScanColumns = 16384   // Excel's columns
	maxScanText    = 1 << 20 // a cell's text as stored; Excel holds 32,767 characters
	maxScanTag     = 1 << 16
	maxScanRow     = 1 << 24 // a row's texts
)

// errSheetXML is a sheet whose XML the scanner does not take.
var errSheetXML = errors.New("sheet XML not understood")

// rows calls fn with each row of sheet, in order, its cells in order; the
// cells are fn's until it returns.
func (b *nodeBook) rows(sheet string, fn func([]nodeCell) error) error {
	f, ok := b.files[b.sheets[sheet]]
	if !ok {
		return fmt.Errorf("the workbook has no sheet %s", sheet)
	}
	rc, err := f.Open()
	if err != nil {
		return err
	}
	defer rc.Close()
	s := &sheetScanner{r: bufio.NewReaderSize(rc, 64<<10)}
	var fnErr error
	err = s.each(func(row []nodeCell) error {
		fnErr = fn(row)
		return fnErr
	})
	if err != nil && err != fnErr {
		return fmt.Errorf("sheet %s: %w", sheet, err)
	}
	return err
}

// sheetScanner reads a sheet's rows, one row's cells at a time.
type sheetScanner struct {
	r     *bufio.Reader
	tag   []byte
	text  []byte // the current cell's text as stored, escaped
	arena []byte // the row's cell texts, unescaped, then as stored
	ends  []int  // each cell's ends in arena: text, then stored
	cells []nodeCell
}

// each calls fn with every row of the sheet.
func (s *sheetScanner) each(fn func([]nodeCell) error) error {
	inRow, inCell, inText := false, false, false
	for {
		tag, err := s.next(inText)
		if errors.Is(err, io.EOF) {
			if inRow {
				return fmt.Errorf("%w: it ends inside a row", errSheetXML)
			}
			return nil
		} else if err != nil {
			return err
		}
		name, closing, empty := tagName(tag)
		switch {
		case name == "row" && !closing:
			if inRow {
				return fmt.Errorf("%w: a row inside a row", errSheetXML)
			}
			s.cells, s.arena, s.ends = s.cells[:0], s.arena[:0], s.ends[:0]
			inRow = !empty
			if empty {
				if err := fn(s.cells); err != nil {
					return err
				}
			}
		case name == "row":
			if !inRow || inCell {
				return fmt.Errorf("%w: a row ends where none is open", errSheetXML)
			}
			inRow = false
			if err := fn(s.row()); err != nil {
				return err
			}
		case name == "c" && !closing:
			if !inRow || inCell || len(s.cells) >= maxScanColumns {
				return fmt.Errorf("%w: a cell outside a row, in a cell, or past Excel's columns", errSheetXML)
			}
			if err := s.startCell(tag); err != nil {
				return err
			}
			inCell = !empty
			if empty {
				s.ends = append(s.ends, len(s.arena), len(s.arena))
			}
		case name == "c":
			if !inCell {
				return fmt.Errorf("%w: a cell ends where none is open", errSheetXML)
			}
			inCell, inText = false, false
			var err error
			if s.arena, err = appendUnescaped(s.arena, s.text); err != nil {
				return err
			}
			s.ends = append(s.ends, len(s.arena))
			s.arena = append(s.arena, s.text...)
			s.ends = append(s.ends, len(s.arena))
			if len(s.arena) > maxScanRow {
				return fmt.Errorf("%w: a row of more than %d bytes", errSheetXML, maxScanRow)
			}
		case name == "v" || name == "t":
			inText = inCell && !closing && !empty
		}
	}
}

// startCell begins the cell whose start tag is tag: its column (after the
// last cell's when it names none), style and type.
func (s *sheetScanner) startCell(tag []byte) error {
	c := nodeCell{col: len(s.cells)}
	if n := len(s.cells); n > 0 {
		c.col = s.cells[n-1].col + 1
	}
	for rest := tag; ; {
		var name, val []byte
		if name, val, rest = nextAttr(rest); name == nil {
			break
		}
		switch string(name) {
		case "r":
			col, _, err := cellColumn(string(val))
			if err != nil || col >= maxScanColumns {
				return fmt.Errorf("%w: cell reference %q", errSheetXML, val)
			}
			c.col = col
		case "s":
			c.style, _ = strconv.Atoi(string(val))
		case "t":
			c.typ = cellTypes[string(val)]
			if c.typ == "" && len(val) > 0 {
				c.typ = string(val)
			}
		}
	}
	s.cells = append(s.cells, c)
	s.text = s.text[:0]
	return nil
}

// cellTypes interns the t attributes a run workbook's cells have.
var cellTypes = map[string]string{"b": "b", "s": "s", "n": "n", "str": "str", "inlineStr": "inlineStr", "e": "e", "d": "d"}

// row is the row's cells, their texts in one string.
func (s *sheetScanner) row() []nodeCell {
	all := string(s.arena)
	start := 0
	for i := range s.cells {
		text, stored := s.ends[2*i], s.ends[2*i+1]
		s.cells[i].text, s.cells[i].stored = all[start:text], all[text:stored]
		start = stored
	}
	return s.cells
}

// next reads to the next tag and returns it, between its < and >; the
// text before it is added to the cell's text when keep is true.
func (s *sheetScanner) next(keep bool) ([]byte, error) {
	for {
		b, err := s.r.ReadSlice('<')
		text := b
		if err == nil {
			text = b[:len(b)-1]
		}
		if keep {
			if s.text = append(s.text, text...); len(s.text) > maxScanText {
				return nil, fmt.Errorf("%w: a cell of more than %d bytes", errSheetXML, maxScanText)
			}
		}
		if err == nil {
			break
		} else if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
	s.tag = s.tag[:0]
	for {
		b, err := s.r.ReadSlice('>')
		s.tag = append(s.tag, b...)
		if len(s.tag) > maxScanTag {
			return nil, fmt.Errorf("%w: a tag of more than %d bytes", errSheetXML, maxScanTag)
		}
		if err == nil && bytes.HasPrefix(s.tag, []byte("!--")) && !bytes.HasSuffix(s.tag, []byte("-->")) {
			continue // a comment may hold a >
		}
		if err == nil {
			break
		} else if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: it ends inside a tag", errSheetXML)
		} else if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
	tag := s.tag[:len(s.tag)-1]
	if bytes.HasPrefix(tag, []byte("![CDATA[")) {
		return nil, fmt.Errorf("%w: a CDATA section, which a run workbook has not", errSheetXML)
	}
	return tag, nil
}

// tagName is a tag's local name (its prefix dropped) when it is one the
// scanner looks for, whether it is an end tag and whether it is an empty
// element (<c r="A1"/>).
func tagName(tag []byte) (name string, closing, empty bool) {
	if len(tag) > 0 && tag[0] == '/' {
		closing, tag = true, tag[1:]
	}
	empty = len(tag) > 0 && tag[len(tag)-1] == '/'
	end := 0
	for end < len(tag) && !isSpace(tag[end]) && tag[end] != '/' {
		end++
	}
	n := tag[:end]
	if i := bytes.IndexByte(n, ':'); i >= 0 {
		n = n[i+1:]
	}
	switch string(n) { // the names the scanner looks for, without allocating
	case "row":
		return "row", closing, empty
	case "c":
		return "c", closing, empty
	case "v":
		return "v", closing, empty
	case "t":
		return "t", closing, empty
	}
	return "", closing, empty
}

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\r' || b == '\n' }

// nextAttr reads the next attribute of the start tag (or the rest of it)
// in tag: its local name and raw value, nil when there is none.
func nextAttr(tag []byte) (name, val, rest []byte) {
	i := 0
	if len(tag) > 0 && !isSpace(tag[0]) { // the tag's name
		for i < len(tag) && !isSpace(tag[i]) {
			i++
		}
	}
	for i < len(tag) && isSpace(tag[i]) {
		i++
	}
	start := i
	for i < len(tag) && tag[i] != '=' && !isSpace(tag[i]) {
		i++
	}
	name = tag[start:i]
	for i < len(tag) && (tag[i] == '=' || isSpace(tag[i])) {
		i++
	}
	if len(name) == 0 || i >= len(tag) || tag[i] != '"' && tag[i] != '\'' {
		return nil, nil, nil
	}
	end := bytes.IndexByte(tag[i+1:], tag[i])
	if end < 0 {
		return nil, nil, nil
	}
	if j := bytes.IndexByte(name, ':'); j >= 0 {
		name = name[j+1:]
	}
	return name, tag[i+1 : i+1+end], tag[i+2+end:]
}

// appendUnescaped appends text to dst with XML's five entities and
// character references resolved and line ends made \n, as an XML reader
// gives it.
func appendUnescaped(dst, text []byte) ([]byte, error) {
	if bytes.IndexByte(text, '&') < 0 && bytes.IndexByte(text, '\r') < 0 {
		return append(dst, text...), nil
	}
	for len(text) > 0 {
		c := text[0]
		switch {
		case c == '\r':
			dst = append(dst, '\n')
			text = text[1:]
			if len(text) > 0 && text[0] == '\n' {
				text = text[1:]
			}
			continue
		case c != '&':
			dst = append(dst, c)
			text = text[1:]
			continue
		}
		end := bytes.IndexByte(text, ';')
		if end < 0 || end > 12 {
			return dst, fmt.Errorf("%w: an entity in %q", errSheetXML, text[:min(len(text), 12)])
		}
		ent := string(text[1:end])
		text = text[end+1:]
		if r, ok := xmlEntities[ent]; ok {
			dst = append(dst, r)
			continue
		}
		var n uint64
		var err error
		switch {
		case strings.HasPrefix(ent, "#x"):
			n, err = strconv.ParseUint(ent[2:], 16, 32)
		case strings.HasPrefix(ent, "#"):
			n, err = strconv.ParseUint(ent[1:], 10, 32)
		default:
			err = fmt.Errorf("unknown entity &%s;", ent)
		}
		if err != nil || !utf8.ValidRune(rune(n)) {
			return dst, fmt.Errorf("%w: entity &%s;", errSheetXML, ent)
		}
		dst = utf8.AppendRune(dst, rune(n))
	}
	return dst, nil
}

var xmlEntities = map[string]byte{"lt": '<', "gt": '>', "amp": '&', "quot": '"', "apos": '\''}
