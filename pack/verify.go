package pack

import (
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/witness"
	"golang.org/x/mod/sumdb/tlog"
)

// Options configure Verify.
type Options struct {
	// Key is the ledger's verifier key from a source the verifier trusts.
	// Empty trusts the pack's own public-key.txt, and the report says so:
	// a pack re-signed whole under another key is then not caught.
	Key string
	// Witnesses are C2SP cosignature verifier keys; each must have
	// cosigned the pack's checkpoint.
	Witnesses []string
	// Previous is an earlier pack of the same ledger: the two checkpoints
	// must be consistent (the same tree, or this one an extension of it).
	Previous *Pack
}

// Report is the outcome of Verify.
type Report struct {
	OK         bool
	Origin     string
	TreeSize   uint64
	Leaves     uint64
	KeyTrusted bool             // the key was given, not taken from the pack
	Rows       map[string]int64 // data rows checked, per population
	Sheets     []string         // the workbook's sheets checked
	Witnessed  []string         // witnesses whose cosignature verified
	Consistent string           // what was proven of the previous checkpoint, if any
	Problems   []string         // what does not hold, each naming where
}

func (r *Report) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify checks everything p says, offline. Failures are Problems in the
// Report, not errors; an error means the check could not be done (an
// unreadable entry).
func Verify(p *Pack, opts Options) (*Report, error) {
	m := &p.Manifest
	r := &Report{Origin: m.Origin, TreeSize: m.TreeSize, Leaves: m.Leaves, Rows: map[string]int64{}}
	key := p.PublicKey
	if opts.Key != "" {
		r.KeyTrusted = true
		if opts.Key != p.PublicKey {
			r.fail("%s is not the trusted key: the pack names %q", FilePublicKey, p.PublicKey)
		}
		key = opts.Key
	}
	tree, err := ledger.OpenCheckpoint(p.Checkpoint, key)
	if err != nil {
		r.fail("%s: %v", FileCheckpoint, err)
	} else {
		if tree.Size != m.TreeSize || tree.Origin != m.Origin {
			r.fail("%s is of %s at size %d, %s says %s at %d", FileCheckpoint, tree.Origin, tree.Size, FileManifest, m.Origin, m.TreeSize)
		}
		if root := base64.StdEncoding.EncodeToString(tree.Root[:]); root != p.Proof.Root {
			r.fail("%s: root %s is not the checkpoint's %s", FileProof, p.Proof.Root, root)
		}
	}
	for _, wk := range opts.Witnesses {
		v, err := witness.NewVerifier(wk)
		if err != nil {
			return nil, err
		}
		if _, err := witness.Cosigned(p.Checkpoint, v); err != nil {
			r.fail("%s: %v", FileCheckpoint, err)
			continue
		}
		r.Witnessed = append(r.Witnessed, v.Name())
	}
	if err := p.readSingles(r); err != nil {
		return nil, err
	}
	// The runs' reconciliations, which the derived sheets are checked
	// against, are computed from the leaves beside the other two reads.
	type reconciled struct {
		reps []*reports.Report
		err  error
	}
	recs := make(chan reconciled, 1)
	go func() {
		reps, err := p.reconcile()
		recs <- reconciled{reps, err}
	}()
	derived := sync.OnceValues(func() ([]*reports.Report, error) {
		rc := <-recs
		return rc.reps, rc.err
	})
	// The leaves and the workbook are checked side by side: each reads
	// the leaves once.
	var (
		wg            sync.WaitGroup
		leaves, book  Report
		lerr, bookErr error
	)
	book.Rows = r.Rows
	feed := newLeafFeed(p.Manifest.Ranges[0].First)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer feed.end()
		lerr = p.verifyLeaves(tree, feed, &leaves)
	}()
	bookErr = p.verifyWorkbook(feed, derived, &book)
	wg.Wait()
	if err := errors.Join(lerr, bookErr); err != nil {
		return nil, err
	}
	r.Problems = append(append(r.Problems, leaves.Problems...), book.Problems...)
	r.Sheets = book.Sheets
	p.verifyConsistency(key, tree, opts.Previous, r)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// leafScanner reads events.bin leaf by leaf, with each event's chain hash.
type leafScanner struct {
	p      *Pack
	rc     io.ReadCloser
	br     *bufio.Reader
	ranges []Range
	ri     int
	seq    uint64 // the next leaf's seq
	chain  [32]byte
	buf    []byte
	hbuf   []byte
	e      auditd.Event
	leaf   tlog.Hash
	noLeaf bool // the reader needs events and chain hashes, not leaf hashes
}

