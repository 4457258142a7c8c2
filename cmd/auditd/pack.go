package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/retention"
	bolt "go.etcd.io/bbolt"
)

// runPack writes the evidence pack of one or more runs offline from a
// stopped server's data directory: the workbook, the leaves and their
// proofs, for a third party to verify alone (auditd verify --pack).
func runPack(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pack", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data", "data `directory` of a stopped auditd")
	var runs listFlag
	fs.Var(&runs, "run", "run `id` (repeat for several runs: one pack, the runs in this order)")
	out := fs.String("out", "", "pack `file` to write (.zip)")
	previous := fs.String("previous", "", "an earlier pack or checkpoint `file`: the pack proves its log extends that one")
	checkpoint := fs.String("checkpoint", "", "signed checkpoint `file` to prove against (a cosigned one); default the latest")
	exportID := fs.String("export-id", "", "export `id` recorded in the workbook (default: the run ids)")
	award := fs.String("award", "", "instead of --run: every run of the award (`FAIN`) started in [--from, --to)")
	from := fs.String("from", "", "with --award: RFC 3339 `time` or date; default the first run")
	to := fs.String("to", "", "with --award: RFC 3339 `time` or date; default now")
	fleet := fs.Bool("fleet", false, "instead of --data: download the fleet run's pack (one --run) from --server, any node of the fleet")
	server := fs.String("server", "", "with --fleet: a fleet node's `URL`")
	token := fs.String("token", "", "with --fleet: API `token` (default $AUDITD_TOKEN)")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd pack: %v\n", err)
		return 2
	}
	for i := range runs {
		runs[i] = api.CanonicalRunID(runs[i])
	}
	switch {
	case *fleet && (len(runs) != 1 || *server == "" || *out == "" || *award != ""):
		return fail(errors.New("--fleet takes one --run, --server URL (any node of the fleet) and --out"))
	case *fleet:
		return packFleet(ctx, *server, runs[0], cmp.Or(*token, os.Getenv("AUDITD_TOKEN")), *out, stdout, stderr)
	case *server != "" || *token != "":
		return fail(errors.New("--server and --token go with --fleet"))
	case fs.NArg() > 0:
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	case (len(runs) == 0) == (*award == ""):
		return fail(errors.New("give --run (repeatable) or --award"))
	case *award == "" && (*from != "" || *to != ""):
		return fail(errors.New("--from and --to go with --award"))
	case *out == "":
		return fail(errors.New("--out is required"))
	}
	fromT, err := packTime("from", *from)
	if err != nil {
		return fail(err)
	}
	toT, err := packTime("to", *to)
	if err != nil {
		return fail(err)
	}
	key, err := ledger.ReadPublicKey(*data)
	if err != nil {
		return fail(err)
	}
	db, err := openDB(*data, true)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	filters := "run " + strings.Join(runs, " ")
	if *award != "" {
		if runs, err = awardRuns(ledger.NewReader(db), *award, fromT, toT); err != nil {
			return fail(err)
		}
		if len(runs) == 0 {
			return fail(fmt.Errorf("no run of award %q started in that period", *award))
		}
		filters = auditd.RunFilter{FAIN: *award, From: fromT, To: toT}.AwardPeriod()
	}
	req := pack.Request{Request: reports.Request{ExportID: *exportID, RunIDs: runs, Filters: filters}}
	if req.ExportID == "" {
		req.ExportID = filters
	}
	if *previous != "" {
		if req.Previous, err = previousCheckpoint(*previous); err != nil {
			return fail(err)
		}
	}
	if *checkpoint != "" {
		if req.Checkpoint, err = os.ReadFile(*checkpoint); err != nil {
			return fail(err)
		}
	}
	rec, err := offlineReconciler(db, *data)
	if err != nil {
		return fail(err)
	}
	b := &pack.Builder{Ledger: ledger.NewReader(db), PublicKey: key, Exporter: reports.NewExporter(rec), TmpDir: filepath.Dir(*out),
		Retention: retention.New(readLedger{ledger.NewReader(db)}, nil)}
	var m *pack.Manifest
	err = writeFileAtomic(*out, func(w io.Writer) error {
		m, err = b.Build(ctx, w, req)
		return err
	})
	if err != nil {
		return fail(err)
	}
	fmt.Fprintf(stdout, "wrote %s: %s, %s in %s, proven against %s at size %d\n",
		*out, plural(int64(len(m.Runs)), "run"), leaves(m.Leaves), plural(int64(len(m.Ranges)), "range"), m.Origin, m.TreeSize)
	return 0
}

