package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// mustLedgerDir writes n events, one commit group each, into a fresh data
// directory and returns it with the checkpoint signed at the end.
func mustLedgerDir(tb testing.TB, n int) (dir string, checkpoint []byte) {
	tb.Helper()
	dir = tb.TempDir()
	db, err := openDB(dir, false)
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	// A checkpoint in the history per group: a keyless rewrite is then
	// placed to the exact event.
	l, err := ledger.Open(db, ledger.Options{CheckpointEvery: 1})
	if err != nil {
		tb.Fatal(err)
	}
	for i := range n {
		e := auditd.Event{Type: auditd.EventDispatch, RunID: "run", ItemKey: fmt.Sprint("item-", i), Attempt: 1, Method: "GET", Path: "/query?page=" + strconv.Itoa(i)}
		if _, err := l.Append(context.Background(), e); err != nil {
			tb.Fatal(err)
		}
	}
	if checkpoint, err = l.Checkpoint(); err != nil {
		tb.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return dir, checkpoint
}

// tamper edits the bbolt file of dir directly, as someone with the file but
// not the key could.
func tamper(tb testing.TB, dir string, fn func(tx *bolt.Tx) error) {
	tb.Helper()
	db, err := bolt.Open(filepath.Join(dir, dbFile), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := db.Update(fn); err != nil {
		tb.Fatal(err)
	}
}

func key(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// deleteKeys deletes the entries under seqs. These ledgers are appended
// one event at a time, so every event has an entry of its own; one inside
// a block (see ledger/events.go) would not be found, and the test fails.
func deleteKeys(bucket string, seqs ...uint64) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		for _, s := range seqs {
			if bucket == "ledger.events" && tx.Bucket([]byte(bucket)).Get(key(s)) == nil {
				return fmt.Errorf("event %d has no entry of its own", s)
			}
			if err := tx.Bucket([]byte(bucket)).Delete(key(s)); err != nil {
				return err
			}
		}
		return nil
	}
}

func editValue(seq uint64, edit func(v []byte) []byte) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("ledger.events"))
		return b.Put(key(seq), edit(bytes.Clone(b.Get(key(seq)))))
	}
}

// rewrite changes event seq's path and re-hashes the chain and the Merkle
// tree from there to the head, exactly as the formats in ledger/doc.go say:
// everything but the signatures is consistent afterwards.
func rewrite(seq uint64) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		events, tree := tx.Bucket([]byte("ledger.events")), tx.Bucket([]byte("ledger.tree"))
		reader := tlog.HashReaderFunc(func(indexes []int64) ([]tlog.Hash, error) {
			out := make([]tlog.Hash, len(indexes))
			for i, index := range indexes {
				level, m := tlog.SplitStoredHashIndex(index)
				v := tree.Get(key(uint64(m+1)<<level - 1 + 1))
				copy(out[i][:], v[level*tlog.HashSize:])
			}
			return out, nil
		})
		prev := events.Get(key(seq))[:32]
		c := events.Cursor()
		for k, v := c.Seek(key(seq)); k != nil; k, v = c.Next() {
			s := binary.BigEndian.Uint64(k)
			var e auditd.Event
			if err := ledger.UnmarshalCanonical(v[32:len(v)-32], &e); err != nil {
				return err
			}
			if s == seq {
				e.Path = "/query?page=forged"
			}
			val := ledger.MarshalCanonical(bytes.Clone(prev), &e)
			h := sha256.Sum256(val)
			val = append(val, h[:]...)
			hashes, err := tlog.StoredHashes(int64(s-1), val[32:len(val)-32], reader)
			if err != nil {
				return err
			}
			var packed []byte
			for _, th := range hashes {
				packed = append(packed, th[:]...)
			}
			if err := tree.Put(k, packed); err != nil {
				return err
			}
			if err := events.Put(bytes.Clone(k), val); err != nil {
				return err
			}
			prev = h[:]
		}
		return nil
	}
}

// truncate cuts the ledger after seq and removes every later checkpoint,
// putting back the one signed at seq as the latest.
func truncate(seq, head uint64) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		var later []uint64
		for s := seq + 1; s <= head; s++ {
			later = append(later, s)
		}
		for _, b := range []string{"ledger.events", "ledger.tree", "ledger.checkpoints"} {
			if err := deleteKeys(b, later...)(tx); err != nil {
				return err
			}
		}
		cp := bytes.Clone(tx.Bucket([]byte("ledger.checkpoints")).Get(key(seq)))
		return tx.Bucket([]byte("ledger.meta")).Put([]byte("checkpoint"), cp)
	}
}

// truncateAll is truncate, the run index cut to match too.
func truncateAll(seq, head uint64) func(*bolt.Tx) error {
	return func(tx *bolt.Tx) error {
		if err := truncate(seq, head)(tx); err != nil {
			return err
		}
		b := tx.Bucket([]byte("ledger.runs"))
		for s := seq + 1; s <= head; s++ {
			k := append(binary.AppendUvarint(nil, uint64(len("run"))), "run"...)
			if err := b.Delete(binary.BigEndian.AppendUint64(k, s)); err != nil {
				return err
			}
		}
		return nil
	}
}