func (p *Pack) scanLeaves() (*leafScanner, error) {
	rc, err := p.open(FileLeaves)
	if err != nil {
		return nil, err
	}
	s := &leafScanner{p: p, rc: rc, br: bufio.NewReaderSize(rc, 1<<16), ranges: p.Manifest.Ranges}
	s.start()
	return s, nil
}

func (s *leafScanner) start() {
	if s.ri < len(s.ranges) {
		s.seq = s.ranges[s.ri].First
		hex.Decode(s.chain[:], []byte(s.ranges[s.ri].PrevHash))
	}
}

func (s *leafScanner) Close() error { return s.rc.Close() }

// next reads the next leaf: its event (with the chain hashes), its bytes
// and leaf hash. io.EOF after the last range's last leaf; an error naming
// the leaf otherwise.
func (s *leafScanner) next() error {
	if s.ri == len(s.ranges) {
		if _, err := s.br.ReadByte(); err != io.EOF {
			return fmt.Errorf("%s holds more leaves than %s's ranges", FileLeaves, FileManifest)
		}
		return io.EOF
	}
	b, err := readFrame(s.br, s.buf, ledger.MaxEventSize)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s ends before event %d (leaf %d): leaves missing", FileLeaves, s.seq, s.seq-1)
	}
	if err != nil {
		return fmt.Errorf("%s: event %d (leaf %d): %v", FileLeaves, s.seq, s.seq-1, err)
	}
	s.buf = b
	if err := ledger.UnmarshalCanonical(b, &s.e); err != nil {
		return fmt.Errorf("%s: leaf %d does not decode: %v", FileLeaves, s.seq-1, err)
	}
	if s.e.Seq != s.seq {
		return fmt.Errorf("%s: leaf %d is event %d, want event %d", FileLeaves, s.seq-1, s.e.Seq, s.seq)
	}
	s.hbuf = append(append(s.hbuf[:0], s.chain[:]...), b...)
	s.e.PrevHash, s.e.Hash = s.chain, sha256.Sum256(s.hbuf)
	s.chain = s.e.Hash
	if !s.noLeaf {
		s.hbuf = append(append(s.hbuf[:0], 0), b...)
		s.leaf = sha256.Sum256(s.hbuf)
	}
	if s.seq++; s.seq > s.ranges[s.ri].Last {
		s.ri++
		s.start()
	}
	return nil
}

// readSingles reads the retention events and the access events after the
// runs' ranges that the manifest lists from the leaves (decoding no
// other), for the workbook's Retention and Access log rows.
func (p *Pack) readSingles(r *Report) error {
	p.retention, p.access = nil, nil
	if len(p.Manifest.Retention) == 0 && len(p.Manifest.Access) == 0 {
		return nil
	}
	want := map[uint64]string{}
	for _, seq := range p.Manifest.Retention {
		want[seq] = "retention"
	}
	for _, seq := range p.Manifest.Access {
		want[seq] = "access"
	}
	rc, err := p.open(FileLeaves)
	if err != nil {
		return err
	}
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<16)
	var buf, hbuf []byte
	for _, rg := range p.Manifest.Ranges {
		// The chain hashes (the rows' Event hash) of a range that holds a
		// listed event are computed from its start.
		need := false
		for seq := range want {
			need = need || seq >= rg.First && seq <= rg.Last
		}
		var chain [32]byte
		hex.Decode(chain[:], []byte(rg.PrevHash))
		for seq := rg.First; seq <= rg.Last; seq++ {
			b, err := readFrame(br, buf, ledger.MaxEventSize)
			if err != nil {
				return nil // verifyLeaves names it
			}
			buf = b
			if !need {
				continue
			}
			prev := chain
			hbuf = append(append(hbuf[:0], chain[:]...), b...)
			chain = sha256.Sum256(hbuf)
			what, ok := want[seq]
			if !ok {
				continue
			}
			var e auditd.Event
			if err := ledger.UnmarshalCanonical(b, &e); err != nil {
				return nil
			}
			e.PrevHash, e.Hash = prev, chain
			switch {
			case what == "access" && e.Type.Access():
				p.access = append(p.access, e)
			case what == "retention" && e.Type.Retention():
				p.retention = append(p.retention, e)
			default:
				r.fail("%s: event %d is listed as a %s event but is a %s", FileManifest, seq, what, e.Type)
			}
		}
	}
	// The workbook lists access events in the manifest's order (run after
	// run), the leaves hold them in sequence order.
	at := make(map[uint64]int, len(p.Manifest.Access))
	for i, seq := range p.Manifest.Access {
		at[seq] = i
	}
	slices.SortStableFunc(p.access, func(a, b auditd.Event) int { return cmp.Compare(at[a.Seq], at[b.Seq]) })
	return nil
}

