package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

func TestExport(t *testing.T) {
	dir := reconcileDataDir(t, reportstest.Mutation{})
	outDir := t.TempDir()
	out := filepath.Join(outDir, "evidence.xlsx")
	code, stdout, stderr := runCmd(t, "export", "--data", dir, "--run", reportstest.FixtureRun, "--out", out)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, stdout, stderr)
	}
	if !strings.Contains(stdout, "balanced=true") {
		t.Errorf("stdout %q", stdout)
	}
	f, err := excelize.OpenFile(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if got := f.GetSheetList(); len(got) != 11 || got[0] != reports.SheetManifest {
		t.Errorf("sheets %q", got)
	}
	key, err := ledger.ReadPublicKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := f.GetRows(reports.SheetManifest)
	if err != nil {
		t.Fatal(err)
	}
	var found bool
	generated := ""
	for _, r := range rows {
		found = found || len(r) > 1 && r[1] == key
		if len(r) > 1 && r[0] == "Generated at (UTC)" {
			generated = r[1]
		}
	}
	if !found {
		t.Error("Manifest lacks the ledger's public key")
	}
	// An offline export says when it was made, as the server's do.
	if at, err := time.Parse("2006-01-02T15:04:05.000Z", generated); err != nil || time.Since(at) > time.Hour || time.Until(at) > time.Minute {
		t.Errorf("Manifest's generated at is %q, want now (%v)", generated, err)
	}

	// With a fixed generated-at (or none), the same range exported again is
	// the same file.
	for _, at := range []string{"none", "2026-03-03T09:30:00.123Z"} {
		var files [2][]byte
		for i := range files {
			path := filepath.Join(outDir, fmt.Sprintf("fixed-%d.xlsx", i))
			if code, _, stderr := runCmd(t, "export", "--data", dir, "--run", reportstest.FixtureRun, "--out", path, "--generated-at", at); code != 0 {
				t.Fatal(stderr)
			}
			files[i], _ = os.ReadFile(path)
		}
		if !bytes.Equal(files[0], files[1]) || len(files[0]) == 0 {
			t.Errorf("--generated-at %s: two offline exports of the same run differ", at)
		}
	}
}

// TestExportNothingHalfWritten: a failed export leaves neither the file
// nor a temporary one behind.
func TestExportNothingHalfWritten(t *testing.T) {
	dir := reconcileDataDir(t, reportstest.Mutation{})
	outDir := t.TempDir()
	out := filepath.Join(outDir, "evidence.xlsx")
	code, _, stderr := runCmd(t, "export", "--data", dir, "--run", "01JNOSUCHRUN00000000000000", "--out", out)
	if code != 2 || !strings.Contains(stderr, "not found") {
		t.Fatalf("exit %d, stderr %q; want 2 and run not found", code, stderr)
	}
	if entries, _ := os.ReadDir(outDir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
}

func TestProgressBar(t *testing.T) {
	var buf strings.Builder
	p := &progressBar{w: &buf}
	p.update(0, 200)
	p.update(1, 200) // same percentage: not redrawn
	p.update(100, 200)
	p.update(200, 200)
	p.done()
	got := buf.String()
	if n := strings.Count(got, "\r"); n != 3 {
		t.Errorf("%d redraws, want 3: %q", n, got)
	}
	if !strings.Contains(got, " 50% 100/200 events") || !strings.HasSuffix(got, "100% 200/200 events\n") {
		t.Errorf("progress output %q", got)
	}
	var none *progressBar
	none.done() // no terminal: nothing to finish
}

// TestWriteFileAtomicRefusesADirectory: --out naming a directory (pack
// takes a file's name), or a file in a directory that does not exist, is
// said as such before anything is written or asked, not as a rename or an
// open of the temporary file.
func TestWriteFileAtomicRefusesADirectory(t *testing.T) {
	dir := t.TempDir()
	called := false
	err := writeFileAtomic(dir, func(io.Writer) error { called = true; return nil })
	if err == nil || !strings.Contains(err.Error(), "it is a directory; give a file's name") || called {
		t.Fatalf("writing to a directory: %v (wrote: %t), want it refused before writing", err, called)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("left behind: %v", entries)
	}
	err = writeFileAtomic(filepath.Join(dir, "no-such-dir", "x.zip"), func(io.Writer) error { called = true; return nil })
	if err == nil || !strings.Contains(err.Error(), "no-such-dir does not exist") || called {
		t.Errorf("writing into a directory that does not exist: %v (wrote: %t)", err, called)
	}
	// pack --fleet checks --out before it asks the server anything.
	code, _, stderr := runCmd(t, "pack", "--fleet", "--server", "http://127.0.0.1:1", "--run", "01J00000000000000000000001", "--out", dir)
	if code != 2 || !strings.Contains(stderr, "--out "+dir+": it is a directory") {
		t.Errorf("pack --fleet --out DIR: exit %d, %q; want 2 naming --out before any call", code, stderr)
	}
}
