package reports_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/reports")

// Short names for the shared fixtures (package reportstest).
const fixtureRun = reportstest.FixtureRun

var (
	fixtureBase   = reportstest.FixtureBase
	loadFixture   = reportstest.LoadFixture
	newMemLedger  = reportstest.NewMemLedger
	testHash      = reportstest.Hash
	cleanPayloads = reportstest.CleanPayloads
	cleanLive     = reportstest.CleanLive
)

type memLedger = reportstest.MemLedger

// testdataDir is the repository's testdata/reports.
func testdataDir() string { return reportstest.Dir() }

// newReconciler returns a Reconciler over l with every seam given.
func newReconciler(l *memLedger) *reports.Reconciler {
	r := reports.NewReconciler(l)
	r.Hash = testHash
	r.Payloads = cleanPayloads()
	r.Bursts = map[string]int{}
	return r
}

// goldenCompare compares got with testdata/reports/name, rewriting it under
// -update.
func goldenCompare(tb testing.TB, name string, got []byte) {
	tb.Helper()
	path := filepath.Join(testdataDir(), name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			tb.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		tb.Errorf("%s differs from golden (run with -update to accept):\n%s", name, lineDiff(string(want), string(got)))
	}
}

// lineDiff shows the first lines that differ.
func lineDiff(want, got string) string {
	w, g := bytes.Split([]byte(want), []byte("\n")), bytes.Split([]byte(got), []byte("\n"))
	var out bytes.Buffer
	shown := 0
	for i := 0; i < len(w) || i < len(g); i++ {
		var a, b []byte
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if !bytes.Equal(a, b) {
			out.WriteString("line " + strconv.Itoa(i+1) + ":\n  want: " + string(a) + "\n  got:  " + string(b) + "\n")
			if shown++; shown == 8 {
				break
			}
		}
	}
	return out.String()
}
