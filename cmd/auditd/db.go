package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// dbFile is the bbolt file inside the data directory, and payloadsDir the
// directory of the staged payloads too large to keep in it.
const (
	dbFile      = "auditd.db"
	payloadsDir = "payloads"
)

// errHeld means another process holds the bbolt file.
var errHeld = errors.New("another process (a running auditd serve?) holds it; stop it or use its API")

// checkFile runs ledger.CheckFile on path while holding a shared lock on
// it, as bbolt's readers do: a writer (auditd serve) holding the file is
// errHeld, not a check that reads pages the writer is reusing and calls a
// healthy file damaged. A file that does not exist passes.
func checkFile(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	} else if err != nil {
		return err
	}
	defer f.Close() // and with it the lock
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB); errors.Is(err, syscall.EWOULDBLOCK) {
		return fmt.Errorf("open %s: %w", path, errHeld)
	} else if err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	if err := ledger.CheckFile(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// openDB opens (creating if needed) the one bbolt file of a data directory.
// Another process holding the file makes it fail within a second instead of
// hanging. readOnly opens it shared, for offline commands.
func openDB(dir string, readOnly bool) (*bolt.DB, error) {
	if !readOnly {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("create data directory: %w", err)
		}
	}
	path := filepath.Join(dir, dbFile)
	if readOnly {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
	}
	db, err := bolt.Open(path, 0o600, ledger.BoltOptions(readOnly))
	if errors.Is(err, berrors.ErrTimeout) {
		return nil, fmt.Errorf("open %s: %w", path, errHeld)
	} else if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return db, nil
}