// packTime reads --from or --to: RFC 3339, or a date (midnight UTC).
func packTime(name, s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UTC(), nil
	}
	t, err := time.Parse(time.DateOnly, s)
	if err != nil {
		return t, fmt.Errorf("--%s: want an RFC 3339 time or YYYY-MM-DD", name)
	}
	return t, nil
}

// awardRuns finds the runs of an award started in [from, to) from their
// run.started events, oldest first, as an auditor reads a period.
func awardRuns(r *ledger.Reader, fain string, from, to time.Time) ([]string, error) {
	first := uint64(1)
	if !from.IsZero() {
		var err error
		if first, err = r.SeqAt(from); err != nil {
			return nil, err
		}
	}
	var runs []string
	err := r.Scan(first, 0, func(e *auditd.Event) error {
		if !to.IsZero() && !e.Time.Before(to) {
			return errStopScan
		}
		if e.Type != auditd.EventRunStarted {
			return nil
		}
		var d struct {
			Award auditd.Award `json:"award"`
		}
		if json.Unmarshal([]byte(e.Detail), &d) == nil && d.Award.FAIN == fain {
			runs = append(runs, e.RunID)
		}
		return nil
	})
	if errors.Is(err, errStopScan) {
		err = nil
	}
	return runs, err
}

var errStopScan = errors.New("stop scan")

// previousCheckpoint reads the checkpoint of an earlier pack, or a
// checkpoint note file.
func previousCheckpoint(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if !bytes.HasPrefix(b, []byte("PK")) {
		return b, nil
	}
	p, err := pack.Open(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return nil, fmt.Errorf("--previous: %w", err)
	}
	return p.Checkpoint, nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	if s == "" {
		return errors.New("empty value")
	}
	*l = append(*l, s)
	return nil
}

// livePacks builds evidence packs for the API from the serving ledger,
// with auditd pack's builder, each in one of the exports' slots.
type livePacks struct {
	db          *bolt.DB
	led         *ledger.Ledger
	payloads    reports.PayloadVerifier
	secretQuery func(sourceID string) []string
	admission   *reports.Admission
}

func (p livePacks) WritePack(ctx context.Context, w io.Writer, runIDs []string, filters string) error {
	return p.admission.Do(ctx, func(ctx context.Context) error {
		note, err := p.led.Checkpoint()
		if err != nil {
			return err
		}
		tree, err := ledger.OpenCheckpoint(note, p.led.PublicKey())
		if err != nil {
			return fmt.Errorf("pack checkpoint: %w", err)
		}
		// The workbook reads the ledger as that checkpoint has it: events
		// appended meanwhile (another download, a run's dispatches) are
		// not its proofs' to cover, so the export does not see them.
		at := ledgerAt{Reader: ledger.NewReader(p.db), size: tree.Size}
		rec := reports.NewReconciler(at)
		rec.Hash, rec.Payloads = newLedgerHash(), p.payloads
		x := reports.NewExporter(rec)
		x.SecretQuery = p.secretQuery
		b := &pack.Builder{Ledger: ledger.NewReader(p.db), PublicKey: p.led.PublicKey(), Exporter: x, Retention: retention.New(at, nil)}
		req := pack.Request{Checkpoint: note, Request: reports.Request{
			ExportID: fmt.Sprintf("%s@%d", filters, tree.Size), RunIDs: runIDs, Filters: filters}}
		_, err = b.Build(ctx, w, req)
		return err
	})
}

// ledgerAt reads a ledger up to event size, for a pack proven at a
// checkpoint of that size while the ledger grows; it appends nothing.
type ledgerAt struct {
	*ledger.Reader
	size uint64
}

func (l ledgerAt) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	if to == 0 || to > l.size {
		to = l.size
	}
	if from > to {
		return nil
	}
	return l.Reader.Scan(from, to, fn)
}

func (l ledgerAt) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	err := l.Reader.ScanRun(runID, after, func(e *auditd.Event) error {
		if e.Seq > l.size {
			return errStopScan
		}
		return fn(e)
	})
	if errors.Is(err, errStopScan) {
		err = nil
	}
	return err
}

func (l ledgerAt) Event(seq uint64) (auditd.Event, error) {
	if seq > l.size {
		return auditd.Event{}, auditd.Errorf(auditd.ENOTFOUND, "no event %d", seq)
	}
	return l.Reader.Event(seq)
}

func (ledgerAt) Append(context.Context, auditd.Event) (auditd.Event, error) {
	return auditd.Event{}, errors.New("read-only ledger")
}

// leaves is "1 leaf", "2 leaves" (plural adds an s).
func leaves(n uint64) string {
	if n == 1 {
		return "1 leaf"
	}
	return fmt.Sprintf("%d leaves", n)
}
