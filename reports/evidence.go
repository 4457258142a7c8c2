package reports

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd"
)

// Defaults of an Exporter.
const (
	// DefaultRowLimit is Excel's rows per sheet, header included.
	DefaultRowLimit = 1_048_576

	// DefaultProgressEvery is how many events pass between progress calls.
	DefaultProgressEvery = 1 << 14

	// DefaultMaxPendingRows bounds the dispatch rows held while they wait
	// for their outcome (rows are written in dispatch order). Past it the
	// oldest row is written as it stands, so memory stays flat even when a
	// dispatch never gets an outcome.
	DefaultMaxPendingRows = 1 << 16
)

// Label is the regulatory label every evidence export carries, and no more:
// a fetch ledger is supporting documentation, not a financial system.
const Label = "Supporting documentation: 2 CFR 200.302(a), (b)(4); 200.303"

// Sheet names, in workbook order.
const (
	SheetManifest       = "Manifest"
	SheetAward          = "Award context"
	SheetRuns           = "Runs"
	SheetDispatches     = "Dispatches"
	SheetWaits          = "Waits and throttles"
	SheetBreaker        = "Breaker transitions"
	SheetRegistry       = "Registry snapshots"
	SheetControl        = "Control evidence"
	SheetReconciliation = "Reconciliation"
	SheetCached         = "Served from cache"
	SheetAccess         = "Access log"
)

// ErrNoRuns means an export was asked for no run.
var ErrNoRuns = errors.New("export names no run")

// Checkpointer is what the Manifest needs from the ledger so a third party
// can verify the pack offline: the latest signed checkpoint and the public
// key that signed it. *ledger.Ledger provides it.
type Checkpointer interface {
	Checkpoint() ([]byte, error)
	PublicKey() string
}

// Request says what one evidence export covers.
type Request struct {
	// ExportID identifies the export (the access log records it).
	ExportID string
	// RunIDs are the runs exported, in this order: one run, or the runs of
	// an award over a period as the caller selected them.
	RunIDs []string
	// Filters says in words how RunIDs were chosen ("run X", "award FAIN
	// from .. to ..").
	Filters string
	// GeneratedAt is recorded in the Manifest and the document properties.
	// Zero records nothing: the export then depends on its inputs only.
	GeneratedAt time.Time
	// Live are live counters per run id, for R7; missing runs get n/a.
	Live map[string]*LiveCounters
}

// Manifest is what an export wrote, as its first sheet says.
type Manifest struct {
	ExportID    string      `json:"export_id"`
	GeneratedAt time.Time   `json:"generated_at,omitzero"`
	Filters     string      `json:"filters"`
	Sheets      []SheetStat `json:"sheets"`
	Checkpoint  string      `json:"checkpoint,omitempty"`
	PublicKey   string      `json:"public_key,omitempty"`
	// Reports are the reconciliations the workbook's totals come from.
	Reports []*Report `json:"reports"`
	// Retention are the retention events the Retention sheet shows.
	Retention []uint64 `json:"retention,omitempty"`
	// Access are the access events (views and exports) of the runs
	// recorded after their ranges, which the Access log shows after the
	// ranges' own.
	Access []uint64 `json:"access,omitempty"`
}

// Exporter writes evidence workbooks.
type Exporter struct {
	// Events is the ledger the rows come from.
	Events auditd.EventReader
	// Reconciler reconciles each run first; it must read the same ledger.
	Reconciler *Reconciler
	// Ledger supplies the checkpoint and public key; nil leaves them out
	// and the Manifest says so.
	Ledger Checkpointer
	// RowLimit is the rows per sheet, header included, before a population
	// continues on a numbered sheet. Defaults to DefaultRowLimit.
	RowLimit int
	// MaxPendingRows defaults to DefaultMaxPendingRows.
	MaxPendingRows int
	// TmpDir holds the temporary files of the export ("" is os.TempDir).
	TmpDir string
	// Progress, when set, is called with events done and events in total.
	Progress func(done, total int64)
	// Retention, when set, adds the Retention sheet: the retention events
	// of the runs' awards, the holds and purges also in the Access log.
	Retention RetentionSource
	// SecretQuery, when set, names each source's declared secret query
	// parameters (auditd.Source.SecretQuery): their values, as those of
	// package redact's built-in names, are replaced by redact.Replacement
	// in the exported paths and error texts. The ledger holds them
	// redacted already, so this second guard changes nothing the loop
	// recorded.
	SecretQuery func(sourceID string) []string
}

