package pack_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
)

const benchRun = "01JBENCH0RUN00000000000000"

// The benchmark run: 90,000 items of 4 pages, every 50th request first
// throttled (a 429, a wait, a retry), as reports' 1M-event run: about a
// million events in a real bbolt ledger, written once.
const (
	benchItems    = 90_000
	benchPages    = 4
	benchThrottle = 50
)

var benchLedger struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if benchLedger.dir != "" {
		os.RemoveAll(benchLedger.dir)
	}
	os.Exit(code)
}

// itemEvents are the events of item i, in order.
func itemEvents(i int) []auditd.Event {
	key, src := fmt.Sprintf("item-%07d", i), "src-"+string(rune('a'+i%4))
	var evs []auditd.Event
	for p := range uint32(benchPages) {
		path := fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%%3D1&outFields=*&resultOffset=%d&f=json", p*1000)
		d := auditd.Event{Type: auditd.EventDispatch, RunID: benchRun, SourceID: src, ItemKey: key, Page: p, Attempt: 1, Method: "GET", Path: path}
		evs = append(evs, d)
		if (i*benchPages+int(p))%benchThrottle == 1 {
			evs = append(evs,
				auditd.Event{Type: auditd.EventThrottle, RunID: benchRun, SourceID: src, ItemKey: key, Page: p, Attempt: 1, Status: 429, RetryAfterRaw: "0"},
				auditd.Event{Type: auditd.EventWait, RunID: benchRun, SourceID: src, ItemKey: key, Page: p, Attempt: 2, Gate: "pause"})
			d.Attempt = 2
			evs = append(evs, d)
		}
		evs = append(evs, auditd.Event{Type: auditd.EventResponse, RunID: benchRun, SourceID: src, ItemKey: key, Page: p, Attempt: d.Attempt,
			Status: 200, Bytes: 48_000, Latency: 80 * time.Millisecond, Outcome: auditd.OutcomeSuccess})
	}
	return append(evs,
		auditd.Event{Type: auditd.EventPayloadStaged, RunID: benchRun, SourceID: src, ItemKey: key, PayloadHash: strings.Repeat("ab", 32), Bytes: 192_000},
		auditd.Event{Type: auditd.EventItemFinished, RunID: benchRun, SourceID: src, ItemKey: key, Outcome: auditd.ItemSucceeded})
}

// openBenchLedger returns the million-event ledger, read-only, and its key.
func openBenchLedger(b *testing.B) (*bolt.DB, string) {
	b.Helper()
	f := &benchLedger
	f.once.Do(func() {
		if f.dir, f.err = os.MkdirTemp("", "pack-bench-"); f.err != nil {
			return
		}
		f.err = writeBenchLedger(f.dir)
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	db, err := bolt.Open(filepath.Join(f.dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	key, err := ledger.ReadPublicKey(f.dir)
	if err != nil {
		b.Fatal(err)
	}
	return db, key
}

// writeBenchLedger appends the run with Append from many goroutines, each
// its own items in order, so that commit groups fill as the fetch loop's
// do.
func writeBenchLedger(dir string) error {
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{NoSync: true, InitialMmapSize: 1 << 30})
	if err != nil {
		return err
	}
	defer db.Close()
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clock.NewFake(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC))})
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	app := func(e auditd.Event) error { _, err := l.Append(ctx, e); return err }
	if err := app(auditd.Event{Type: auditd.EventRunStarted, RunID: benchRun, Detail: `{"name":"bench","award":{"fain":"F-BENCH"}}`}); err != nil {
		return err
	}
	for i := range benchItems {
		if err := app(auditd.Event{Type: auditd.EventItemQueued, RunID: benchRun, SourceID: "src-" + string(rune('a'+i%4)), ItemKey: fmt.Sprintf("item-%07d", i), Method: "GET", Path: "/q"}); err != nil {
			return err
		}
	}
	const workers = 256
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := w; i < benchItems; i += workers {
				for _, e := range itemEvents(i) {
					if err := app(e); err != nil {
						errs <- err
						return
					}
				}
			}
			errs <- nil
		}()
	}
	for range workers {
		if err := <-errs; err != nil {
			return err
		}
	}
	return app(auditd.Event{Type: auditd.EventRunFinished, RunID: benchRun, Outcome: auditd.Outcome(auditd.RunSucceeded)})
}

