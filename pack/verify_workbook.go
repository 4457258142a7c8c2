package pack

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"io"
	"math"
	"strconv"
	"time"

	"github.com/auditd/auditd/reports"
)

// The workbook's check: every sheet's rows against the rows the leaves
// derive, by population, with each part's hash.

// population reads one population's sheets in order, part after part.
type population struct {
	b      *book
	name   string
	part   int
	rr     *rowReader
	row    int // rows read from the current part, header included
	header []string
	stats  []sheetHash
	sum    hashWriter // the current part's rows so far
	byCol  []*cell
	// key names what a row's first value is, in messages: "event" (its
	// seq) by default, "run" for the sheets with a row per run.
	key string
}

type sheetHash struct {
	name string
	rows int64
	sum  string
	row  int // the Manifest's row that states it
}

// verifyWorkbook checks every sheet of the workbook against the leaves:
// the Manifest holds the pack's checkpoint and key, the Runs sheet the
// runs' ranges, every event population exactly the rows the leaves give,
// and every derived sheet exactly the rows the runs' reconciliations
// (derived, computed from the leaves) give, cell by cell and in order,
// with the rows and SHA-256 the Manifest states; the Manifest lists every
// sheet.
func (p *Pack) verifyWorkbook(feed *leafFeed, derived func() ([]*reports.Report, error), r *Report) error {
	defer feed.done()
	defer derived() // the reconciliations are waited for on every path
	zr, err := p.workbook()
	if err != nil {
		r.fail("%v", err)
		return nil
	}
	b, err := openBook(zr)
	if err != nil {
		r.fail("%s: %v", FileWorkbook, err)
		return nil
	}
	if err := b.checkParts(); err != nil {
		r.fail("%s: %v", FileWorkbook, err)
	}
	stated, fields, ok := p.checkManifestSheet(b, r)
	if !ok {
		return nil
	}
	p.checkRunsSheet(b, r)

	pops := map[string]*population{}
	for _, name := range reports.EventSheets() {
		pops[name] = &population{b: b, name: name, header: reports.SheetColumns(name)}
	}
	ids := make([]string, len(p.Manifest.Runs))
	ranges := make([][2]uint64, len(p.Manifest.Runs))
	for i, run := range p.Manifest.Runs {
		ids[i], ranges[i] = run.ID, [2]uint64{run.First, run.Last}
	}
	bad := map[string]bool{}
	var cellText []byte
	err = reports.EventRows(packEvents{p, feed}, ids, ranges, p.access, p.retention, func(sheet string, vals []any) error {
		pop := pops[sheet]
		if bad[sheet] {
			return nil
		}
		if msg := pop.check(vals, &cellText); msg != "" {
			r.fail("%s: %s", FileWorkbook, msg)
			bad[sheet] = true
		}
		return nil
	})
	if err != nil {
		r.fail("%s: the leaves cannot be read for the workbook's rows: %v", FileLeaves, err)
		return nil
	}
	for _, name := range reports.EventSheets() {
		p.settle(pops[name], bad[name], stated, r)
	}
	reps, err := derived()
	if err != nil {
		r.fail("%s: %v", FileLeaves, err)
		return nil
	}
	p.checkDerived(b, reps, stated, r)
	p.checkManifestFields(b, fields, stated, reps, r)
	return nil
}

// manifestField is a field of the Manifest sheet: its value's text, and
// its row (from 1, as a spreadsheet numbers them).
type manifestField struct {
	value string
	row   int
}

// checkManifestSheet checks the Manifest sheet's checkpoint and key and
// returns its fields and the row counts and hashes it states per sheet.
func (p *Pack) checkManifestSheet(b *book, r *Report) (map[string]sheetHash, map[string]manifestField, bool) {
	rr, ok, err := b.rows(reports.SheetManifest)
	if err != nil || !ok {
		r.fail("%s: no readable Manifest sheet (%v)", FileWorkbook, err)
		return nil, nil, false
	}
	defer rr.Close()
	stated := map[string]sheetHash{}
	fields := map[string]manifestField{}
	var checkpoint, key string
	table := false
	for i := 0; ; i++ {
		cells, err := rr.next()
		if err == io.EOF {
			break
		}
		if err != nil || i > 100_000 {
			r.fail("%s: Manifest sheet: %v", FileWorkbook, err)
			return nil, nil, false
		}
		c := texts(cells, 3)
		switch {
		case table:
			n, _ := strconv.ParseInt(c[1], 10, 64)
			if _, dup := stated[c[0]]; dup {
				r.fail("%s: sheet %q row %d lists sheet %q a second time", FileWorkbook, reports.SheetManifest, i+1, c[0])
			}
			stated[c[0]] = sheetHash{name: c[0], rows: n, sum: c[2], row: i + 1}
		case c[0] == reports.ManifestFieldCheckpoint:
			checkpoint = c[1]
		case c[0] == reports.ManifestFieldPublicKey:
			key = c[1]
		case c[0] == reports.ManifestFieldSheet:
			table = true
		default:
			fields[c[0]] = manifestField{value: c[1], row: i + 1}
		}
	}
	if checkpoint != string(p.Checkpoint) {
		r.fail("%s: the Manifest's signed checkpoint is not %s", FileWorkbook, FileCheckpoint)
	}
	if key != p.PublicKey {
		r.fail("%s: the Manifest's public key is not %s", FileWorkbook, FilePublicKey)
	}
	return stated, fields, true
}