// NewExporter returns an Exporter reading the ledger r reconciles.
func NewExporter(r *Reconciler) *Exporter {
	return &Exporter{
		Events:         r.Events,
		Reconciler:     r,
		RowLimit:       DefaultRowLimit,
		MaxPendingRows: DefaultMaxPendingRows,
	}
}

// The populations and their columns. Durations are seconds, as numbers.
var (
	specAward = sheetSpec{SheetAward, []column{{"Run", 30}, {"FAIN", 18}, {"Assistance Listing", 12}, {"Listing title", 36},
		{"Award year", 10}, {"Federal agency", 30}, {"Pass-through entity", 30}, {"Pass-through award id", 20},
		{"Recipient UEI", 15}, {"Initiated by", 28}, {"Config hash", 20}, {"Code version", 14}}}
	specRuns = sheetSpec{SheetRuns, []column{{"Run", 30}, {"Name", 24}, {"Status", 12}, {"Started at", 26}, {"Finished at", 26},
		{"First seq", 10}, {"Last seq", 10}, {"Events", 10}, {"Items queued", 10}, {"Succeeded", 10}, {"Cached", 10},
		{"Failed", 10}, {"Shed", 10}, {"Pending", 10}, {"Dispatches", 10}, {"Retries", 10}, {"Throttles", 10},
		{"Head at start", 66}, {"Head at end", 66}, {"Balanced", 10}}}
	specDispatches = sheetSpec{SheetDispatches, []column{{"Seq", 10}, {"Run", 30}, {"Item", 24}, {"Page", 6}, {"Attempt", 8},
		{"Cost (records)", 9}, {"Source", 16}, {"Method", 8}, {"Path (credentials stripped)", 60}, {"Dispatched at", 26}, {"Completed at", 26},
		{"Result event", 18}, {"Status", 8}, {"Body error code", 10}, {"Outcome", 14}, {"Error", 40}, {"Bytes", 12},
		{"Latency (s)", 10}, {"Payload SHA-256", 66}, {"Event hash", 66}}}
	specWaits = sheetSpec{SheetWaits, []column{{"Seq", 10}, {"Run", 30}, {"Source", 16}, {"Item", 24}, {"Page", 6},
		{"Attempt", 8}, {"Time", 26}, {"Event", 10}, {"Cause", 14}, {"Status", 8}, {"Retry-After (raw)", 18},
		{"Retry-After (s)", 12}, {"Clamped", 9}, {"Backoff (s)", 10}, {"Planned wait (s)", 12}, {"Actual wait (s)", 12},
		{"Event hash", 66}}}
	specBreaker = sheetSpec{SheetBreaker, []column{{"Seq", 10}, {"Run", 30}, {"Source", 16}, {"Time", 26}, {"From", 10},
		{"To", 10}, {"Failures", 9}, {"Threshold", 10}, {"Cooldown (s)", 12}, {"Event hash", 66}}}
	specRegistry = sheetSpec{SheetRegistry, []column{{"Seq", 10}, {"Run", 30}, {"Source", 16}, {"Time", 26}, {"Event", 18},
		{"Cause (what taught it)", 20}, {"Group", 14}, {"Old limit", 10}, {"New limit", 10}, {"Old window (s)", 12},
		{"New window (s)", 12}, {"Event hash", 66}}}
	specControl = sheetSpec{SheetControl, []column{{"Run", 30}, {"Source", 16}, {"Most in one window", 14},
		{"Counted in", 10}, {"Requests in that window", 12}, {"Limit in force", 10}, {"Burst", 8}, {"Window (s)", 10}, {"Busiest window ends at", 26}, {"At seq", 10},
		{"Within limit", 10}}}
	specReconciliation = sheetSpec{SheetReconciliation, []column{{"Run", 30}, {"Scope", 12}, {"Check", 7}, {"Status", 7},
		{"Expected", 10}, {"Actual", 10}, {"Difference", 10}, {"First offending seqs", 24}, {"Note", 40}, {"Identity", 80}}}
	specCached = sheetSpec{SheetCached, []column{{"Seq", 10}, {"Run", 30}, {"Source", 16}, {"Item", 24},
		{"Served at", 26}, {"Reason", 40}, {"Copy fetched by run", 30}, {"Copy fetched at", 26}, {"Age when served (s)", 14},
		{"Payload SHA-256", 66}}}
	specAccess = sheetSpec{SheetAccess, []column{{"Seq", 10}, {"Run", 30}, {"Time", 26}, {"Who", 28}, {"What", 40},
		{"Ledger head seq then", 12}, {"Event hash", 66}}}
	specManifest = sheetSpec{SheetManifest, []column{{"Field", 28}, {"Value", 90}, {"SHA-256 of rows", 66}}}
)

