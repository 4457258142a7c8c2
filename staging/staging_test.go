package staging_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

func mustOpen(tb testing.TB) (*staging.Store, string) {
	tb.Helper()
	dir := tb.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	s, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		tb.Fatal(err)
	}
	return s, filepath.Join(dir, "payloads")
}

func TestPutStoresUnderHashAndVerifies(t *testing.T) {
	s, dir := mustOpen(t)
	s.InlineMax = 4 // this payload goes to a file of its own
	body := `{"features":[1,2,3]}`
	sum, n, err := s.Put(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	want := sha256.Sum256([]byte(body))
	if sum != hex.EncodeToString(want[:]) || n != int64(len(body)) {
		t.Fatalf("got %s %d", sum, n)
	}
	f, err := s.Open(sum)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(f)
	f.Close()
	if string(got) != body {
		t.Fatalf("read back %q", got)
	}
	if err := s.VerifyPayload(sum); err != nil {
		t.Fatalf("verify: %v", err)
	}
	// Altering the file is caught.
	if err := os.WriteFile(filepath.Join(dir, sum[:2], sum), []byte("tampered"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.VerifyPayload(sum); !errors.Is(err, staging.ErrCorrupt) {
		t.Fatalf("verify after tamper: %v", err)
	}
	if err := s.VerifyPayload(strings.Repeat("0", 64)); !errors.Is(err, staging.ErrNotFound) {
		t.Fatalf("verify missing: %v", err)
	}
	if _, err := s.Open("../../etc/passwd"); !errors.Is(err, staging.ErrNotFound) {
		t.Fatalf("open of a bad name: %v", err)
	}
}

func TestCapLeavesNothingBehind(t *testing.T) {
	s, dir := mustOpen(t)
	s.MaxBytes, s.InlineMax = 8, 2
	if _, _, err := s.Put(strings.NewReader("123456789")); !errors.Is(err, staging.ErrTooLarge) {
		t.Fatalf("got %v", err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 0 {
		t.Fatalf("left %d files", len(entries))
	}
}

func TestLastGoodIndex(t *testing.T) {
	s, _ := mustOpen(t)
	k1 := staging.RequestKey("county", "GET", "/q?a=1", nil)
	k2 := staging.RequestKey("county", "GET", "/q?a=2", nil)
	if k1 == k2 {
		t.Fatal("different paths share a key")
	}
	// Pinned: stored last-good entries are found by this key. It is the
	// SHA-256 of "6:county3:GET6:/q?a=10:", each part prefixed by its length.
	if want := "482f37caa0c05f9f77e5e596799763f6f9d9d4e587fffdebdc58c05b89167b9a"; k1 != want {
		t.Fatalf("RequestKey changed: got %s, want %s", k1, want)
	}
	if _, ok, _ := s.LastGood(k1); ok {
		t.Fatal("empty index has a last good copy")
	}
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	if err := s.SetLastGood(k1, staging.Copy{Sum: "abc", FetchedAt: t0, Run: "run-1"}); err != nil {
		t.Fatal(err)
	}
	if c, ok, _ := s.LastGood(k1); !ok || c != (staging.Copy{Sum: "abc", FetchedAt: t0, Run: "run-1"}) {
		t.Fatalf("got %+v %v", c, ok)
	}
	// A run that ends late does not put back a copy older than the index's.
	if err := s.SetLastGood(k1, staging.Copy{Sum: "older", FetchedAt: t0.Add(-time.Second), Run: "run-0"}); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := s.LastGood(k1); c.Sum != "abc" {
		t.Fatalf("an older copy replaced the newer: got %+v", c)
	}
	if err := s.SetLastGood(k1, staging.Copy{Sum: "newer", FetchedAt: t0.Add(time.Second)}); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := s.LastGood(k1); c.Sum != "newer" || c.Run != "" {
		t.Fatalf("a newer copy did not replace the older: got %+v", c)
	}
	if _, ok, _ := s.LastGood(k2); ok {
		t.Fatal("key leaked to another request")
	}
}

func TestSmallPayloadsStayInline(t *testing.T) {
	s, dir := mustOpen(t)
	w, _ := s.NewWriter()
	w.Write([]byte(`{"page":1}`))
	w.Write([]byte("\n"))
	w.Write([]byte(`{"page":2}`))
	sum, n, err := w.Commit()
	if err != nil || n != 21 {
		t.Fatalf("commit: %d %v", n, err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a small payload made %d files", len(entries))
	}
	r, err := s.Open(sum)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	if string(got) != "{\"page\":1}\n{\"page\":2}" {
		t.Fatalf("read back %q", got)
	}
	if err := s.VerifyPayload(sum); err != nil {
		t.Fatal(err)
	}
	// The same bytes grown past InlineMax go to a file, and are still found.
	s.InlineMax = 8
	big := strings.Repeat("x", 100)
	bsum, _, err := s.Put(strings.NewReader(big))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, bsum[:2], bsum)); err != nil {
		t.Fatalf("large payload not filed: %v", err)
	}
	if err := s.VerifyPayload(bsum); err != nil {
		t.Fatal(err)
	}
}