// checkRunsSheet checks that the Runs sheet states the runs and ranges
// pack.json does.
func (p *Pack) checkRunsSheet(b *book, r *Report) {
	cols := reports.SheetColumns(reports.SheetRuns)
	idx := func(title string) int {
		for i, c := range cols {
			if c == title {
				return i
			}
		}
		return 0
	}
	iRun, iFirst, iLast := idx("Run"), idx("First seq"), idx("Last seq")
	rr, ok, err := b.rows(reports.SheetRuns)
	if err != nil || !ok {
		r.fail("%s: no readable Runs sheet (%v)", FileWorkbook, err)
		return
	}
	defer rr.Close()
	var got []Run
	for i := 0; ; i++ {
		cells, err := rr.next()
		if err == io.EOF {
			break
		}
		if err != nil || i > maxRuns {
			r.fail("%s: Runs sheet: %v", FileWorkbook, err)
			return
		}
		if i == 0 {
			continue
		}
		c := texts(cells, len(cols))
		first, _ := strconv.ParseUint(c[iFirst], 10, 64)
		last, _ := strconv.ParseUint(c[iLast], 10, 64)
		got = append(got, Run{ID: c[iRun], First: first, Last: last})
	}
	if len(got) != len(p.Manifest.Runs) {
		r.fail("%s: the Runs sheet lists %d runs, %s %d", FileWorkbook, len(got), FileManifest, len(p.Manifest.Runs))
		return
	}
	for i, run := range got {
		if run != p.Manifest.Runs[i] {
			r.fail("%s: Runs sheet row %d is run %s, events %d to %d; %s says %s, %d to %d", FileWorkbook, i+2,
				run.ID, run.First, run.Last, FileManifest, p.Manifest.Runs[i].ID, p.Manifest.Runs[i].First, p.Manifest.Runs[i].Last)
		}
	}
}

// texts returns the text of cells by column, n columns at least.
func texts(cells []cell, n int) []string {
	out := make([]string, n)
	for _, c := range cells {
		if c.col < 0 || c.col >= 1<<14 {
			continue
		}
		for c.col >= len(out) {
			out = append(out, "")
		}
		out[c.col] = string(c.text)
	}
	return out
}

// check compares the population's next row with vals, the row the leaves
// give, and returns what differs ("" when nothing).
func (pop *population) check(vals []any, buf *[]byte) string {
	cells, msg := pop.nextRow()
	if msg != "" {
		return msg
	}
	if cells == nil {
		return fmt.Sprintf("sheet %q ends before the row the leaves give for event %v: rows missing", partName(pop.name, pop.part), vals[0])
	}
	at := func() string { return fmt.Sprintf("sheet %q row %d", partName(pop.name, pop.part), pop.row) }
	if cap(pop.byCol) < len(vals) {
		pop.byCol = make([]*cell, len(vals))
	}
	byCol := pop.byCol[:len(vals)]
	clear(byCol)
	for i := range cells {
		c := &cells[i]
		if c.col >= len(vals) {
			if len(c.text) > 0 {
				return fmt.Sprintf("%s has a value past its last column", at())
			}
			continue
		}
		byCol[c.col] = c
	}
	b := (*buf)[:0]
	for i, v := range vals {
		if i > 0 {
			b = append(b, '\t')
		}
		start := len(b)
		if _, ok := v.(sheetSays); ok {
			if byCol[i] != nil {
				b = reports.AppendCellText(b, string(byCol[i].text))
			}
			continue
		}
		b = reports.AppendCellText(b, v)
		if !cellMatches(byCol[i], v, b[start:]) {
			got := ""
			if byCol[i] != nil {
				got = string(byCol[i].text)
			}
			key := cmp.Or(pop.key, "event")
			return fmt.Sprintf("%s (%s %v), column %q: the sheet has %q, the leaves give %q", at(), key, vals[0], pop.header[i], got, b[start:])
		}
	}
	b = append(b, '\n')
	pop.sum.Write(b)
	*buf = b
	return ""
}