// Export reconciles the runs of req and writes their evidence workbook to
// w. Nothing is written to w unless every sheet was produced; a caller
// writing a file should still write to a temporary file and rename it.
//
// The reconciliation reads the ledger in a goroutine of its own while the
// event sheets are written from a second read of the same ranges; the
// sheets that need its results (Runs, Control evidence, Reconciliation and
// the Manifest) are written once both are done.
func (x *Exporter) Export(ctx context.Context, w io.Writer, req Request) (*Manifest, error) {
	if len(req.RunIDs) == 0 {
		return nil, ErrNoRuns
	}
	limit := x.RowLimit
	if limit <= 0 {
		limit = DefaultRowLimit
	}
	if limit < 2 {
		return nil, fmt.Errorf("row limit %d leaves no room for rows", limit)
	}
	// Both reads cover exactly these ranges, found once.
	ranges := make([][2]uint64, len(req.RunIDs))
	var total int64
	for i, id := range req.RunIDs {
		first, last, err := runRange(x.Events, id)
		if err != nil {
			return nil, fmt.Errorf("find run %s: %w", id, err)
		} else if first == 0 {
			return nil, fmt.Errorf("run %s: %w", id, ErrRunNotFound)
		}
		ranges[i] = [2]uint64{first, last}
		total += int64(last - first + 1)
	}
	m := &Manifest{ExportID: req.ExportID, GeneratedAt: req.GeneratedAt, Filters: req.Filters}
	// Read before the checkpoint, which then covers them.
	ret, err := retentionEvents(x.Retention, x.Events, ranges)
	if err != nil {
		return nil, fmt.Errorf("retention events: %w", err)
	}
	for _, e := range ret {
		m.Retention = append(m.Retention, e.Seq)
	}
	after, err := accessAfter(x.Events, req.RunIDs, ranges)
	if err != nil {
		return nil, err
	}
	for _, e := range after {
		m.Access = append(m.Access, e.Seq)
	}
	if x.Ledger != nil {
		cp, err := x.Ledger.Checkpoint()
		if err != nil {
			return nil, fmt.Errorf("checkpoint: %w", err)
		}
		m.Checkpoint, m.PublicKey = string(cp), x.Ledger.PublicKey()
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reconciled := make(chan error, 1)
	reps := make([]*Report, len(req.RunIDs))
	go func() {
		for i, id := range req.RunIDs {
			rep, err := x.Reconciler.reconcileRange(ctx, id, ranges[i][0], ranges[i][1], req.Live[id])
			if err != nil {
				cancel()
				reconciled <- fmt.Errorf("reconcile run %s: %w", id, err)
				return
			}
			reps[i] = rep
		}
		reconciled <- nil
	}()

	f := excelize.NewFile()
	defer f.Close()
	b := &bookWriter{x: x, f: f, limit: limit, m: m, total: total, stats: make(map[string][]SheetStat), order: sheetOrder, retention: ret, access: after}
	if x.Retention != nil {
		b.order = append(slices.Clone(sheetOrder), SheetRetention)
	}
	err = b.setUp()
	if err == nil {
		err = b.events(ctx, req.RunIDs, ranges)
	}
	if err != nil {
		cancel()
	}
	if rerr := <-reconciled; rerr != nil && (err == nil || errors.Is(err, context.Canceled)) {
		err = rerr
	}
	if err != nil {
		return nil, err
	}
	m.Reports = reps
	if err := b.finish(); err != nil {
		return nil, err
	}

	if err := writeWorkbook(f, w, x.TmpDir); err != nil {
		return nil, err
	}
	return m, nil
}

// writeWorkbook writes f to w through the deterministic ZIP writer.
func writeWorkbook(f *excelize.File, w io.Writer, tmpDir string) error {
	z, err := newSortedZip(w, tmpDir)
	if err != nil {
		return err
	}
	defer z.discard()
	f.SetZipWriter(func(io.Writer) excelize.ZipWriter { return z })
	if _, err := f.WriteTo(io.Discard); err != nil {
		return fmt.Errorf("write workbook: %w", err)
	}
	return nil
}

// docProps fixes a workbook's document properties: nothing in them comes
// from the clock unless at is given.
func docProps(f *excelize.File, title, id string, at time.Time) error {
	stamp := "1980-01-01T00:00:00Z"
	if !at.IsZero() {
		stamp = at.UTC().Format(time.RFC3339)
	}
	return f.SetDocProps(&excelize.DocProperties{
		Created: stamp, Modified: stamp, Creator: "auditd", LastModifiedBy: "auditd",
		Title: title, Subject: Label, Description: Label, Identifier: id,
	})
}

// sheetOrder is the workbook's order of populations.
var sheetOrder = []string{SheetManifest, SheetAward, SheetRuns, SheetDispatches, SheetWaits, SheetBreaker,
	SheetRegistry, SheetControl, SheetReconciliation, SheetCached, SheetAccess}

// bookWriter is one export in progress.
type bookWriter struct {
	x      *Exporter
	f      *excelize.File
	st     styles
	limit  int
	m      *Manifest
	total  int64
	done   int64
	stats  map[string][]SheetStat
	redact *redactor
	// order is sheetOrder, and the Retention sheet when there is one.
	order     []string
	retention []auditd.Event
	access    []auditd.Event // the runs' access events after their ranges
}

// setUp fixes the document properties and creates the first sheet of every
// population in order; continuation sheets are created as rows reach them
// and moved into place by finish.
func (b *bookWriter) setUp() error {
	if err := docProps(b.f, "Evidence: "+b.m.Filters, b.m.ExportID, b.m.GeneratedAt); err != nil {
		return err
	}
	if err := b.f.SetSheetName("Sheet1", SheetManifest); err != nil {
		return err
	}
	for _, name := range b.order[1:] {
		if _, err := b.f.NewSheet(name); err != nil {
			return err
		}
	}
	var err error
	b.st, err = newStyles(b.f)
	b.redact = newRedactor()
	b.redact.declared = b.x.SecretQuery
	return err
}

// finish writes the sheets that need the reconciliation, puts continuation
// sheets after their first, and writes the Manifest last, when every other
// sheet's rows and hash are known.
func (b *bookWriter) finish() error {
	for _, fn := range []func() error{b.award, b.runs, b.control, b.reconciliation, b.cached} {
		if err := fn(); err != nil {
			return err
		}
	}
	order := []string{SheetManifest}
	for _, name := range b.order[1:] {
		for _, s := range b.stats[name] {
			order = append(order, s.Name)
		}
	}
	for i, name := range order {
		if at := b.f.GetSheetName(i); at != name {
			if err := b.f.MoveSheet(name, at); err != nil {
				return err
			}
		}
	}
	// The Manifest, excelize's first sheet renamed, is already the one
	// selected and active. SetActiveSheet would read every sheet back
	// through encoding/xml, a streamed one's rows and all, to clear flags
	// that were never set.
	return b.manifest()
}

func (b *bookWriter) sheet(spec sheetSpec) (*sheetWriter, error) {
	return newSheetWriter(b.f, b.st, spec, b.limit)
}

func (b *bookWriter) closeSheet(w *sheetWriter) error {
	stats, err := w.close()
	b.stats[w.spec.name] = stats
	return err
}

func (b *bookWriter) award() error {
	w, err := b.sheet(specAward)
	if err != nil {
		return err
	}
	for _, r := range b.m.Reports {
		a := r.Run.Award
		var year any
		if a.AwardYear != 0 {
			year = a.AwardYear
		}
		if err := w.row(r.Run.ID, a.FAIN, a.ListingNumber, a.ListingTitle, year, a.Agency, a.PassThroughEntity,
			a.PassThroughAwardID, a.RecipientUEI, r.Run.InitiatedBy, r.Run.ConfigHash, r.Run.CodeVersion); err != nil {
			return err
		}
	}
	return b.closeSheet(w)
}

func (b *bookWriter) runs() error {
	w, err := b.sheet(specRuns)
	if err != nil {
		return err
	}
	for _, r := range b.m.Reports {
		c := r.Counts
		if err := w.row(r.Run.ID, r.Run.Name, r.Run.Status, r.Run.StartedAt, r.Run.FinishedAt, r.Run.FirstSeq, r.Run.LastSeq,
			c.Events, c.Queued, c.Succeeded, c.Cached, c.Failed, c.Shed, c.Pending, c.Dispatches, c.Retries, c.Throttles,
			r.Run.HeadAtStart, r.Run.HeadAtEnd, r.Balanced); err != nil {
			return err
		}
	}
	return b.closeSheet(w)
}

func (b *bookWriter) control() error {
	w, err := b.sheet(specControl)
	if err != nil {
		return err
	}
	for _, r := range b.m.Reports {
		for _, c := range r.Control {
			if err := w.row(r.Run.ID, c.SourceID, c.Peak, c.Unit, c.Requests, c.Limit, c.Burst, seconds(c.Window), c.PeakAt, c.PeakSeq, c.Within); err != nil {
				return err
			}
		}
	}
	return b.closeSheet(w)
}

func (b *bookWriter) reconciliation() error {
	w, err := b.sheet(specReconciliation)
	if err != nil {
		return err
	}
	for _, r := range b.m.Reports {
		for _, c := range allChecks(r) {
			if err := w.row(r.Run.ID, c.Scope, c.ID, string(c.Status), c.Expected, c.Actual, c.Difference,
				joinSeqs(c.Offending), c.Note, c.Description); err != nil {
				return err
			}
		}
	}
	return b.closeSheet(w)
}

// cached writes the items served from a last good copy: which run
// fetched each copy, when, and how old it was.
func (b *bookWriter) cached() error {
	w, err := b.sheet(specCached)
	if err != nil {
		return err
	}
	for _, r := range b.m.Reports {
		for _, row := range cachedRows(r) {
			if err := w.row(row...); err != nil {
				return err
			}
		}
	}
	return b.closeSheet(w)
}

// cachedRows are the rows of rep's items served from cache, as the
// Served from cache sheets show them; an age not recorded is left empty.
func cachedRows(rep *Report) [][]any {
	rows := make([][]any, 0, len(rep.Cached))
	for _, c := range rep.Cached {
		var fetched, age any
		if c.AgeKnown() {
			fetched, age = c.FetchedAt, seconds(c.Age.D())
		}
		rows = append(rows, []any{c.Seq, rep.Run.ID, c.SourceID, c.ItemKey, c.ServedAt, c.Reason, c.OriginRun, fetched, age, c.PayloadHash})
	}
	return rows
}

// manifest writes the first sheet last, when every other sheet's rows and
// hash are known.
func (b *bookWriter) manifest() error {
	for _, name := range b.order[1:] {
		b.m.Sheets = append(b.m.Sheets, b.stats[name]...)
	}
	w, err := b.sheet(specManifest)
	if err != nil {
		return err
	}
	w.limit = 1 << 30 // the manifest never continues
	checkpoint, key := b.m.Checkpoint, b.m.PublicKey
	if checkpoint == "" {
		checkpoint = "not available: exported without the ledger's checkpoint"
	}
	balanced := true
	var runs []string
	for _, r := range b.m.Reports {
		balanced = balanced && r.Balanced
		runs = append(runs, r.Run.ID)
	}
	var generated any
	if !b.m.GeneratedAt.IsZero() {
		generated = b.m.GeneratedAt
	}
	rows := [][]any{
		{"Label", Label, nil},
		{"Export id", b.m.ExportID, nil},
		{"Generated at (UTC)", generated, nil},
		{"Filters", b.m.Filters, nil},
		{"Runs", strings.Join(runs, " "), nil},
		{"Reconciliation balanced", balanced, nil},
		{"Ledger head at end of export range", ledgerHead(b.m.Reports), nil},
		{ManifestFieldCheckpoint, checkpoint, nil},
		{ManifestFieldPublicKey, key, nil},
		{"How to verify", "Save the signed checkpoint above to a file; on a copy of the ledger's data directory run: auditd verify --data DIR --key '<public key above>' --trusted-checkpoint FILE. It checks the hash chain, the Merkle tree and the signed checkpoints, and names the first bad sequence number. Each sheet's SHA-256 below is over its rows as shown: cells as text joined by tabs (tab, newline and backslash escaped as \\t, \\n, \\\\), one line per row, header row first.", nil},
		{"Timestamps", "UTC, RFC 3339 with milliseconds; durations in seconds", nil},
		{ManifestFieldSheet, "Rows", "SHA-256 of rows"},
	}
	for _, r := range rows {
		if err := w.row(r...); err != nil {
			return err
		}
	}
	for _, s := range b.m.Sheets {
		if err := w.row(s.Name, s.Rows, s.SHA256); err != nil {
			return err
		}
	}
	_, err = w.close()
	return err
}

func ledgerHead(reps []*Report) string {
	var last *Report
	for _, r := range reps {
		if last == nil || r.Run.LastSeq > last.Run.LastSeq {
			last = r
		}
	}
	return fmt.Sprintf("seq %d, hash %s", last.Run.LastSeq, last.Run.HeadAtEnd)
}

// events is the second pass over the ledger: it writes the event
// populations, all sheets at once, in sequence order.
func (b *bookWriter) events(ctx context.Context, runIDs []string, ranges [][2]uint64) error {
	var sheets []*sheetWriter
	var rows [5]rowWriter
	for i, spec := range eventSpecs {
		w, err := b.sheet(spec)
		if err != nil {
			return err
		}
		sheets, rows[i] = append(sheets, w), w
	}
	var retention rowWriter
	if b.x.Retention != nil {
		w, err := b.sheet(specRetention)
		if err != nil {
			return err
		}
		sheets, retention = append(sheets, w), w
	}
	progress := func() error {
		if b.done++; b.done%DefaultProgressEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if b.x.Progress != nil {
				b.x.Progress(b.done, b.total)
			}
		}
		return nil
	}
	if err := eventRows(b.x.Events, runIDs, ranges, b.access, b.retention, rows, retention, b.x.MaxPendingRows, b.redact, progress); err != nil {
		return err
	}
	if b.x.Progress != nil {
		b.x.Progress(b.done, b.total)
	}
	for _, w := range sheets {
		if err := b.closeSheet(w); err != nil {
			return err
		}
	}
	return nil
}

