package staging_test

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/staging"
)

// TestPurge: a purged payload is gone from wherever it was kept (the
// payload bucket, a file, the spool) and from the last-good index, and
// says it was purged; others stay.
func TestPurge(t *testing.T) {
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
	put := func(body string) string {
		sum, _, err := s.Put(strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	inline := put("small")
	s.InlineMax = 4
	file := put("a larger payload, kept as a file")
	s.InlineMax = staging.DefaultInlineMax
	w, _ := s.NewWriter()
	w.Write([]byte("spooled"))
	p, err := w.Finish()
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := p.Record()
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(rec.Bucket).Put(rec.Key, rec.Value) }); err != nil {
		t.Fatal(err)
	}
	keep := put("kept")
	if err := s.SetLastGood("req-1", staging.Copy{Sum: inline, FetchedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.Purge(42, []string{inline, file, p.Sum}); err != nil {
		t.Fatal(err)
	}
	for _, sum := range []string{inline, file, p.Sum} {
		_, err := s.Open(sum)
		if !errors.Is(err, auditd.ErrPurged) || !errors.Is(err, staging.ErrNotFound) || !strings.Contains(err.Error(), "event 42") {
			t.Errorf("open purged %s: %v", sum[:8], err)
		}
		if err := s.VerifyPayload(sum); !errors.Is(err, auditd.ErrPurged) {
			t.Errorf("verify purged %s: %v", sum[:8], err)
		}
	}
	if _, ok, _ := s.LastGood("req-1"); ok {
		t.Error("the last-good index still names a purged payload")
	}
	rc, err := s.Open(keep)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "kept" {
		t.Errorf("an unpurged payload reads %q", b)
	}
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
}
