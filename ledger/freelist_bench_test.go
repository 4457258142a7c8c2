package ledger_test

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"slices"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// BenchmarkFreelistHeap is the heap in use (after a GC) once a quarter of
// b.N events and once all of them are appended, in commits of 500, each
// followed by a commit of 100 puts under random keys (as a run's items
// end: five events and one last-good copy an item, which staging's
// compaction puts in an index keyed by hashes), with the options auditd
// opens its file with and with each freelist setting bbolt offers. The
// random puts rewrite pages and free the old ones; the ledger's appends
// take free pages and never free them, and bbolt's freelist keeps an entry
// (shared.allocs, in either freelist type) for each page it allocated
// from the free pages until that page is freed again. Run with
// -benchtime 2000000x (docs/bench/fetch.md).
func BenchmarkFreelistHeap(b *testing.B) {
	for _, tc := range []struct {
		name string
		set  func(*bolt.Options)
	}{
		{"array", func(*bolt.Options) {}},
		{"hashmap", func(o *bolt.Options) { o.FreelistType = bolt.FreelistMapType }},
		{"array-nosync", func(o *bolt.Options) { o.NoFreelistSync = true }},
		{"hashmap-nosync", func(o *bolt.Options) { o.FreelistType, o.NoFreelistSync = bolt.FreelistMapType, true }},
		// Not an option of a file: its page size is chosen when it is made.
		{"array-16KiB-pages", func(o *bolt.Options) { o.PageSize = 16 << 10 }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			opts := ledger.BoltOptions(false)
			tc.set(opts)
			db, err := bolt.Open(filepath.Join(b.TempDir(), "auditd.db"), 0o600, opts)
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			db.NoSync = true // the heap, not the disk
			l := MustOpen(b, db, ledger.Options{})
			const group, random = 500, 100
			events := make([]auditd.Event, group)
			rng := rand.New(rand.NewPCG(1, 2))
			keys := make([][]byte, random)
			quarter := 0.0
			b.ResetTimer()
			for done := 0; done < b.N; done += group {
				for i := range events {
					events[i] = sampleEvent("01JBENCHRUN", done+i)
				}
				f, err := l.Add(events)
				if err == nil {
					err = f.Wait(context.Background())
				}
				if err != nil {
					b.Fatal(err)
				}
				for i := range keys {
					keys[i] = fmt.Appendf(keys[i][:0], "%016x%016x%016x%016x", rng.Uint64(), rng.Uint64(), rng.Uint64(), rng.Uint64())
				}
				slices.SortFunc(keys, bytes.Compare)
				if err := db.Update(func(tx *bolt.Tx) error {
					index, err := tx.CreateBucketIfNotExists([]byte("bench.index"))
					for _, k := range keys {
						if err == nil {
							err = index.Put(k, k[:40])
						}
					}
					return err
				}); err != nil {
					b.Fatal(err)
				}
				if quarter == 0 && done+group >= b.N/4 {
					quarter = heapInUse()
				}
			}
			b.StopTimer()
			b.ReportMetric(quarter, "MB-heap-quarter")
			b.ReportMetric(heapInUse(), "MB-heap-end")
			b.ReportMetric(float64(db.Stats().FreePageN+db.Stats().PendingPageN), "free-pages")
		})
	}
}

// heapInUse is the heap in use after a GC, in MB.
func heapInUse() float64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return float64(m.HeapInuse) / (1 << 20)
}
