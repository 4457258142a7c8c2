package registry_test

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/registry"
)

// TestWithRealLedger runs the registry against the real ledger in the same
// bbolt file: the registry never appends inside one of its own transactions
// (bbolt has one writer), its events land in order, none carries a secret in
// its canonical (hashed) encoding, and learned state survives a reopen.
func TestWithRealLedger(t *testing.T) {
	const secret = "tok-4f1e9a"
	dir := t.TempDir()
	path := filepath.Join(dir, "auditd.db")
	clk := clock.NewFake(epoch)
	ctx := context.Background()

	db := mustOpenDBAt(t, path)
	led, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	src := auditd.Source{ID: "county", BaseURL: "https://gis.county.gov", Headers: map[string]string{"X-Api-Key": secret}}
	if err := reg.PutSource(ctx, "ops", src); err != nil {
		t.Fatal(err)
	}
	if err := reg.StartRun(ctx, "run-1", []string{"county"}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Observe(ctx, registry.Observation{RunID: "run-1", SourceID: "county", Status: 429}); err != nil {
		t.Fatal(err)
	}
	if err := reg.EndRun(ctx, "run-1", []string{"county"}); err != nil {
		t.Fatal(err)
	}

	var types []auditd.EventType
	if err := led.Scan(1, 0, func(e *auditd.Event) error {
		types = append(types, e.Type)
		if enc := ledger.MarshalCanonical(nil, e); bytes.Contains(enc, []byte(secret)) || bytes.Contains(enc, []byte("X-Api-Key")) {
			t.Errorf("event %d (%s) carries the secret header", e.Seq, e.Type)
		}
		if e.Type == auditd.EventRegistryChanged && (e.OldLimit != 15 || e.NewLimit != 7 || e.Cause != registry.CauseThrottle || e.RunID != "run-1") {
			t.Errorf("registry.changed = %+v", e)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []auditd.EventType{auditd.EventSourceChanged, auditd.EventRegistrySnapshot, auditd.EventRegistryChanged, auditd.EventRegistrySnapshot}
	if len(types) != len(want) {
		t.Fatalf("ledger holds %v, want %v", types, want)
	}
	for i := range want {
		if types[i] != want[i] {
			t.Fatalf("ledger holds %v, want %v", types, want)
		}
	}

	closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := led.Close(closeCtx); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	db = mustOpenDBAt(t, path)
	led, err = ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer led.Close(closeCtx)
	reg, err = registry.Open(db, registry.Options{Ledger: led, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	if l, err := reg.Limits("county"); err != nil || l.Limit != 7 {
		t.Fatalf("after reopen limits = %+v, %v; want 7", l, err)
	}
	if h, err := reg.RequestHeaders("county"); err != nil || h["X-Api-Key"] != secret {
		t.Fatalf("after reopen headers = %v, %v", h, err)
	}
}
