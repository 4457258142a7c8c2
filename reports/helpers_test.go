package reports_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
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
		tb.Errorf("%s differs from golden (run with -update to accept):\n%s", name, reportstest.LineDiff(string(want), string(got), 8))
	}
}
