package pack

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
)

// The sheets written from the runs' reconciliations rather than straight
// from events (Award context, Runs, Control evidence, Reconciliation,
// Served from cache) are checked against reconciliations the verifier
// computes from the leaves itself, cell by cell, as the event sheets are.
// The rows are built here as reports' bookWriter builds them; a change to
// one that is not made to the other fails the verification of every good
// pack (TestEvidencePackFromRealRun).

// derivedSheets are those sheets, in workbook order.
var derivedSheets = []string{reports.SheetAward, reports.SheetRuns, reports.SheetControl, reports.SheetReconciliation, reports.SheetCached}

// sheetSays stands, in a row the leaves give, for a cell whose value the
// leaves cannot give: the sheet's own text is taken (and hashed).
type sheetSays struct{}

// reconcile recomputes each run's reconciliation from the leaves, with
// the ledger's chain hash re-hashed (R8) as the pack's builder does.
// Staged payloads are not in a pack: R6 counts them, and its note (what
// the payload store said at export) is the sheet's word.
func (p *Pack) reconcile() ([]*reports.Report, error) {
	rec := reports.NewReconciler(packRuns{p})
	var buf []byte
	rec.Hash = func(prev [32]byte, e *auditd.Event) (h [32]byte) {
		h, buf = ledger.HashEvent(buf, prev, e)
		return h
	}
	reps := make([]*reports.Report, 0, len(p.Manifest.Runs))
	for _, run := range p.Manifest.Runs {
		rep, err := rec.Reconcile(context.Background(), run.ID, nil)
		if err != nil {
			return nil, fmt.Errorf("reconcile run %s from the leaves: %w", run.ID, err)
		}
		reps = append(reps, rep)
	}
	return reps, nil
}

// packRuns is the pack's leaves as the Reconciler reads a ledger.
type packRuns struct{ p *Pack }

// Scan reads the leaves from..to. A range of the pack starts with no
// event before it; the one a reconciliation's chain check anchors on is
// given as the range's first leaf links to it (its PrevHash, which the
// manifest states), so the check reads the link as the export did.
func (pr packRuns) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	first := true
	return packEvents{p: pr.p}.Scan(from, to, func(e *auditd.Event) error {
		if first {
			first = false
			if e.Seq > from && e.Seq > 1 {
				if err := fn(&auditd.Event{Seq: e.Seq - 1, Hash: e.PrevHash}); err != nil {
					return err
				}
			}
		}
		return fn(e)
	})
}

