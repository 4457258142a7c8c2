package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	bolt "go.etcd.io/bbolt"
)

// compactTxSize is how many bytes compact copies in one transaction.
const compactTxSize = 64 << 20

// runCompact copies the bbolt file of a stopped auditd into a new file
// without its free pages (bbolt.Compact), then puts the copy in its place
// with an atomic rename: the pages a large run's transactions left free
// go back to the disk. It refuses while another process (auditd serve)
// holds the file, and holds it itself throughout, so that none starts
// meanwhile.
func runCompact(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := newFlags("compact", "compact --data DIR", stdout, stderr)
	data := fs.String("data", "./data", "data `directory` of a stopped auditd")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	before, after, err := compactDB(*data)
	if err != nil {
		fmt.Fprintf(stderr, "auditd compact: %v\n", err)
		return 2
	}
	fmt.Fprintf(stdout, "%s: %s before, %s after (%s of free pages given back).\n",
		filepath.Join(*data, dbFile), megabytes(before), megabytes(after), megabytes(before-after))
	return 0
}

// compactDB compacts the bbolt file of data directory dir and returns its
// sizes before and after.
func compactDB(dir string) (before, after int64, err error) {
	path := filepath.Join(dir, dbFile)
	if _, err := os.Stat(path); err != nil {
		return 0, 0, err
	}
	src, err := openDB(dir, false) // an exclusive lock: serve cannot hold it
	if err != nil {
		return 0, 0, err
	}
	defer src.Close()
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, err
	}
	tmp := path + ".compact"
	if err := os.Remove(tmp); err != nil && !os.IsNotExist(err) {
		return 0, 0, err
	}
	dst, err := bolt.Open(tmp, 0o600, &bolt.Options{NoFreelistSync: src.NoFreelistSync})
	if err != nil {
		return 0, 0, fmt.Errorf("create %s: %w", tmp, err)
	}
	if err := bolt.Compact(dst, src, compactTxSize); err != nil {
		dst.Close()
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("compact %s: %w", path, err)
	}
	if err := dst.Close(); err != nil {
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	nfi, err := os.Stat(tmp)
	if err != nil {
		return 0, 0, err
	}
	// The copy takes the file's place whole or not at all; the directory
	// is synced so that the rename survives a crash.
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("replace %s: %w", path, err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return 0, 0, err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return 0, 0, fmt.Errorf("sync %s: %w", dir, err)
	}
	return fi.Size(), nfi.Size(), nil
}

// megabytes says n bytes in MB.
func megabytes(n int64) string {
	return fmt.Sprintf("%.1f MB", float64(n)/(1<<20))
}
