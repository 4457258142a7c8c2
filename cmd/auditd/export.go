package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
)

// runExport writes a run's evidence workbook offline from a stopped
// server's data directory. The file appears only once complete (temporary
// file, then rename); a progress bar goes to stderr when it is a terminal.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("export", "export --run ID --out FILE|DIR [flags]", stdout, stderr)
	data := fs.String("data", "./data", "data `directory` of a stopped auditd")
	runID := fs.String("run", "", "run `id`")
	out := fs.String("out", "", "workbook `file` to write (.xlsx), or a directory to write evidence-RUN.xlsx into")
	exportID := fs.String("export-id", "", "export `id` recorded in the Manifest (default: run id)")
	generated := fs.String("generated-at", "now", "RFC 3339 `time` recorded as the Manifest's generated-at, \"now\", or \"none\" (none, or a fixed time, makes the same range give the same file)")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd export: %v\n", err)
		return 2
	}
	*runID = api.CanonicalRunID(*runID)
	switch {
	case *runID == "":
		return fs.fail("--run is required: the id of the run to export")
	case *out == "":
		return fs.fail("--out is required: the workbook file to write, or a directory to write it into")
	}
	path, err := outPath(*out, "evidence-"+*runID+".xlsx")
	if err != nil {
		return fail(fmt.Errorf("--out: %w", err))
	}
	req := reports.Request{ExportID: *exportID, RunIDs: []string{*runID}, Filters: "run " + *runID}
	if req.ExportID == "" {
		req.ExportID = *runID
	}
	switch *generated {
	case "none":
	case "now":
		req.GeneratedAt = time.Now().UTC().Truncate(time.Millisecond)
	default:
		t, err := time.Parse(time.RFC3339Nano, *generated)
		if err != nil {
			return fs.fail("--generated-at %q: want an RFC 3339 time (2026-03-03T09:30:00Z), now or none", *generated)
		}
		req.GeneratedAt = t
	}

	db, err := openDB(*data, true)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	r, err := offlineReconciler(db, *data)
	if err != nil {
		return fail(err)
	}
	x := reports.NewExporter(r)
	x.TmpDir = filepath.Dir(path)
	declared, err := registry.SecretQueries(db)
	if err != nil {
		return fail(err)
	}
	x.SecretQuery = func(id string) []string { return declared[id] }
	if key, err := ledger.ReadPublicKey(*data); err == nil {
		x.Ledger = offlineCheckpoint{reader: ledger.NewReader(db), key: key}
	}
	var bar *progressBar
	if isTerminal(stderr) {
		bar = &progressBar{w: stderr}
		x.Progress = bar.update
	}

	var m *reports.Manifest
	err = writeFileAtomic(path, func(w io.Writer) error {
		m, err = x.Export(ctx, w, req)
		return err
	})
	bar.done()
	if err != nil {
		return fail(err)
	}
	var rows int64
	for _, s := range m.Sheets {
		rows += s.Rows
	}
	fmt.Fprintf(stdout, "wrote %s: %s, %s, reconciliation balanced=%t\n", path, plural(int64(len(m.Sheets)+1), "sheet"), plural(rows, "row"), m.Reports[0].Balanced)
	return 0
}

// outPath is where --out asks a file to go: out itself, or name inside it
// when out is a directory (or is written as one, ending in a slash, and
// is then made).
func outPath(out, name string) (string, error) {
	if strings.HasSuffix(out, "/") || strings.HasSuffix(out, string(filepath.Separator)) {
		if err := os.MkdirAll(out, 0o755); err != nil {
			return "", err
		}
		return filepath.Join(out, name), nil
	}
	if fi, err := os.Stat(out); err == nil && fi.IsDir() {
		return filepath.Join(out, name), nil
	}
	return out, nil
}

// offlineCheckpoint gives the Manifest the ledger's public key and, when the
// ledger's reader can hand it out, its latest signed checkpoint.
type offlineCheckpoint struct {
	reader *ledger.Reader
	key    string
}

func (c offlineCheckpoint) PublicKey() string { return c.key }

func (c offlineCheckpoint) Checkpoint() ([]byte, error) { return c.reader.Checkpoint() }

// writeFileAtomic writes path through fn so that path holds either its old
// content or all of the new: a temporary file beside it, synced, then
// renamed over it. On error the temporary file is removed. A path
// checkOut refuses is refused before fn runs.
func writeFileAtomic(path string, fn func(w io.Writer) error) (err error) {
	if err := checkOut(path); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err = fn(f); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Chmod(f.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// checkOut says why a file cannot be written at path, if it cannot: it is
// a directory, or its directory is not one.
func checkOut(path string) error {
	if fi, err := os.Stat(path); err == nil && fi.IsDir() {
		return errors.New("it is a directory; give a file's name")
	}
	dir := filepath.Dir(path)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("directory %s does not exist", dir)
	}
	return nil
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progressBar draws one line on a terminal, redrawn when the percentage
// moves. A nil *progressBar draws nothing.
type progressBar struct {
	w     io.Writer
	last  int
	shown bool
}

func (p *progressBar) update(done, total int64) {
	pct := 100
	if total > 0 {
		pct = int(min(100, done*100/total))
	}
	if p.shown && pct == p.last {
		return
	}
	p.last, p.shown = pct, true
	const width = 40
	fill := width * pct / 100
	bar := make([]byte, width)
	for i := range bar {
		bar[i] = ' '
		if i < fill {
			bar[i] = '='
		}
	}
	fmt.Fprintf(p.w, "\rexport [%s] %3d%% %d/%d events", bar, pct, done, total)
}

func (p *progressBar) done() {
	if p != nil && p.shown {
		fmt.Fprintln(p.w)
	}
}
