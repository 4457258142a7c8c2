package reports_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
)

const synthRunID = "01JSYNTH0RUN00000000000000"

// synthPayloadHash is the payload every item of a synthRun stages.
var synthPayloadHash = strings.Repeat("ab", 32)

// synthRun is a large, balanced run generated on the fly in ledger order:
// every item queued, then per item its pages, each a dispatch and a success,
// every throttleEvery-th request first throttled (429, a pause wait, a
// retry); then the payload and the item's end. Nothing is stored, so
// memory figures measure the reports package, not the fixture.
type synthRun struct {
	items, pages, throttleEvery int
}

// 1M events: 90,000 items of 4 pages.
var synth1MEvents = synthRun{items: 90_000, pages: 4, throttleEvery: 50}

// 1M dispatches: 245,098 items of 4 pages is 980,392 requests, 19,608 of
// them retried after a throttle.
var synth1MDispatches = synthRun{items: 245_098, pages: 4, throttleEvery: 50}

func (s synthRun) sources() int { return 4 }

// each generates the run's events with Seq, Time and a hash chain (a cheap
// stand-in hash: the generator is not what is measured).
func (s synthRun) each(fn func(*auditd.Event) error) error {
	var e auditd.Event
	var seq uint64
	var prev [32]byte
	emit := func(ev auditd.Event) error {
		seq++
		ev.Seq, ev.RunID, ev.Time = seq, synthRunID, fixtureBase.Add(time.Duration(seq)*time.Millisecond)
		ev.PrevHash = prev
		binary.BigEndian.PutUint64(ev.Hash[:], seq)
		ev.Hash[31] = 1
		prev = ev.Hash
		e = ev
		return fn(&e)
	}
	src := func(i int) string { return "src-" + string(rune('a'+i%s.sources())) }
	if err := emit(auditd.Event{Type: auditd.EventRunStarted, Detail: `{"name":"synthetic"}`}); err != nil {
		return err
	}
	for i := range s.sources() {
		if err := emit(auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: src(i), NewLimit: 1000, NewWindow: time.Second, Snapshot: "run.start"}); err != nil {
			return err
		}
	}
	key := func(i int) string { return fmt.Sprintf("item-%07d", i) }
	for i := range s.items {
		if err := emit(auditd.Event{Type: auditd.EventItemQueued, SourceID: src(i), ItemKey: key(i), Method: "GET", Path: "/arcgis/rest/services/Parcels/FeatureServer/0/query"}); err != nil {
			return err
		}
	}
	req := 0
	for i := range s.items {
		k, sid := key(i), src(i)
		for p := range uint32(s.pages) {
			path := fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%%3D1&outFields=*&resultOffset=%d&f=json", p*1000)
			d := auditd.Event{Type: auditd.EventDispatch, SourceID: sid, ItemKey: k, Page: p, Attempt: 1, Method: "GET", Path: path}
			if err := emit(d); err != nil {
				return err
			}
			if req++; req%s.throttleEvery == 1 {
				for _, ev := range []auditd.Event{
					{Type: auditd.EventThrottle, SourceID: sid, ItemKey: k, Page: p, Attempt: 1, Status: 429, RetryAfterRaw: "0", Wait: time.Millisecond},
					{Type: auditd.EventWait, SourceID: sid, ItemKey: k, Page: p, Attempt: 2, Gate: "pause", Wait: time.Millisecond, Actual: time.Millisecond},
				} {
					if err := emit(ev); err != nil {
						return err
					}
				}
				d.Attempt = 2
				if err := emit(d); err != nil {
					return err
				}
			}
			if err := emit(auditd.Event{Type: auditd.EventResponse, SourceID: sid, ItemKey: k, Page: p, Attempt: d.Attempt, Status: 200,
				Bytes: 48_000, Latency: 80 * time.Millisecond, Outcome: auditd.OutcomeSuccess}); err != nil {
				return err
			}
		}
		for _, ev := range []auditd.Event{
			{Type: auditd.EventPayloadStaged, SourceID: sid, ItemKey: k, PayloadHash: synthPayloadHash, Bytes: 192_000},
			{Type: auditd.EventItemFinished, SourceID: sid, ItemKey: k, Outcome: auditd.ItemSucceeded},
		} {
			if err := emit(ev); err != nil {
				return err
			}
		}
	}
	for i := range s.sources() {
		if err := emit(auditd.Event{Type: auditd.EventRegistrySnapshot, SourceID: src(i), NewLimit: 1000, NewWindow: time.Second, Snapshot: "run.end"}); err != nil {
			return err
		}
	}
	return emit(auditd.Event{Type: auditd.EventRunFinished, Outcome: auditd.Outcome(auditd.RunSucceeded)})
}

