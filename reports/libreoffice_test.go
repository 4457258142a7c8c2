package reports_test

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/reports"
)

// soffice finds LibreOffice. CI installs it, so there its absence fails the
// test; elsewhere the test skips.
func soffice(tb testing.TB) string {
	tb.Helper()
	for _, name := range []string{"soffice", "libreoffice"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("LibreOffice (soffice) not found; CI must install libreoffice-calc")
	}
	tb.Skip("LibreOffice (soffice) not installed")
	return ""
}

// TestLibreOffice opens the evidence and reconciliation workbooks in
// LibreOffice Calc headless, converts every sheet to CSV and expects the
// rows excelize reads back, and the Manifest's row hashes recomputed from
// the CSV.
func TestLibreOffice(t *testing.T) {
	bin := soffice(t)
	t.Run("Evidence", func(t *testing.T) {
		b, m := export(t, newExporter(newMemLedger(loadFixture(t, "clean.ndjson"))), cleanRequest())
		hashes := map[string]string{}
		for _, s := range m.Sheets {
			hashes[s.Name] = s.SHA256
		}
		compareWithLibreOffice(t, bin, b, hashes)
	})
	t.Run("Reconciliation", func(t *testing.T) {
		var buf bytes.Buffer
		if err := reports.WriteXLSX(&buf, reconcile(t, mutation{Before: drop(27)}), generatedAt); err != nil {
			t.Fatal(err)
		}
		compareWithLibreOffice(t, bin, buf.Bytes(), nil)
	})
}

func compareWithLibreOffice(t *testing.T, bin string, b []byte, hashes map[string]string) {
	t.Helper()
	want := readWorkbook(t, b)
	dir := t.TempDir()
	in := filepath.Join(dir, "book.xlsx")
	if err := os.WriteFile(in, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Filter options: comma, double quote, UTF-8, from line 1, default cell
	// formats, language, ..., cells as shown (token 9), every sheet (-1).
	cmd := exec.CommandContext(ctx, bin, "--headless", "--norestore",
		"-env:UserInstallation=file://"+filepath.Join(dir, "profile"),
		"--convert-to", "csv:Text - txt - csv (StarCalc):44,34,76,1,,0,false,true,true,false,false,-1",
		"--outdir", filepath.Join(dir, "out"), in)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("soffice: %v\n%s", err, out)
	}
	for _, name := range want.names {
		path := filepath.Join(dir, "out", "book-"+name+".csv")
		f, err := os.Open(path)
		if err != nil {
			t.Errorf("sheet %s not converted: %v\n%s", name, err, out)
			continue
		}
		r := csv.NewReader(f)
		r.FieldsPerRecord = -1
		got, err := r.ReadAll()
		f.Close()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if h, ok := hashes[name]; ok && rowsHash(got) != h {
			t.Errorf("%s: row hash from LibreOffice's CSV differs from the Manifest's", name)
		}
		wantRows := want.sheets[name]
		if len(got) != len(wantRows) {
			t.Errorf("%s: LibreOffice sees %d rows, excelize %d", name, len(got), len(wantRows))
			continue
		}
		for i := range got {
			if g, w := trimRow(got[i]), trimRow(wantRows[i]); !slices.Equal(g, w) {
				t.Errorf("%s row %d:\nLibreOffice %q\nexcelize    %q", name, i+1, g, w)
			}
		}
	}
}

func trimRow(r []string) []string {
	for len(r) > 0 && r[len(r)-1] == "" {
		r = r[:len(r)-1]
	}
	return r
}
