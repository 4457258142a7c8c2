package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/retention"
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
	if err := fs.Parse(args); err != nil {
		return 2
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd pack: %v\n", err)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	case len(runs) == 0:
		return fail(errors.New("--run is required"))
	case *out == "":
		return fail(errors.New("--out is required"))
	}
	req := pack.Request{Request: reports.Request{ExportID: *exportID, RunIDs: runs, Filters: "run " + strings.Join(runs, " ")}}
	if req.ExportID == "" {
		req.ExportID = strings.Join(runs, "+")
	}
	var err error
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
	key, err := ledger.ReadPublicKey(*data)
	if err != nil {
		return fail(err)
	}
	db, err := openDB(*data, true)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
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
	fmt.Fprintf(stdout, "wrote %s: %d runs, %d leaves in %d ranges, proven against %s at size %d\n",
		*out, len(m.Runs), m.Leaves, len(m.Ranges), m.Origin, m.TreeSize)
	return 0
}

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