// synthReader serves a synthRun as an auditd.EventReader. Every event
// belongs to the run, so seqs 1..n are the run's.
type synthReader struct {
	run synthRun
	n   uint64
}

func newSynthReader(run synthRun) synthReader {
	var n uint64
	run.each(func(*auditd.Event) error { n++; return nil })
	return synthReader{run: run, n: n}
}

// ScanRun with after > 0 only serves index probes (reports' range search):
// it yields where the next run event is (Seq, RunID) without generating
// the run up to it, as a ledger's index seek would.
func (r synthReader) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	if runID != synthRunID {
		return nil
	}
	if after > 0 {
		for seq := after + 1; seq <= r.n; seq++ {
			if err := fn(&auditd.Event{Seq: seq, RunID: runID}); err != nil {
				return err
			}
		}
		return nil
	}
	return r.run.each(fn)
}

func (r synthReader) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	errDone := fmt.Errorf("done")
	err := r.run.each(func(e *auditd.Event) error {
		if e.Seq < from {
			return nil
		}
		if to != 0 && e.Seq > to {
			return errDone
		}
		return fn(e)
	})
	if err == errDone {
		return nil
	}
	return err
}

// millionLedger is synth1MEvents written once into a real bbolt ledger.
var millionLedger builtLedger

// builtLedger is a synthRun written once into a real bbolt ledger in a
// temporary directory, which TestMain removes.
type builtLedger struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	for _, dir := range []string{millionLedger.dir, recountLedgers[0].dir, recountLedgers[1].dir} {
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	for _, dir := range fleetLedgers.dirs { // fleet_bench_test.go
		if dir != "" {
			os.RemoveAll(dir)
		}
	}
	os.Exit(code)
}

func openMillionLedger(b *testing.B) *bolt.DB {
	return millionLedger.open(b, synth1MEvents)
}