func benchExporter(db *bolt.DB) *reports.Exporter {
	r := reports.NewReconciler(ledger.NewReader(db))
	var buf []byte
	r.Hash = func(prev [32]byte, e *auditd.Event) (h [32]byte) {
		h, buf = ledger.HashEvent(buf, prev, e)
		return h
	}
	return reports.NewExporter(r)
}

var benchRequest = reports.Request{ExportID: "bench", RunIDs: []string{benchRun}, Filters: "run " + benchRun}

// BenchmarkPack1M builds the evidence pack of a run of about a million
// events from a real bbolt ledger ("pack") next to the plain evidence
// workbook export of the same run ("workbook"), each to a file; the
// target is pack <= 2x workbook.
func BenchmarkPack1M(b *testing.B) {
	b.Run("workbook", func(b *testing.B) {
		db, _ := openBenchLedger(b)
		x := benchExporter(db)
		for b.Loop() {
			f := benchOut(b)
			m, err := x.Export(context.Background(), f, benchRequest)
			if err != nil {
				b.Fatal(err)
			}
			reportSize(b, f)
			b.ReportMetric(float64(m.Reports[0].Counts.Events), "events/op")
		}
	})
	b.Run("pack", func(b *testing.B) {
		db, key := openBenchLedger(b)
		bl := &pack.Builder{Ledger: ledger.NewReader(db), PublicKey: key, Exporter: benchExporter(db), TmpDir: b.TempDir()}
		for b.Loop() {
			f := benchOut(b)
			m, err := bl.Build(context.Background(), f, pack.Request{Request: benchRequest})
			if err != nil {
				b.Fatal(err)
			}
			reportSize(b, f)
			b.ReportMetric(float64(m.Leaves), "events/op")
		}
	})
}

// BenchmarkVerifyPack1M verifies that pack (built once, warm in the page
// cache): every leaf, the range proof and every row of the workbook's
// event sheets. Target: under 10 s.
func BenchmarkVerifyPack1M(b *testing.B) {
	db, key := openBenchLedger(b)
	path := filepath.Join(b.TempDir(), "pack.zip")
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	bl := &pack.Builder{Ledger: ledger.NewReader(db), PublicKey: key, Exporter: benchExporter(db), TmpDir: b.TempDir()}
	if _, err := bl.Build(context.Background(), f, pack.Request{Request: benchRequest}); err != nil {
		b.Fatal(err)
	}
	f.Close()
	for b.Loop() {
		p, c, err := pack.OpenFile(path)
		if err != nil {
			b.Fatal(err)
		}
		r, err := pack.Verify(p, pack.Options{Key: key})
		c.Close()
		if err != nil || !r.OK {
			b.Fatalf("verify: %v %+v", err, r)
		}
		b.ReportMetric(float64(r.Rows[reports.SheetDispatches]), "rows/op")
	}
}

func benchOut(b *testing.B) *os.File {
	f, err := os.CreateTemp(b.TempDir(), "out-*")
	if err != nil {
		b.Fatal(err)
	}
	return f
}

func reportSize(b *testing.B, f *os.File) {
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	f.Close()
	b.ReportMetric(float64(fi.Size()), "file-bytes")
}