var firstBadRE = regexp.MustCompile(`first bad sequence (\d+)`)

func TestVerifyTamperMatrix(t *testing.T) {
	const head = 10
	for _, tc := range []struct {
		name         string
		tamper       func(*bolt.Tx) error
		trusted      bool
		wantFirstBad uint64 // 0: the chain holds
		wantFinding  string // with wantFirstBad 0: verify passes when empty
	}{
		{"Intact", func(*bolt.Tx) error { return nil }, true, 0, ""},
		{"EditedEvent", editValue(5, func(v []byte) []byte { v[len(v)-40] ^= 0x01; return v }), false, 5, ""},
		{"RewrittenAndRehashedWithoutKey", rewrite(5), false, 5, ""},
		{"DeletedEvent", deleteKeys("ledger.events", 5), false, 5, ""},
		{"TwoConsecutiveDeleted", deleteKeys("ledger.events", 5, 6), false, 5, ""},
		{"BytesAppendedToValue", editValue(7, func(v []byte) []byte { return append(v, 0) }), false, 7, ""},
		{"DeletedLastEvent", deleteKeys("ledger.events", head), false, head, ""},
		{"EditedTreeHash", func(tx *bolt.Tx) error {
			b := tx.Bucket([]byte("ledger.tree"))
			v := bytes.Clone(b.Get(key(4)))
			v[0] ^= 1
			return b.Put(key(4), v)
		}, false, 4, ""},
		// The run index still lists the events cut off.
		{"TruncatedTailUntrusted", truncate(7, head), false, 0, "lists event 8 under run \"run\", past the ledger's last event 7"},
		// Self-consistent once the later checkpoints and index entries are
		// gone too: only a checkpoint kept elsewhere shows what is missing.
		{"TruncatedTailAndIndexUntrusted", truncateAll(7, head), false, 0, ""},
		{"TruncatedTailTrusted", truncate(7, head), true, 8, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, checkpoint := mustLedgerDir(t, head)
			tamper(t, dir, tc.tamper)
			args := []string{"verify", "--data", dir}
			if tc.trusted {
				path := filepath.Join(t.TempDir(), "checkpoint.txt")
				if err := os.WriteFile(path, checkpoint, 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--trusted-checkpoint", path)
			}
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), args, &stdout, &stderr)
			t.Logf("exit %d: %s", code, stdout.String())
			if tc.wantFirstBad == 0 && tc.wantFinding != "" {
				if code != 1 || !strings.Contains(stdout.String(), tc.wantFinding) {
					t.Fatalf("exit %d, want 1 naming %q\n%s%s", code, tc.wantFinding, stdout.String(), stderr.String())
				}
				return
			}
			if tc.wantFirstBad == 0 {
				if code != 0 {
					t.Fatalf("exit %d, want 0\n%s%s", code, stdout.String(), stderr.String())
				}
				return
			}
			m := firstBadRE.FindStringSubmatch(stdout.String())
			if code != 1 || m == nil || m[1] != strconv.FormatUint(tc.wantFirstBad, 10) {
				t.Fatalf("exit %d, want 1 naming sequence %d\nstdout: %sstderr: %s", code, tc.wantFirstBad, stdout.String(), stderr.String())
			}
		})
	}
}

func TestVerifyFailsFastWhenFileHeld(t *testing.T) {
	dir, _ := mustLedgerDir(t, 1)
	db, err := openDB(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), []string{"verify", "--data", dir}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d with the file held, want 2", code)
	}
	if !bytes.Contains(stderr.Bytes(), []byte("another process")) {
		t.Fatalf("stderr %q does not say the file is held", stderr.String())
	}
}

// A file another process holds (a running serve, writing) is reported
// held, not checked: read without the lock, the page check would meet
// pages the writer is reusing and could call a healthy file damaged. Here
// the held file is damaged, so a check that ran regardless would say so.
func TestVerifyHeldFileIsNotChecked(t *testing.T) {
	dir, _ := damageDir(t)
	path := filepath.Join(dir, dbFile)
	clean, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for v := 0; v < damageVariants && !found; v++ {
		bad, _ := damage(bytes.Clone(clean), v)
		if err := os.WriteFile(path, bad, 0o600); err != nil {
			t.Fatal(err)
		}
		found = errors.Is(ledger.CheckFile(path), ledger.ErrDamaged)
	}
	if !found {
		t.Fatal("no damage variant the page check finds")
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), []string{"verify", "--data", dir}, &stdout, &stderr)
	if code != 2 || !bytes.Contains(stderr.Bytes(), []byte("another process")) {
		t.Fatalf("verify of a held file: exit %d, stdout %q, stderr %q; want 2, held", code, stdout.String(), stderr.String())
	}
}

func TestVerifyUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"NoDataDir", []string{"verify", "--data", filepath.Join(t.TempDir(), "none")}},
		{"MissingTrustedFile", []string{"verify", "--trusted-checkpoint", filepath.Join(t.TempDir(), "none")}},
		{"StrayArgument", []string{"verify", "extra"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := run(context.Background(), tc.args, &stdout, &stderr); code != 2 || stderr.Len() == 0 {
				t.Fatalf("exit %d stderr %q, want 2 with a message", code, stderr.String())
			}
		})
	}
}
