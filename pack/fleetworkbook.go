package pack

import (
	"archive/zip"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/auditd/auditd/reports"
)

// FileFleetWorkbook is the fleet pack's evidence workbook: every node's
// rows behind a Node column (reports.WriteFleetEvidence), stored.
const FileFleetWorkbook = "evidence.xlsx"

// WriteFleetWorkbook writes the fleet pack's workbook of run runID to w:
// the workbooks of the node packs (by node name), read in place, merged
// behind a Node column by reports.WriteFleetEvidence, without the fleet's
// checks, which are not one node's rows and which no node pack proves.
// tmpDir holds the merge's temporary file ("" is os.TempDir).
func WriteFleetWorkbook(w io.Writer, runID string, nodes map[string]*Pack, tmpDir string) error {
	var books []reports.FleetWorkbook
	for _, node := range slices.Sorted(maps.Keys(nodes)) {
		f := nodes[node].files[FileWorkbook]
		if f == nil || f.Method != zip.Store {
			return fmt.Errorf("%w: node %s: its pack does not store %s", ErrBadPack, node, FileWorkbook)
		}
		off, err := f.DataOffset()
		if err != nil {
			return fmt.Errorf("%w: node %s: %s: %v", ErrBadPack, node, FileWorkbook, err)
		}
		size := int64(f.CompressedSize64)
		books = append(books, reports.FleetWorkbook{Node: node, Book: io.NewSectionReader(nodes[node].ra, off, size), Size: size})
	}
	return reports.WriteFleetEvidence(w, reports.FleetEvidence{RunID: runID, Parts: books, TmpDir: tmpDir})
}

// sheetRows are a workbook's populations, each the rows of its sheet and
// of its continuations after it, header rows dropped, as stored text.
type sheetRows struct {
	headers map[string][]string
	rows    map[string][][]string
	// counts are the rows of each sheet as stored, continuations apart,
	// header rows not counted.
	counts map[string]int64
	// sums are each sheet's SHA-256 over its rows as read, as the merge
	// hashes them (sheetHasher), continuations apart; disorder is the
	// first row of a sheet whose cells are out of column order, which
	// has no such hash. Both only when read with hashes.
	sums     map[string]string
	disorder map[string]int
	// manifest are the Manifest's rows (nil: none).
	manifest [][]string
}

