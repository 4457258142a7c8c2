package staging

import (
	"path/filepath"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// openInternal opens a Store on a fresh bbolt file, closed when the test
// ends; reopen opens the Store again on the same file and payloads, as a
// restart does.
func openInternal(tb testing.TB) (db *bolt.DB, s *Store, reopen func() *Store) {
	tb.Helper()
	dir := tb.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	reopen = func() *Store {
		tb.Helper()
		s, err := Open(db, filepath.Join(dir, "payloads"))
		if err != nil {
			tb.Fatal(err)
		}
		return s
	}
	return db, reopen(), reopen
}

// finishSmallInternal stages body as a small payload and returns it unstored.
func finishSmallInternal(tb testing.TB, s *Store, body string) Payload {
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