// nextRow returns the next data row, moving to the next part past a
// part's end; nil cells when the population has no more rows.
func (pop *population) nextRow() ([]cell, string) {
	for {
		if pop.rr == nil {
			if pop.part > 0 && pop.row < reports.DefaultRowLimit {
				return nil, "" // the last part ended short: no more rows
			}
			pop.part++
			rr, ok, err := pop.b.rows(partName(pop.name, pop.part))
			if err != nil {
				return nil, err.Error()
			}
			if !ok {
				if pop.part == 1 {
					return nil, fmt.Sprintf("no sheet %q", pop.name)
				}
				return nil, ""
			}
			pop.rr, pop.row = rr, 0
			pop.sum.Reset()
			hdr, err := rr.next()
			if err != nil {
				return nil, fmt.Sprintf("sheet %q has no header row", partName(pop.name, pop.part))
			}
			h := texts(hdr, len(pop.header))
			var line []byte
			for i, title := range pop.header {
				if h[i] != title {
					return nil, fmt.Sprintf("sheet %q column %d is %q, want %q", partName(pop.name, pop.part), i+1, h[i], title)
				}
				if i > 0 {
					line = append(line, '\t')
				}
				line = reports.AppendCellText(line, title)
			}
			pop.sum.Write(append(line, '\n'))
			pop.row = 1
		}
		cells, err := pop.rr.next()
		if err == io.EOF {
			pop.finishPart()
			continue
		}
		if err != nil {
			return nil, fmt.Sprintf("sheet %q row %d: %v", partName(pop.name, pop.part), pop.row+1, err)
		}
		pop.row++
		return cells, ""
	}
}

func (pop *population) finishPart() {
	pop.stats = append(pop.stats, sheetHash{name: partName(pop.name, pop.part), rows: int64(pop.row - 1), sum: pop.sum.hex()})
	pop.rr.Close()
	pop.rr = nil
}

// end checks that the sheets hold no row past the ones the leaves give.
// An empty population (no row asked for, part 0) still has its sheet, with
// its header alone: nextRow opens it and finds no row.
func (pop *population) end() string {
	cells, msg := pop.nextRow()
	if msg != "" {
		return msg
	}
	if cells != nil {
		return fmt.Sprintf("sheet %q row %d has no event among the leaves: an extra row", partName(pop.name, pop.part), pop.row)
	}
	return ""
}

func (pop *population) close() {
	if pop.rr != nil {
		pop.rr.Close()
	}
}

func partName(base string, n int) string { return reports.ContinuationName(base, n) }

// cellMatches reports whether the stored cell c holds v, whose text (as
// AppendCellText renders it) is text.
func cellMatches(c *cell, v any, text []byte) bool {
	var got []byte
	if c != nil {
		got = c.text
	}
	switch v := v.(type) {
	case nil:
		return len(got) == 0
	case string:
		return string(got) == v && (c == nil || c.typ != "" && c.typ != "b" && c.typ != "n" || v == "")
	case bool:
		return c != nil && c.typ == "b" && (string(got) == "1") == v
	case time.Time:
		if v.IsZero() {
			return len(got) == 0
		}
		f, err := strconv.ParseFloat(string(got), 64)
		if err != nil || c.typ != "" && c.typ != "n" {
			return false
		}
		return math.Abs(excelDays(v)-f)*86400e6 < timeTolerance
	case float64:
		f, err := strconv.ParseFloat(string(got), 64)
		return err == nil && (f == v || math.Abs(f-v) <= 1e-12*math.Abs(v))
	case int, int64, uint32, uint64:
		return c != nil && (c.typ == "" || c.typ == "n") && bytes.Equal(got, text)
	}
	return false
}

// timeTolerance is how far, in microseconds, a date cell may lie from the
// event's time: a date is a float of days, good to about a microsecond.
const timeTolerance = 20

// excelDays is t as a spreadsheet date: days since 1899-12-30.
func excelDays(t time.Time) float64 {
	const epoch = -2209161600 // 1899-12-30T00:00:00Z
	return float64(t.UTC().UnixNano()-epoch*1e9) / 86400e9
}

// hashWriter is a SHA-256 that says its sum in hex.
type hashWriter struct{ h hash.Hash }

func (w *hashWriter) Write(b []byte) {
	if w.h == nil {
		w.h = sha256.New()
	}
	w.h.Write(b)
}

func (w *hashWriter) Reset() { w.h = nil }

func (w *hashWriter) hex() string {
	if w.h == nil {
		w.h = sha256.New()
	}
	return hex.EncodeToString(w.h.Sum(nil))
}