// readSheetRows reads every sheet of zr but the Manifest, and with hash
// each sheet's SHA-256 as the fleet merge takes it.
func readSheetRows(zr *zip.Reader, hash bool) (*sheetRows, error) {
	b, err := openBook(zr)
	if err != nil {
		return nil, err
	}
	out := &sheetRows{headers: map[string][]string{}, rows: map[string][][]string{}, counts: map[string]int64{},
		sums: map[string]string{}, disorder: map[string]int{}}
	if out.manifest, err = readManifestRows(b); err != nil {
		return nil, err
	}
	var h *sheetHasher
	if hash {
		dates, err := b.dateStyles()
		if err != nil {
			return nil, err
		}
		h = &sheetHasher{dates: dates}
	}
	for name := range b.sheets {
		if name == reports.SheetManifest || strings.HasSuffix(name, ")") && strings.Contains(name, " (") {
			continue // continuations are read after their first sheet
		}
		for n := 1; ; n++ {
			part := reports.ContinuationName(name, n)
			rr, ok, err := b.rows(part)
			if err != nil {
				return nil, err
			} else if !ok {
				break
			}
			err = out.readPart(rr, name, part, h)
			rr.Close()
			if err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// readPart reads one sheet of population name, hashing it with h (nil:
// not hashed).
func (out *sheetRows) readPart(rr *rowReader, name, part string, h *sheetHasher) error {
	rr.style = h != nil
	if h != nil {
		h.sum.Reset()
	}
	out.counts[part] = 0
	for i := 0; ; i++ {
		cells, err := rr.next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return fmt.Errorf("sheet %s: %w", name, err)
		}
		row := texts(cells, 0)
		if h != nil && out.disorder[part] == 0 {
			ordered := h.row
			if i == 0 {
				ordered = h.header
			}
			if !ordered(cells, row) {
				out.disorder[part] = i + 1
			}
		}
		if i == 0 {
			out.headers[name] = row
		} else {
			out.rows[name] = append(out.rows[name], row)
			out.counts[part]++
		}
	}
	if h != nil {
		out.sums[part] = h.sum.hex()
	}
	return nil
}

// verifyFleetWorkbook checks the fleet workbook against the node packs'
// workbooks, which Verify holds to the leaves: each sheet has a node's
// sheets with a Node column first, and each node's rows of it are, in
// order, the rows of the node's own workbook, cell for cell as stored.
// The Manifest is held to the pack (checkFleetManifest). A row naming a
// node without a part (the fleet's own checks, node "fleet", are not in
// a pack's workbook), a cell that differs, a node's row
// missing or one too many are named by node, sheet and row.
func verifyFleetWorkbook(fp *FleetPack, keys map[string]string, r *FleetReport) {
	if fp.Workbook == nil {
		return
	}
	zr, err := zip.NewReader(fp.Workbook, fp.Workbook.Size())
	var fleet *sheetRows
	if err == nil {
		fleet, err = readSheetRows(zr, true)
	}
	if err != nil {
		r.fail("%s: %v", FileFleetWorkbook, err)
		return
	}
	own := map[string]*sheetRows{}
	for _, n := range fp.Manifest.Nodes {
		p := fp.Nodes[n.Name]
		if p == nil {
			continue
		}
		zr, err := p.workbook()
		var rows *sheetRows
		if err == nil {
			rows, err = readSheetRows(zr, false)
		}
		if err != nil {
			r.fail("node %s: %s: %v", n.Name, FileWorkbook, err)
			continue
		}
		own[n.Name] = rows
	}
	for _, node := range slices.Sorted(maps.Keys(own)) {
		for _, sheet := range slices.Sorted(maps.Keys(own[node].headers)) {
			if fleet.headers[sheet] == nil {
				r.fail("node %s: %s lacks sheet %s", node, FileFleetWorkbook, sheet)
			}
		}
	}
	for _, sheet := range slices.Sorted(maps.Keys(fleet.headers)) {
		checkFleetSheet(sheet, fleet, own, r)
	}
	checkFleetManifest(fp, fleet, keys, r)
}

// checkFleetSheet checks one sheet of the fleet workbook.
func checkFleetSheet(sheet string, fleet *sheetRows, own map[string]*sheetRows, r *FleetReport) {
	header := fleet.headers[sheet]
	if len(header) == 0 || header[0] != reports.FleetNodeColumn {
		r.fail("%s: sheet %s: its first column is not %s", FileFleetWorkbook, sheet, reports.FleetNodeColumn)
		return
	}
	next := map[string]int{}
	for node, o := range own {
		if o.headers[sheet] != nil && !slices.Equal(trimRow(header[1:]), trimRow(o.headers[sheet])) {
			r.fail("node %s: %s: sheet %s: its columns are not those of the node's own workbook", node, FileFleetWorkbook, sheet)
		}
	}
	r.WorkbookRows += int64(len(fleet.rows[sheet]))
	for i, row := range fleet.rows[sheet] {
		if len(row) == 0 {
			row = []string{""}
		}
		node := row[0]
		o := own[node]
		if o == nil {
			r.fail("%s: sheet %s row %d names node %q, which has no part in the pack", FileFleetWorkbook, sheet, i+2, node)
			continue
		}
		j := next[node]
		next[node]++
		if j >= len(o.rows[sheet]) {
			if j == len(o.rows[sheet]) {
				r.fail("node %s: %s: sheet %s row %d is one more row of the node than its own workbook has (%d)", node, FileFleetWorkbook, sheet, i+2, j)
			}
			continue
		}
		got, want := trimRow(row[1:]), trimRow(o.rows[sheet][j])
		if !slices.EqualFunc(got, want, sameCell) {
			r.fail("node %s: %s: sheet %s row %d is %q; the node's own workbook's row %d is %q", node, FileFleetWorkbook, sheet, i+2,
				strings.Join(got, "\t"), j+2, strings.Join(want, "\t"))
		}
	}
	for _, node := range slices.Sorted(maps.Keys(own)) {
		if n, have := len(own[node].rows[sheet]), next[node]; have < n {
			r.fail("node %s: %s: sheet %s holds %d of the node's %d rows", node, FileFleetWorkbook, sheet, have, n)
		}
	}
}

// sameCell reports whether two stored cell texts are the same value: the
// same text, or the same number (a spreadsheet writes 1.5 as "1.5" or
// "1.50000000000000").
func sameCell(a, b string) bool {
	if a == b {
		return true
	}
	x, errX := strconv.ParseFloat(a, 64)
	y, errY := strconv.ParseFloat(b, 64)
	return errX == nil && errY == nil && x == y
}

// trimRow drops a row's trailing empty cells.
func trimRow(row []string) []string {
	for len(row) > 0 && row[len(row)-1] == "" {
		row = row[:len(row)-1]
	}
	return row
}
