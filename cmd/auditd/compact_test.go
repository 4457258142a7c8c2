package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bolt "go.etcd.io/bbolt"
)

// TestCompactGivesFreePagesBack: a file most of whose pages a deleted run
// left free comes back smaller, with every key, value and bucket sequence
// it held; while another process holds the file, compact refuses and
// changes nothing.
func TestCompactGivesFreePagesBack(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, dbFile)
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	value := bytes.Repeat([]byte("x"), 1000)
	err = db.Update(func(tx *bolt.Tx) error {
		keep, err := tx.CreateBucket([]byte("keep"))
		if err != nil {
			return err
		}
		for range 7 {
			keep.NextSequence()
		}
		if err := keep.Put([]byte("a"), []byte("kept")); err != nil {
			return err
		}
		gone, err := tx.CreateBucket([]byte("gone"))
		if err != nil {
			return err
		}
		for i := range 20_000 {
			if err := gone.Put(fmt.Appendf(nil, "%08d", i), value); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		err = db.Update(func(tx *bolt.Tx) error { return tx.DeleteBucket([]byte("gone")) })
	}
	if err != nil {
		t.Fatal(err)
	}

	// Held by another opener: refused, nothing changed.
	if code, _, errOut := runCmd(t, "compact", "--data", dir); code != 2 || !strings.Contains(errOut, "holds it") {
		t.Fatalf("compact of a held file: exit %d, %q; want 2 saying another process holds it", code, errOut)
	}
	db.Close()
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	code, out, errOut := runCmd(t, "compact", "--data", dir)
	if code != 0 || !strings.Contains(out, "free pages given back") {
		t.Fatalf("compact: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() >= before.Size()/4 {
		t.Fatalf("compacted file is %d bytes, was %d: the free pages are still there", after.Size(), before.Size())
	}
	if _, err := os.Stat(path + ".compact"); !os.IsNotExist(err) {
		t.Fatalf("the copy is left beside the file: %v", err)
	}
	db, err = bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("keep"))
		if b == nil || string(b.Get([]byte("a"))) != "kept" || b.Sequence() != 7 || tx.Bucket([]byte("gone")) != nil {
			return fmt.Errorf("the compacted file does not hold what the file held")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
