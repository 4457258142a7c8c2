package reports_test

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

var ledgerHash = reportstest.HashEvent

// mustLedgerDir writes evs into a real ledger in a new data directory.
func mustLedgerDir(tb testing.TB, evs []auditd.Event) string {
	tb.Helper()
	dir := tb.TempDir()
	reportstest.WriteLedger(tb, dir, evs)
	return dir
}

// TestReconcile_RealLedger writes the clean fixture into a real ledger and
// reconciles it offline, as `auditd reconcile --data` does: read-only bbolt,
// ledger.Reader, the ledger's own hash.
func TestReconcile_RealLedger(t *testing.T) {
	dir := mustLedgerDir(t, loadFixture(t, "clean.ndjson"))
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()

	r := reports.NewReconciler(ledger.NewReader(db))
	r.Hash = ledgerHash
	r.Payloads = cleanPayloads()
	got, err := r.Reconcile(context.Background(), fixtureRun, cleanLive())
	if err != nil {
		t.Fatal(err)
	}
	want := reconcile(t, mutation{Live: cleanLive()})
	if !got.Balanced {
		t.Fatalf("real ledger not balanced: failed %v", got.Failed())
	}
	// Same recount; only the chain's hashes differ from the in-memory one.
	got.Run.HeadAtEnd, want.Run.HeadAtEnd = "", ""
	if a, b := mustJSON(t, got), mustJSON(t, want); !bytes.Equal(a, b) {
		t.Errorf("real ledger reconciles differently:\n%s", reportstest.LineDiff(string(b), string(a), 8))
	}
}

func TestExport_RealLedgerCheckpointVerifies(t *testing.T) {
	dir := mustLedgerDir(t, loadFixture(t, "clean.ndjson"))
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close(context.Background())

	r := reports.NewReconciler(l)
	r.Hash = ledgerHash
	x := reports.NewExporter(r)
	x.Ledger = l
	_, m := export(t, x, cleanRequest())
	tree, err := ledger.OpenCheckpoint([]byte(m.Checkpoint), m.PublicKey)
	if err != nil {
		t.Fatalf("manifest checkpoint does not verify with its public key: %v", err)
	}
	// The checkpoint covers the run's range and the access events after it
	// that the Access log lists (the fixture ends with one).
	if end := max(m.Reports[0].Run.LastSeq, slices.Max(m.Access)); tree.Size != end {
		t.Errorf("checkpoint covers %d events, the export's events end at %d", tree.Size, end)
	}
	if !m.Reports[0].Balanced {
		t.Errorf("export of a real ledger not balanced: %v", m.Reports[0].Failed())
	}
}

func mustJSON(tb testing.TB, v any) []byte {
	tb.Helper()
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