// eventSpecs are the populations written straight from the events, in the
// order eventRows takes their writers.
var eventSpecs = [5]sheetSpec{specDispatches, specWaits, specBreaker, specRegistry, specAccess}

// rowWriter takes one population's rows: a sheet, or a check of one.
type rowWriter interface {
	row(vals ...any) error
}

// eventRows reads the runs' ranges in order and writes the event
// populations' rows to rows (eventSpecs' order), calling tick for every
// event read; then the Access log rows of after, the runs' access events
// recorded after their ranges; then, with a retention writer, the
// retention events' rows (retentionRows).
func eventRows(events auditd.EventReader, runIDs []string, ranges [][2]uint64, after, ret []auditd.Event, rows [5]rowWriter, retention rowWriter,
	maxPending int, redact *redactor, tick func() error) error {
	disp, waits, breaker, registry, access := rows[0], rows[1], rows[2], rows[3], rows[4]
	if maxPending <= 0 {
		maxPending = DefaultMaxPendingRows
	}
	j := newJoiner(disp, maxPending, redact)

	for i, id := range runIDs {
		first, last := ranges[i][0], ranges[i][1]
		// The range the reconciliation read, in order, no more.
		err := events.Scan(first, last, func(e *auditd.Event) error {
			if e.Seq > last {
				return errStop
			}
			if err := tick(); err != nil {
				return err
			}
			if e.RunID != id {
				return nil
			}
			switch e.Type {
			case auditd.EventWait:
				return waits.row(e.Seq, e.RunID, e.SourceID, e.ItemKey, e.Page, e.Attempt, e.Time, string(e.Type), e.Gate,
					nil, nil, nil, nil, nil, seconds(e.Wait), seconds(e.Actual), hexHash(e.Hash))
			case auditd.EventThrottle:
				if err := waits.row(e.Seq, e.RunID, e.SourceID, e.ItemKey, e.Page, e.Attempt, e.Time, string(e.Type), fmt.Sprint(e.Status),
					e.Status, e.RetryAfterRaw, seconds(e.RetryAfter), e.Clamped, seconds(e.Backoff), seconds(e.Wait), nil, hexHash(e.Hash)); err != nil {
					return err
				}
			case auditd.EventBreaker:
				return breaker.row(e.Seq, e.RunID, e.SourceID, e.Time, e.From, e.To, e.Failures, e.Threshold, seconds(e.Cooldown), hexHash(e.Hash))
			case auditd.EventRegistrySnapshot, auditd.EventRegistryChanged:
				var oldLimit, oldWindow any
				cause := e.Snapshot // the column says what taught a change, or when a snapshot was taken
				if e.Type == auditd.EventRegistryChanged {
					oldLimit, oldWindow, cause = e.OldLimit, seconds(e.OldWindow), e.Cause
				}
				return registry.row(e.Seq, e.RunID, e.SourceID, e.Time, string(e.Type), cause, e.Group, oldLimit, e.NewLimit,
					oldWindow, seconds(e.NewWindow), hexHash(e.Hash))
			case auditd.EventExport, auditd.EventViewed:
				return accessRow(access, e, redact)
			}
			return j.observe(e)
		})
		if err != nil && !errors.Is(err, errStop) {
			return fmt.Errorf("scan run %s: %w", id, err)
		}
		if err := j.drain(); err != nil {
			return err
		}
	}
	for i := range after {
		if err := accessRow(access, &after[i], redact); err != nil {
			return err
		}
	}
	if retention != nil {
		return retentionRows(ret, retention, access)
	}
	return nil
}

// accessRow writes the Access log row of e, a view or an export.
func accessRow(access rowWriter, e *auditd.Event, redact *redactor) error {
	what := redact.text(e.Detail)
	if e.Type == auditd.EventViewed {
		what = "viewed " + what
	}
	return access.row(e.Seq, e.RunID, e.Time, e.Principal, what, e.Head, hexHash(e.Hash))
}

// accessAfter returns the access events of the runs recorded after their
// ranges (runRange: they never extend one), run after run, in sequence
// order.
func accessAfter(events auditd.EventReader, runIDs []string, ranges [][2]uint64) ([]auditd.Event, error) {
	var out []auditd.Event
	for i, id := range runIDs {
		err := events.ScanRun(id, ranges[i][1], func(e *auditd.Event) error {
			if e.Type.Access() {
				out = append(out, *e)
			}
			return nil
		})
		if err != nil {
			return nil, fmt.Errorf("access events of run %s: %w", id, err)
		}
	}
	return out, nil
}

func hexHash(h [32]byte) string {
	const digits = "0123456789abcdef"
	var b [64]byte
	for i, c := range h {
		b[2*i], b[2*i+1] = digits[c>>4], digits[c&0xf]
	}
	return string(b[:])
}
