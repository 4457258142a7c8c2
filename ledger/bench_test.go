package ledger_test

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// benchAppenders is how many goroutines BenchmarkAppendParallel runs, on any
// number of CPUs. An appender waits for its group to be durable before it
// appends again, so the appenders split into cohorts that take turns: about
// half of them wait at each commit. 2,048 appenders give groups of about the
// 1,000 records of BenchmarkRawBoltPut1000's transactions; the benchmark
// reports the mean it got as events/group.
const benchAppenders = 2048

// BenchmarkAppendParallel is durable append throughput with benchAppenders
// concurrent appenders sharing fsyncs through group commit. It keeps a
// history checkpoint for every group (one more put per group than the
// default) to count the groups.
func BenchmarkAppendParallel(b *testing.B) {
	db := MustOpenDB(b)
	l := MustOpen(b, db, ledger.Options{CheckpointEvery: 1})
	e := sampleEvent("01JBENCHRUN", 1)
	b.SetParallelism((benchAppenders + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(context.Background(), e); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
	b.StopTimer()
	var groups int
	err := db.View(func(tx *bolt.Tx) error {
		groups = tx.Bucket([]byte("ledger.checkpoints")).Stats().KeyN - 1 // less the empty tree's
		return nil
	})
	if err != nil || groups <= 0 {
		b.Fatalf("counting commit groups: %d, %v", groups, err)
	}
	b.ReportMetric(float64(b.N)/float64(groups), "events/group")
}

// BenchmarkRawBoltPut1000 is the baseline for BenchmarkAppendParallel: the
// same record bytes put with plain bbolt, 1,000 records per fsynced
// transaction, no hashing, no tree, no index, no signature. The record is
// the ledger's for a mid-run event: a three-byte Seq and Mono set, as
// AppendParallel's are.
func BenchmarkRawBoltPut1000(b *testing.B) {
	db := MustOpenDB(b)
	e := sampleEvent("01JBENCHRUN", 1)
	e.Seq, e.Time, e.Mono = 1<<20, time.Now(), 2*time.Second
	rec := append(make([]byte, 32), ledger.MarshalCanonical(nil, &e)...)
	rec = append(rec, make([]byte, 32)...)
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("raw")); return err }); err != nil {
		b.Fatal(err)
	}
	var seq uint64
	b.ResetTimer()
	start := time.Now()
	for done := 0; done < b.N; {
		n := min(1000, b.N-done)
		err := db.Update(func(tx *bolt.Tx) error {
			bk := tx.Bucket([]byte("raw"))
			bk.FillPercent = 1.0
			for range n {
				seq++
				if err := bk.Put(seqKeyBench(seq), rec); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		done += n
	}
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "events/s")
}

func seqKeyBench(seq uint64) []byte {
	return []byte{byte(seq >> 56), byte(seq >> 48), byte(seq >> 40), byte(seq >> 32), byte(seq >> 24), byte(seq >> 16), byte(seq >> 8), byte(seq)}
}

// BenchmarkAppendLatency is one appender waiting for each event to be
// durable; p50 and p99 are over the iterations of the run.
func BenchmarkAppendLatency(b *testing.B) {
	l := MustOpen(b, MustOpenDB(b), ledger.Options{})
	e := sampleEvent("01JBENCHRUN", 1)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		if _, err := l.Append(context.Background(), e); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2])/1e6, "p50-ms")
	b.ReportMetric(float64(lat[len(lat)*99/100])/1e6, "p99-ms")
}

// fixtureEvents is the size of the shared read and verify fixture.
const fixtureEvents = 1_000_000

// millionFixture is a ledger of fixtureEvents events, built once per test
// binary run (benchmarks with -count=N share it) and removed by TestMain.
var millionFixture struct {
	once sync.Once
	dir  string
	key  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if millionFixture.dir != "" {
		os.RemoveAll(millionFixture.dir)
	}
	os.Exit(code)
}

// openMillion returns the fixture's db, opened read-only for this benchmark.
func openMillion(b *testing.B) (*bolt.DB, string) {
	b.Helper()
	f := &millionFixture
	f.once.Do(func() {
		if f.dir, f.err = os.MkdirTemp("", "ledger-bench-"); f.err != nil {
			return
		}
		db, err := bolt.Open(filepath.Join(f.dir, "auditd.db"), 0o600, nil)
		if err != nil {
			f.err = err
			return
		}
		defer db.Close()
		l, err := ledger.Open(db, ledger.Options{})
		if err != nil {
			f.err = err
			return
		}
		defer l.Close(context.Background())
		f.key = l.PublicKey()
		batch := make([]auditd.Event, 10_000)
		for done := 0; done < fixtureEvents; done += len(batch) {
			for i := range batch {
				batch[i] = sampleEvent("01JBENCHRUN"+string(rune('A'+i%8)), done+i)
			}
			if _, f.err = l.AppendBatch(context.Background(), batch); f.err != nil {
				return
			}
		}
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	db, err := bolt.Open(filepath.Join(f.dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db, f.key
}

// BenchmarkVerify1M is a full Verify of a 1M-event ledger, warm (the file
// is in the page cache after the first iteration).
func BenchmarkVerify1M(b *testing.B) {
	db, key := openMillion(b)
	b.ResetTimer()
	for b.Loop() {
		r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: key})
		if err != nil || !r.OK || r.Events != fixtureEvents {
			b.Fatalf("Verify = %+v, %v", r, err)
		}
	}
	b.ReportMetric(float64(fixtureEvents)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkScan1M reads and decodes every event of a 1M-event ledger in
// order.
func BenchmarkScan1M(b *testing.B) {
	db, _ := openMillion(b)
	r := ledger.NewReader(db)
	b.ResetTimer()
	for b.Loop() {
		n := 0
		err := r.Scan(0, 0, func(e *auditd.Event) error { n++; return nil })
		if err != nil || n != fixtureEvents {
			b.Fatalf("scanned %d events: %v", n, err)
		}
	}
	b.ReportMetric(float64(fixtureEvents)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkScanRaw1M is the anchor of BenchmarkScan1M: a bare bbolt cursor
// over the same events bucket in the same chunked read transactions,
// touching every stored value (a block of records is one) and decoding
// nothing. The gap between the two is what decoding costs.
func BenchmarkScanRaw1M(b *testing.B) {
	db, _ := openMillion(b)
	b.ResetTimer()
	for b.Loop() {
		var sum, vals int
		var after []byte
		for done := false; !done; {
			err := db.View(func(tx *bolt.Tx) error {
				c := tx.Bucket([]byte("ledger.events")).Cursor()
				k, v := c.First()
				if after != nil {
					if k, v = c.Seek(after); k != nil && string(k) == string(after) {
						k, v = c.Next()
					}
				}
				for n := 0; ; k, v = c.Next() {
					if k == nil {
						done = true
						return nil
					}
					sum += len(v) + int(v[len(v)-1])
					vals++
					if n++; n == 4096 {
						after = slices.Clone(k)
						return nil
					}
				}
			})
			if err != nil {
				b.Fatal(err)
			}
		}
		if vals == 0 || sum == 0 {
			b.Fatalf("read %d values", vals)
		}
	}
	b.ReportMetric(float64(fixtureEvents)*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