// TestPackPeakRSS builds the 1M-event run's pack once and reports the
// process's peak RSS (VmHWM) after the build, then verifies it. Run it by
// hand, the ledger written first by a process of its own (writing it
// costs memory of its own):
//
//	go test -c -o /tmp/pack.test ./pack/
//	AUDITD_RSS=1 AUDITD_RSS_DIR=/tmp/packbench AUDITD_RSS_WRITE=1 /tmp/pack.test -test.run TestPackPeakRSS
//	AUDITD_RSS=1 AUDITD_RSS_DIR=/tmp/packbench AUDITD_RSS_OUT=/tmp/packbench/pack.zip /tmp/pack.test -test.run TestPackPeakRSS -test.v
func TestPackPeakRSS(t *testing.T) {
	if os.Getenv("AUDITD_RSS") == "" {
		t.Skip("set AUDITD_RSS=1 to measure the pack, AUDITD_RSS=workbook the plain export (takes a minute)")
	}
	dir := os.Getenv("AUDITD_RSS_DIR")
	if dir == "" {
		t.Skip("set AUDITD_RSS_DIR to a directory holding the bench ledger (AUDITD_RSS_WRITE=1 writes it)")
	}
	if os.Getenv("AUDITD_RSS_WRITE") != "" {
		if err := writeBenchLedger(dir); err != nil {
			t.Fatal(err)
		}
		return
	}
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key, err := ledger.ReadPublicKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "pack.zip")
	if keep := os.Getenv("AUDITD_RSS_OUT"); keep != "" {
		out = keep // kept for auditd verify --pack
	}
	f, err := os.Create(out)
	if err != nil {
		t.Fatal(err)
	}
	peakAnon := sampleRssAnon()
	start := time.Now()
	if os.Getenv("AUDITD_RSS") == "workbook" {
		// The plain workbook export of the same run, for comparison.
		if _, err := benchExporter(db).Export(context.Background(), f, benchRequest); err != nil {
			t.Fatal(err)
		}
		f.Close()
		t.Logf("workbook exported in %s, peak RSS (VmHWM) %s, peak anonymous RSS %d kB (the rest is the ledger file's mapped pages)",
			time.Since(start).Round(time.Millisecond), vmHWM(t), peakAnon())
		return
	}
	bl := &pack.Builder{Ledger: ledger.NewReader(db), PublicKey: key, Exporter: benchExporter(db), TmpDir: t.TempDir()}
	m, err := bl.Build(context.Background(), f, pack.Request{Request: benchRequest})
	if err != nil {
		t.Fatal(err)
	}
	f.Close()
	built := time.Since(start)
	hwm, anon := vmHWM(t), peakAnon()
	db.Close() // unmap the ledger: verifying needs the pack alone
	p, c, err := pack.OpenFile(out)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start = time.Now()
	r, err := pack.Verify(p, pack.Options{Key: key})
	if err != nil || !r.OK {
		t.Fatalf("verify: %v %+v", err, r)
	}
	fi, _ := os.Stat(out)
	t.Logf("pack of %d leaves, %d bytes, built in %s, peak RSS after the build (VmHWM) %s, peak anonymous RSS %d kB (the rest is the ledger file's mapped pages); verified in %s",
		m.Leaves, fi.Size(), built.Round(time.Millisecond), hwm, anon, time.Since(start).Round(time.Millisecond))
}

// sampleRssAnon samples the process's anonymous RSS every 20 ms until the
// returned function is called, which returns the largest seen, in kB.
func sampleRssAnon() func() int64 {
	var (
		mu   sync.Mutex
		peak int64
		stop = make(chan struct{})
	)
	read := func() {
		b, _ := os.ReadFile("/proc/self/status")
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "RssAnon:"); ok {
				var kb int64
				fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
				mu.Lock()
				peak = max(peak, kb)
				mu.Unlock()
			}
		}
	}
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				read()
			}
		}
	}()
	return func() int64 {
		close(stop)
		read()
		mu.Lock()
		defer mu.Unlock()
		return peak
	}
}

func vmHWM(t *testing.T) string {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			return strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	return "?"
}