// verifyLeaves reads every leaf once: each decodes as the event its place
// says, its NDJSON line renders it, each range rebuilds the checkpoint's
// root with its proof, and each run's range starts and ends with one of
// its events.
func (p *Pack) verifyLeaves(tree ledger.SignedTree, feed *leafFeed, r *Report) error {
	s, err := p.scanLeaves()
	if err != nil {
		return err
	}
	defer s.Close()
	nd, err := p.open(FileNDJSON)
	if err != nil {
		return err
	}
	defer nd.Close()
	lines := bufio.NewReaderSize(nd, 1<<20) // a line is at most one event's JSON
	ends := map[uint64][]string{}           // seq -> runs that must own it
	for _, run := range p.Manifest.Runs {
		ends[run.First] = append(ends[run.First], run.ID)
		ends[run.Last] = append(ends[run.Last], run.ID)
	}
	var (
		cr       *compactRange
		line     []byte
		ndBad    bool
		leafBad  bool
		rangeIdx = -1
	)
	finish := func(i int) {
		if leafBad || tree.Size == 0 {
			return
		}
		rp := p.Proof.Ranges[i]
		right, err := unb64(rp.Right)
		if err == nil {
			err = cr.appendRight(tree.Size, right)
		}
		switch {
		case err != nil:
			r.fail("%s: range %d to %d: right side: %v", FileProof, rp.First, rp.Last, err)
		case cr.root() != tree.Root:
			r.fail("%s: events %d to %d do not rebuild the checkpoint's root: a leaf or the proof was altered", FileProof, rp.First, rp.Last)
		}
	}
	for {
		ri, seq := s.ri, s.seq
		err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			r.fail("%v", err)
			leafBad = true
			break
		}
		if feed != nil && !feed.publish(&s.e) {
			feed = nil // the workbook's check wants no more
		}
		if ri != rangeIdx {
			if rangeIdx >= 0 {
				finish(rangeIdx)
			}
			rangeIdx = ri
			rp := p.Proof.Ranges[ri]
			left, err := unb64(rp.Left)
			if err == nil {
				cr, err = newCompactRange(rp.First-1, left)
			}
			if err != nil {
				r.fail("%s: range %d to %d: left side: %v", FileProof, rp.First, rp.Last, err)
				leafBad = true
			}
		}
		if !leafBad {
			if err := cr.push(0, s.leaf); err != nil {
				return err
			}
		}
		for _, id := range ends[seq] {
			if s.e.RunID != id {
				r.fail("%s: run %s's range is said to start or end at event %d, which is not the run's", FileManifest, id, seq)
			}
		}
		if !ndBad {
			got, err := lines.ReadSlice('\n')
			if err == bufio.ErrBufferFull { // a line longer than the buffer
				rest, rerr := lines.ReadBytes('\n')
				got, err = append(bytes.Clone(got), rest...), rerr
			}
			want, _ := appendLeafLine(line[:0], &s.e, s.leaf)
			line = want
			if err != nil || !bytes.Equal(got, want) {
				r.fail("%s: line %d is not event %d as its leaf says", FileNDJSON, s.seq-p.Manifest.Ranges[0].First, seq)
				ndBad = true
			}
		}
	}
	if !leafBad && rangeIdx >= 0 {
		finish(rangeIdx)
	}
	if !ndBad && !leafBad {
		if _, err := lines.ReadByte(); err != io.EOF {
			r.fail("%s has lines after the last leaf", FileNDJSON)
		}
	}
	return nil
}

// packEvents serves the pack's leaves as an auditd.EventReader, for
// reports.EventRows.
type packEvents struct {
	p    *Pack
	feed *leafFeed // the leaves verifyLeaves reads, when there is one
}

func (pe packEvents) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	if pe.feed != nil {
		if ok, err := pe.feed.scan(from, to, fn); ok {
			return err
		}
	}
	s, err := pe.p.scanLeaves()
	if err != nil {
		return err
	}
	s.noLeaf = true
	defer s.Close()
	for {
		err := s.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if s.e.Seq < from {
			continue
		}
		if to != 0 && s.e.Seq > to {
			return nil
		}
		if err := fn(&s.e); err != nil {
			return err
		}
	}
}

func (pe packEvents) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	return packEvents{p: pe.p}.Scan(after+1, 0, func(e *auditd.Event) error {
		if e.RunID != runID {
			return nil
		}
		return fn(e)
	})
}

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