// open writes run into f's ledger the first time, then opens it read-only.
func (f *builtLedger) open(b *testing.B, run synthRun) *bolt.DB {
	b.Helper()
	f.once.Do(func() {
		if f.dir, f.err = os.MkdirTemp("", "reports-bench-"); f.err != nil {
			return
		}
		f.err = writeLedger(filepath.Join(f.dir, "auditd.db"), f.dir, run)
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	db, err := bolt.Open(filepath.Join(f.dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	return db
}

// writeLedger appends run's events to a new ledger at path, in commits of
// 1,000 events a second apart on a fake clock.
func writeLedger(path, keyDir string, run synthRun) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		return err
	}
	defer db.Close()
	clk := clock.NewFake(fixtureBase)
	l, err := ledger.Open(db, ledger.Options{KeyDir: keyDir, Clock: clk})
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	batch := make([]auditd.Event, 0, 1000)
	flush := func() error {
		_, err := l.AppendBatch(context.Background(), batch)
		batch = batch[:0]
		clk.Advance(time.Second) // one commit group per second keeps windows under the limit
		return err
	}
	err = run.each(func(e *auditd.Event) error {
		c := *e
		c.Seq, c.Time, c.PrevHash, c.Hash = 0, time.Time{}, [32]byte{}, [32]byte{}
		c.Wait, c.Actual = 0, 0 // stamps are per commit group: a pause would cover its own retry
		if batch = append(batch, c); len(batch) == cap(batch) {
			return flush()
		}
		return nil
	})
	if err == nil && len(batch) > 0 {
		err = flush()
	}
	return err
}

// BenchmarkReconcile1M reconciles a run of about 1M events: "ledger" reads a
// real bbolt ledger (warm after the first iteration) and re-hashes every
// event with the ledger's canonical encoding; "generated" isolates the
// recount from storage.
func BenchmarkReconcile1M(b *testing.B) {
	b.Run("ledger", func(b *testing.B) {
		db := openMillionLedger(b)
		r := reports.NewReconciler(ledger.NewReader(db))
		r.Hash = ledgerHash
		benchReconcile(b, r)
	})
	b.Run("generated", func(b *testing.B) {
		benchReconcile(b, reports.NewReconciler(newSynthReader(synth1MEvents)))
	})
}

func benchReconcile(b *testing.B, r *reports.Reconciler) {
	var events int64
	for b.Loop() {
		rep, err := r.Reconcile(context.Background(), synthRunID, nil)
		if err != nil {
			b.Fatal(err)
		}
		if !rep.Balanced {
			b.Fatalf("synthetic run not balanced: %v %+v", rep.Failed(), rep.Checks)
		}
		events = rep.Counts.Events
	}
	b.ReportMetric(float64(events), "events/op")
}

// BenchmarkEvidence1M writes the evidence workbook of a run with 1M
// dispatches ("evidence") next to a bare excelize StreamWriter writing the
// same Dispatches cells ("bare"), both to a file.
func BenchmarkEvidence1M(b *testing.B) {
	b.Run("evidence", func(b *testing.B) {
		x := reports.NewExporter(reports.NewReconciler(newSynthReader(synth1MDispatches)))
		req := reports.Request{ExportID: "bench", RunIDs: []string{synthRunID}, Filters: "run " + synthRunID}
		for b.Loop() {
			f := benchFile(b)
			m, err := x.Export(context.Background(), f, req)
			if err != nil {
				b.Fatal(err)
			}
			reportFile(b, f)
			b.ReportMetric(float64(m.Reports[0].Counts.Dispatches), "rows/op")
		}
	})
	b.Run("bare", func(b *testing.B) {
		for b.Loop() {
			f := benchFile(b)
			n, err := writeBare(f, synth1MDispatches)
			if err != nil {
				b.Fatal(err)
			}
			reportFile(b, f)
			b.ReportMetric(float64(n), "rows/op")
		}
	})
}

// reportFile closes f and reports its size: the two sub-benchmarks
// compress differently (chunked and parallel vs excelize's own writer).
func reportFile(b *testing.B, f *os.File) {
	fi, err := f.Stat()
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Close(); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(fi.Size()), "file-bytes")
}

func benchFile(b *testing.B) *os.File {
	f, err := os.CreateTemp(b.TempDir(), "*.xlsx")
	if err != nil {
		b.Fatal(err)
	}
	return f
}

// writeBare writes the Dispatches cells of s with a plain StreamWriter:
// same values, same date style, one sheet, excelize's own ZIP writer.
func writeBare(w io.Writer, s synthRun) (int, error) {
	f := excelize.NewFile()
	defer f.Close()
	sw, err := f.NewStreamWriter("Sheet1")
	if err != nil {
		return 0, err
	}
	format := `yyyy-mm-dd"T"hh:mm:ss.000"Z"`
	date, err := f.NewStyle(&excelize.Style{CustomNumFmt: &format})
	if err != nil {
		return 0, err
	}
	header := make([]any, 19)
	for i := range header {
		header[i] = fmt.Sprintf("Column %d", i+1)
	}
	if err := sw.SetRow("A1", header); err != nil {
		return 0, err
	}
	rows := 1
	var last *auditd.Event
	var pending []any
	err = s.each(func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventDispatch:
			c := *e
			last = &c
		case auditd.EventResponse, auditd.EventThrottle:
			d := last
			var status any = e.Status
			pending = []any{d.Seq, d.RunID, d.ItemKey, d.Page, d.Attempt, d.SourceID, d.Method, d.Path,
				excelize.Cell{StyleID: date, Value: d.Time}, excelize.Cell{StyleID: date, Value: e.Time},
				string(e.Type), status, "", string(e.Outcome), "", e.Bytes, e.Latency.Seconds(), strings.Repeat("ab", 32),
				fmt.Sprintf("%x", d.Hash)}
			rows++
			cell, err := excelize.CoordinatesToCellName(1, rows)
			if err != nil {
				return err
			}
			return sw.SetRow(cell, pending)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := sw.Flush(); err != nil {
		return 0, err
	}
	return rows - 1, f.Write(w)
}

// TestEvidencePeakRSS exports the 1M-dispatch run once and reports the
// process's peak RSS (VmHWM). Run alone, by hand:
//
//	AUDITD_RSS=1 go test -run TestEvidencePeakRSS -v ./reports/
func TestEvidencePeakRSS(t *testing.T) {
	if os.Getenv("AUDITD_RSS") == "" {
		t.Skip("set AUDITD_RSS=1 to measure (takes tens of seconds)")
	}
	f, err := os.Create(filepath.Join(t.TempDir(), "evidence.xlsx"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	x := reports.NewExporter(reports.NewReconciler(newSynthReader(synth1MDispatches)))
	start := time.Now()
	m, err := x.Export(context.Background(), f, reports.Request{ExportID: "rss", RunIDs: []string{synthRunID}})
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := f.Stat()
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	var hwm string
	for _, line := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(line, "VmHWM:") {
			hwm = strings.TrimSpace(strings.TrimPrefix(line, "VmHWM:"))
		}
	}
	t.Logf("dispatch rows %d, file %d bytes, took %s, peak RSS (VmHWM) %s", m.Reports[0].Counts.Dispatches, fi.Size(), time.Since(start).Round(time.Millisecond), hwm)
}
