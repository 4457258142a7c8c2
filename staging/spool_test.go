package staging_test

import (
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// finishSmall stages body as a small payload and returns it unstored.
func finishSmall(tb testing.TB, s *staging.Store, body string) staging.Payload {
	tb.Helper()
	w, err := s.NewWriter()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := w.Write([]byte(body)); err != nil {
		tb.Fatal(err)
	}
	p, err := w.Finish()
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// store commits a payload's record, as the ledger does (Ledger.Add).
func store(tb testing.TB, db *bolt.DB, p staging.Payload) {
	tb.Helper()
	rec, ok := p.Record()
	if !ok {
		tb.Fatal("a small payload has no record")
	}
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(rec.Bucket).Put(rec.Key, rec.Value) }); err != nil {
		tb.Fatal(err)
	}
}

func read(tb testing.TB, s *staging.Store, sum string) (string, error) {
	tb.Helper()
	r, err := s.Open(sum)
	if err != nil {
		return "", err
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	return string(b), err
}

// A small payload is found while it is spooled, after Compact moves it, and
// after a restart that found it still spooled.
func TestSpooledPayloadsAreFoundEverywhere(t *testing.T) {
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		t.Fatal(err)
	}

	never := finishSmall(t, s, `{"never":"stored"}`)
	if _, err := read(t, s, never.Sum); !errors.Is(err, staging.ErrNotFound) {
		t.Fatalf("a payload whose record never committed: %v, want ErrNotFound", err)
	}

	bodies := []string{`{"page":1}`, `{"page":2}`, ``}
	var sums []string
	for _, b := range bodies {
		p := finishSmall(t, s, b)
		store(t, db, p)
		sums = append(sums, p.Sum)
	}
	check := func(when string) {
		t.Helper()
		for i, sum := range sums {
			got, err := read(t, s, sum)
			if err != nil || got != bodies[i] {
				t.Fatalf("%s: payload %d read as %q, %v", when, i, got, err)
			}
			if err := s.VerifyPayload(sum); err != nil {
				t.Fatalf("%s: payload %d: %v", when, i, err)
			}
		}
	}
	check("spooled")

	if n, err := s.Compact(); err != nil || n != len(bodies) {
		t.Fatalf("compact moved %d, %v; want %d", n, err, len(bodies))
	}
	check("compacted")
	if n, err := s.Compact(); err != nil || n != 0 {
		t.Fatalf("second compact moved %d, %v; want 0", n, err)
	}

	// A crash with payloads still spooled: Open moves them.
	late := finishSmall(t, s, `{"page":"late"}`)
	store(t, db, late)
	s2, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := read(t, s2, late.Sum); err != nil || got != `{"page":"late"}` {
		t.Fatalf("after reopening: %q, %v", got, err)
	}
	if n, err := s2.Compact(); err != nil || n != 0 {
		t.Fatalf("Open left %d payloads spooled (%v)", n, err)
	}
}

// OpenReadOnly on a file no store was ever opened in says so, and creates
// nothing there.
func TestOpenReadOnlyWithoutAStore(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auditd.db")
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := staging.OpenReadOnly(db, filepath.Join(filepath.Dir(path), "payloads")); !errors.Is(err, staging.ErrNoStore) {
		t.Fatalf("OpenReadOnly: %v, want ErrNoStore", err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		return tx.ForEach(func(name []byte, _ *bolt.Bucket) error { return fmt.Errorf("bucket %s created", name) })
	})
	if err != nil {
		t.Fatal(err)
	}
}