// ScanRun answers what a Reconciler asks of a run's events (where its
// range starts and ends) from the manifest's range of the run, which
// verifyLeaves holds to the leaves: an event of the run for each seq of
// the range, then the run's access events after it, which the manifest
// lists and readSingles read.
func (pr packRuns) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	for _, run := range pr.p.Manifest.Runs {
		if run.ID == runID && after < run.Last {
			for seq := max(after+1, run.First); seq <= run.Last; seq++ {
				if err := fn(&auditd.Event{Seq: seq, RunID: runID}); err != nil {
					return err
				}
			}
			after = run.Last
		}
	}
	for i := range pr.p.access {
		if e := &pr.p.access[i]; e.RunID == runID && e.Seq > after {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// derivedRows calls fn with each row of the derived sheets, as the export
// writes them from reps.
func derivedRows(reps []*reports.Report, fn func(sheet string, vals ...any)) {
	for _, r := range reps {
		a := r.Run.Award
		var year any
		if a.AwardYear != 0 {
			year = a.AwardYear
		}
		fn(reports.SheetAward, r.Run.ID, a.FAIN, a.ListingNumber, a.ListingTitle, year, a.Agency, a.PassThroughEntity,
			a.PassThroughAwardID, a.RecipientUEI, r.Run.InitiatedBy, r.Run.ConfigHash, r.Run.CodeVersion)
	}
	for _, r := range reps {
		c := r.Counts
		fn(reports.SheetRuns, r.Run.ID, r.Run.Name, r.Run.Status, r.Run.StartedAt, r.Run.FinishedAt, r.Run.FirstSeq, r.Run.LastSeq,
			c.Events, c.Queued, c.Succeeded, c.Cached, c.Failed, c.Shed, c.Pending, c.Dispatches, c.Retries, c.Throttles,
			r.Run.HeadAtStart, r.Run.HeadAtEnd, r.Balanced)
	}
	for _, r := range reps {
		for _, c := range r.Control {
			fn(reports.SheetControl, r.Run.ID, c.SourceID, c.Peak, c.Unit, c.Requests, c.Limit, c.Burst, c.Window.Seconds(), c.PeakAt, c.PeakSeq, c.Within)
		}
	}
	for _, r := range reps {
		checks := r.Checks
		for _, s := range r.Sources {
			checks = append(checks[:len(checks):len(checks)], s.Checks...)
		}
		for _, c := range checks {
			var note any = c.Note
			if c.ID == reports.R6 {
				note = sheetSays{}
			}
			fn(reports.SheetReconciliation, r.Run.ID, c.Scope, c.ID, string(c.Status), c.Expected, c.Actual, c.Difference,
				joinSeqs(c.Offending), note, c.Description)
		}
	}
	for _, r := range reps {
		for _, c := range r.Cached {
			var fetched, age any
			if c.AgeKnown() {
				fetched, age = c.FetchedAt, c.Age.D().Seconds()
			}
			fn(reports.SheetCached, c.Seq, r.Run.ID, c.SourceID, c.ItemKey, c.ServedAt, c.Reason, c.OriginRun, fetched, age, c.PayloadHash)
		}
	}
}

func joinSeqs(s []uint64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatUint(v, 10)
	}
	return strings.Join(parts, " ")
}

// checkDerived checks the derived sheets against reps, cell by cell, and
// the rows and SHA-256 the Manifest states for each.
func (p *Pack) checkDerived(b *book, reps []*reports.Report, stated map[string]sheetHash, r *Report) {
	pops := map[string]*population{}
	for _, name := range derivedSheets {
		pops[name] = &population{b: b, name: name, header: reports.SheetColumns(name), key: "run"}
	}
	pops[reports.SheetCached].key = "event"
	bad := map[string]bool{}
	var cellText []byte
	derivedRows(reps, func(sheet string, vals ...any) {
		if bad[sheet] {
			return
		}
		if msg := pops[sheet].check(vals, &cellText); msg != "" {
			r.fail("%s: %s", FileWorkbook, msg)
			bad[sheet] = true
		}
	})
	for _, name := range derivedSheets {
		p.settle(pops[name], bad[name], stated, r)
	}
}

// settle ends a population's check: no row past those expected, and each
// of its sheets' rows and SHA-256 as the Manifest states them.
func (p *Pack) settle(pop *population, bad bool, stated map[string]sheetHash, r *Report) {
	if bad {
		pop.close()
		return
	}
	if msg := pop.end(); msg != "" {
		r.fail("%s: %s", FileWorkbook, msg)
		return
	}
	for _, st := range pop.stats {
		want, ok := stated[st.name]
		switch {
		case !ok:
			r.fail("%s: the Manifest does not list sheet %q", FileWorkbook, st.name)
		case want.rows != st.rows:
			r.fail("%s: sheet %q row %d (sheet %q), column %q: the sheet has %d, the leaves give %d rows", FileWorkbook,
				reports.SheetManifest, want.row, st.name, manifestColumn(1), want.rows, st.rows)
		case want.sum != st.sum:
			r.fail("%s: sheet %q row %d (sheet %q), column %q: the sheet has %q, the leaves give %q", FileWorkbook,
				reports.SheetManifest, want.row, st.name, manifestColumn(2), want.sum, st.sum)
		}
		r.Rows[pop.name] += st.rows
		r.Sheets = append(r.Sheets, st.name)
	}
}

// manifestFields are the Manifest sheet's rows before its table of
// sheets, in order, its header row first.
var manifestFields = []string{"Field", "Label", "Export id", "Generated at (UTC)", "Filters", "Runs", "Reconciliation balanced",
	"Ledger head at end of export range", reports.ManifestFieldCheckpoint, reports.ManifestFieldPublicKey, "How to verify", "Timestamps"}

// howToVerify is the Manifest's "How to verify", as the export writes it.
const howToVerify = `Save the signed checkpoint above to a file; on a copy of the ledger's data directory run: auditd verify --data DIR --key '<public key above>' --trusted-checkpoint FILE. It checks the hash chain, the Merkle tree and the signed checkpoints, and names the first bad sequence number. Each sheet's SHA-256 below is over its rows as shown: cells as text joined by tabs (tab, newline and backslash escaped as \t, \n, \\), one line per row, header row first.`

func manifestColumn(i int) string { return reports.SheetColumns(reports.SheetManifest)[i] }

// checkManifestFields checks the Manifest sheet's fields that the pack
// determines (its export id, filters, runs, verdict and ledger head) and
// that it lists every sheet of the workbook and no other. The generated
// time and the prose (how to verify, timestamps) are the export's word.
func (p *Pack) checkManifestFields(b *book, fields map[string]manifestField, stated map[string]sheetHash, reps []*reports.Report, r *Report) {
	balanced := "1"
	var runs []string
	var last *reports.Report
	for _, rep := range reps {
		if !rep.Balanced {
			balanced = "0"
		}
		runs = append(runs, rep.Run.ID)
		if last == nil || rep.Run.LastSeq > last.Run.LastSeq {
			last = rep
		}
	}
	want := [][2]string{
		{"Label", reports.Label},
		{"Export id", p.Manifest.ExportID},
		{"Filters", p.Manifest.Filters},
		{"Runs", strings.Join(runs, " ")},
		{"Reconciliation balanced", balanced},
	}
	if last != nil {
		want = append(want, [2]string{"Ledger head at end of export range", fmt.Sprintf("seq %d, hash %s", last.Run.LastSeq, last.Run.HeadAtEnd)})
	}
	want = append(want, [2]string{"How to verify", howToVerify}, [2]string{"Timestamps", "UTC, RFC 3339 with milliseconds; durations in seconds"})
	for i, name := range manifestFields {
		if f, ok := fields[name]; ok && f.row != i+1 {
			r.fail("%s: sheet %q row %d holds field %q, which the export writes at row %d", FileWorkbook, reports.SheetManifest, f.row, name, i+1)
		}
	}
	for name, f := range fields {
		if !slices.Contains(manifestFields, name) {
			r.fail("%s: sheet %q row %d: %q is no field of the Manifest", FileWorkbook, reports.SheetManifest, f.row, name)
		}
	}
	if f := fields["Generated at (UTC)"]; f.value != "" {
		if _, err := strconv.ParseFloat(f.value, 64); err != nil {
			r.fail("%s: sheet %q row %d (Generated at (UTC)), column %q: %q is not a date", FileWorkbook, reports.SheetManifest, f.row, manifestColumn(1), f.value)
		}
	}
	for _, w := range want {
		f, ok := fields[w[0]]
		switch {
		case !ok:
			r.fail("%s: sheet %q has no field %q", FileWorkbook, reports.SheetManifest, w[0])
		case f.value != w[1]:
			r.fail("%s: sheet %q row %d (%s), column %q: the sheet has %q, the pack gives %q", FileWorkbook,
				reports.SheetManifest, f.row, w[0], manifestColumn(1), f.value, w[1])
		}
	}
	for name, st := range stated {
		if _, ok := b.sheets[name]; !ok {
			r.fail("%s: sheet %q row %d lists sheet %q, which the workbook does not have", FileWorkbook, reports.SheetManifest, st.row, name)
		}
	}
	for name := range b.sheets {
		if _, ok := stated[name]; !ok && name != reports.SheetManifest {
			r.fail("%s: sheet %q is not in the Manifest", FileWorkbook, name)
		}
	}
	if len(r.Problems) == 0 {
		checked := map[string]bool{reports.SheetManifest: true}
		for _, name := range r.Sheets {
			checked[name] = true
		}
		for name := range b.sheets {
			if !checked[name] {
				r.fail("%s: sheet %q is no sheet an evidence pack has", FileWorkbook, name)
			}
		}
	}
	r.Sheets = append([]string{reports.SheetManifest}, r.Sheets...)
}
