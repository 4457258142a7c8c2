package ledger_test

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// appendGroups appends sizes[i] events in one commit group each, their run
// ids cycling through runs, and returns the seqs of each run.
func appendGroups(tb testing.TB, l *ledger.Ledger, runs []string, sizes ...int) map[string][]uint64 {
	tb.Helper()
	want := map[string][]uint64{}
	i := 0
	for _, n := range sizes {
		batch := make([]auditd.Event, n)
		for j := range batch {
			batch[j] = sampleEvent(runs[i%len(runs)], i)
			i++
		}
		out, err := l.AppendBatch(context.Background(), batch)
		if err != nil {
			tb.Fatal(err)
		}
		for _, e := range out {
			want[e.RunID] = append(want[e.RunID], e.Seq)
		}
	}
	return want
}

// A commit group shares tree entries (of up to 8 leaves) and run index
// entries among its events; every event must still prove, scan and verify.
func TestGroupSharesEntries(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	// Groups that start and end on 8-leaf boundaries and off them.
	want := appendGroups(t, l, []string{"run1", "run10", ""}, 1, 70, 5, 33)
	head, _ := l.Head()
	if head != 109 {
		t.Fatalf("head %d, want 109", head)
	}
	mustVerify(t, db, l.PublicKey(), nil)

	t.Run("Prove", func(t *testing.T) {
		for seq := uint64(1); seq <= head; seq++ {
			p, err := l.Prove(seq)
			if err != nil {
				t.Fatalf("prove %d: %v", seq, err)
			}
			if e, _, err := p.Verify(l.PublicKey()); err != nil || e.Seq != seq {
				t.Fatalf("proof of %d: event %d, %v", seq, e.Seq, err)
			}
		}
	})
	t.Run("ScanRun", func(t *testing.T) {
		for _, run := range []string{"run1", "run10"} {
			for _, after := range []uint64{0, 1, 2, 40, 71, 72, 76, 108, 109} {
				var got, exp []uint64
				for _, s := range want[run] {
					if s > after {
						exp = append(exp, s)
					}
				}
				err := l.ScanRun(run, after, func(e *auditd.Event) error {
					if e.RunID != run {
						t.Errorf("event %d of run %q in scan of %q", e.Seq, e.RunID, run)
					}
					got = append(got, e.Seq)
					return nil
				})
				if err != nil || !reflect.DeepEqual(got, exp) {
					t.Fatalf("ScanRun(%q, %d) = %v, %v; want %v", run, after, got, err, exp)
				}
			}
		}
	})
}

// An edited hash in the middle of a shared tree entry is pinned on the
// event whose hashes it is.
func TestVerifyNamesEventInSharedTreeEntry(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	appendGroups(t, l, []string{"r"}, 70)
	key := l.PublicKey()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []uint64{57, 60, 64} {
		t.Run(fmt.Sprint(bad), func(t *testing.T) {
			// Events 57 to 64 share the entry under 64; event bad is leaf bad-1.
			at := (tlog.StoredHashCount(int64(bad-1)) - tlog.StoredHashCount(56)) * tlog.HashSize
			flip := func(tx *bolt.Tx) error {
				b := tx.Bucket([]byte("ledger.tree"))
				k := []byte{0, 0, 0, 0, 0, 0, 0, 64}
				v := append([]byte(nil), b.Get(k)...)
				v[at] ^= 1
				return b.Put(k, v)
			}
			if err := db.Update(flip); err != nil {
				t.Fatal(err)
			}
			defer db.Update(flip) // flip it back for the next case
			r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: key})
			if err != nil || r.OK || r.FirstBad != bad {
				t.Fatalf("Verify = %+v, %v; want first bad %d", r, err, bad)
			}
		})
	}
}

// Appenders racing with the same idempotency key, while other groups are
// being prepared and committed, all get the one event stored.
func TestIdempotencyAcrossGroups(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	const workers = 32
	got := make([]auditd.Event, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range 20 {
				e := sampleEvent("r", i)
				e.IdempotencyKey = fmt.Sprint("key-", i)
				out, err := l.Append(context.Background(), e)
				if err != nil {
					t.Error(err)
					return
				}
				if i == 19 {
					got[w] = out
				}
			}
		})
	}
	wg.Wait()
	for w := range got {
		if got[w].Seq == 0 || got[w] != got[0] {
			t.Fatalf("appender %d got event %d, appender 0 got %d", w, got[w].Seq, got[0].Seq)
		}
	}
	if head, _ := l.Head(); head != 20 {
		t.Fatalf("head %d, want 20: one event per key", head)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// A group whose transaction fails fails its appenders, and the group
// prepared behind it; the ledger goes on from the last committed event.
func TestFailedGroupLeavesNoGap(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	// bbolt refuses keys over 32 KiB: this one fails its transaction.
	bad := sampleEvent("r", 0)
	bad.IdempotencyKey = strings.Repeat("k", bolt.MaxKeySize+1)

	var mu sync.Mutex
	acked := map[uint64]auditd.Event{}
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			for i := range 20 {
				e := sampleEvent("r", i)
				if w == 0 && i%5 == 4 {
					e = bad
				}
				out, err := l.Append(context.Background(), e)
				if e.IdempotencyKey != "" && err == nil {
					t.Errorf("append of the bad event succeeded")
				}
				if err == nil {
					mu.Lock()
					acked[out.Seq] = out
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	head, _ := l.Head()
	t.Logf("%d of 316 good events acknowledged", len(acked))
	if int(head) != len(acked) {
		t.Fatalf("head %d, %d events acknowledged", head, len(acked))
	}
	for seq := uint64(1); seq <= head; seq++ {
		stored, err := l.Event(seq)
		if err != nil || stored != acked[seq] {
			t.Fatalf("event %d: stored %+v, %v; acknowledged %+v", seq, stored, err, acked[seq])
		}
	}
	mustVerify(t, db, l.PublicKey(), nil)
	if _, err := l.Append(context.Background(), sampleEvent("r", 99)); err != nil {
		t.Fatal(err)
	}
}
