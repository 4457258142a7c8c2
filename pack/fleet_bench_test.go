package pack_test

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/witness"
)

// benchFleet is the 1M-event run of bench_test.go split over three nodes
// by item (item i on node i%3), each node's part in a ledger of its own
// under dir, written once per benchmark that uses it (the subs share it).
type benchFleet struct {
	once sync.Once
	dirs [3]string
	err  error
}

// open returns the three node ledgers, read-only, and their keys.
func (f *benchFleet) open(b *testing.B, dir string) ([3]*bolt.DB, [3]string) {
	b.Helper()
	f.once.Do(func() {
		for n := range 3 {
			f.dirs[n] = filepath.Join(dir, string(rune('a'+n)))
			if f.err = os.Mkdir(f.dirs[n], 0o700); f.err != nil {
				return
			}
			if f.err = writeBenchNode(f.dirs[n], n); f.err != nil {
				return
			}
		}
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	var dbs [3]*bolt.DB
	var keys [3]string
	for n, dir := range f.dirs {
		db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		if keys[n], err = ledger.ReadPublicKey(dir); err != nil {
			b.Fatal(err)
		}
		dbs[n] = db
	}
	return dbs, keys
}

// writeBenchNode writes node n's part as writeBenchLedger writes the
// whole run, its clock a millisecond further at every append, so that
// the dispatches spread over time for the over-limit proof.
func writeBenchNode(dir string, n int) error {
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{NoSync: true, InitialMmapSize: 1 << 29})
	if err != nil {
		return err
	}
	defer db.Close()
	clk := clock.NewFake(time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC))
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		return err
	}
	defer l.Close(context.Background())
	ctx := context.Background()
	app := func(e auditd.Event) error {
		clk.Advance(time.Millisecond)
		_, err := l.Append(ctx, e)
		return err
	}
	if err := app(auditd.Event{Type: auditd.EventRunStarted, RunID: benchRun, Detail: `{"name":"bench","award":{"fain":"F-BENCH"}}`}); err != nil {
		return err
	}
	for i := n; i < benchItems; i += 3 {
		if err := app(auditd.Event{Type: auditd.EventItemQueued, RunID: benchRun, SourceID: "src-" + string(rune('a'+i%4)), ItemKey: fmt.Sprintf("item-%07d", i), Method: "GET", Path: "/q"}); err != nil {
			return err
		}
	}
	const workers = 96
	errs := make(chan error, workers)
	for w := range workers {
		go func() {
			for i := n + 3*w; i < benchItems; i += 3 * workers {
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

// buildBenchFleet writes the fleet pack of the three nodes to w: each
// node's pack (one after another, as one process would), its checkpoint
// posted to a fleet log and cosigned, the merged workbook of the node
// packs' (pack.WriteFleetWorkbook, as auditd's fleet pack writes it) and
// the fleet pack around them.
func buildBenchFleet(b *testing.B, w io.Writer, fl *benchFleet, dbs [3]*bolt.DB, keys [3]string, log *fleetlog.Log) {
	ctx := context.Background()
	parts := pack.FleetParts{Packs: map[string]io.Reader{}}
	nodes := map[string]*pack.Pack{}
	var entries []fleetlog.Entry
	var leaves [][]byte
	for n, db := range dbs {
		name := string(rune('a' + n))
		r := ledger.NewReader(db)
		cp, err := r.Checkpoint()
		if err != nil {
			b.Fatal(err)
		}
		f := benchOut(b)
		bl := &pack.Builder{Ledger: r, PublicKey: keys[n], Exporter: benchExporter(db), TmpDir: b.TempDir()}
		if _, err := bl.Build(ctx, f, pack.Request{Request: benchRequest, Checkpoint: cp}); err != nil {
			b.Fatal(err)
		}
		size, err := f.Seek(0, io.SeekCurrent)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		if nodes[name], err = pack.Open(f, size); err != nil {
			b.Fatal(err)
		}
		parts.Packs[name] = io.NewSectionReader(f, 0, size)
		e, err := log.Post(ctx, fleetlog.Post{Node: name, Key: keys[n], Checkpoint: cp})
		if err != nil {
			b.Fatal(err)
		}
		entries = append(entries, e)
		leaves = append(leaves, fleetlog.Leaf{Node: name, Checkpoint: cp}.Marshal())
	}
	head, err := log.Head(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for n := range dbs {
		cs, err := witness.ReadCosigner(filepath.Join(fl.dirs[n], ledger.PrivateKeyFile))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := log.Cosign(ctx, cs, head.Size); err != nil {
			b.Fatal(err)
		}
	}
	if parts.Checkpoint, _, err = log.Checkpoint(ctx, head.Size); err != nil {
		b.Fatal(err)
	}
	parts.Manifest = pack.FleetManifest{Origin: head.Origin, TreeSize: head.Size, Runs: []string{benchRun}}
	for _, src := range []string{"src-a", "src-b", "src-c", "src-d"} {
		parts.Manifest.Limits = append(parts.Manifest.Limits, pack.FleetLimit{Source: src, Limit: 100_000, Window: int64(time.Second)})
	}
	for n := range dbs {
		p, err := log.ProveLeaf(ctx, entries[n].Index, head.Size)
		if err != nil {
			b.Fatal(err)
		}
		parts.Manifest.Nodes = append(parts.Manifest.Nodes, pack.FleetNode{Name: string(rune('a' + n)), Key: keys[n],
			LeafIndex: entries[n].Index, Leaf: encodeB64(leaves[n]), Inclusion: b64h(p)})
	}
	book := benchOut(b)
	defer book.Close()
	start := time.Now()
	if err := pack.WriteFleetWorkbook(book, benchRun, nodes, b.TempDir()); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(time.Since(start).Seconds(), "workbook-s/op")
	if _, err := book.Seek(0, io.SeekStart); err != nil {
		b.Fatal(err)
	}
	parts.Workbook = book
	if err := pack.WriteFleet(w, parts); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFleetPack1M builds the fleet pack of the 1M-event run split
// over three nodes ("fleet") next to the single-node pack of the same
// events in one ledger ("single"), each to a file; the target is fleet
// <= 2x single.
func BenchmarkFleetPack1M(b *testing.B) {
	fl, dir := &benchFleet{}, b.TempDir()
	b.Run("single", func(b *testing.B) {
		db, key := openBenchLedger(b)
		bl := &pack.Builder{Ledger: ledger.NewReader(db), PublicKey: key, Exporter: benchExporter(db), TmpDir: b.TempDir()}
		for b.Loop() {
			f := benchOut(b)
			if _, err := bl.Build(context.Background(), f, pack.Request{Request: benchRequest}); err != nil {
				b.Fatal(err)
			}
			reportSize(b, f)
		}
	})
	b.Run("fleet", func(b *testing.B) {
		dbs, keys := fl.open(b, dir)
		c := etcdtest.Start(b, 1)
		cli := etcdtest.NewClient(b, c.Endpoints()...)
		i := 0
		for b.Loop() {
			i++
			f := benchOut(b)
			log := fleetlog.New(cli, fleetlog.Config{Prefix: fmt.Sprintf("/bench/%d/", i)})
			buildBenchFleet(b, f, fl, dbs, keys, log)
			reportSize(b, f)
		}
	})
}

// BenchmarkVerifyFleetPack1M verifies those packs, built once: the
// single-node pack with Verify, the fleet pack with VerifyFleet (every
// node pack, the fleet proofs and the over-limit proof on four sources).
func BenchmarkVerifyFleetPack1M(b *testing.B) {
	fl, dir := &benchFleet{}, b.TempDir()
	b.Run("single", func(b *testing.B) {
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
		}
	})
	b.Run("fleet", func(b *testing.B) {
		dbs, keys := fl.open(b, dir)
		c := etcdtest.Start(b, 1)
		path := filepath.Join(b.TempDir(), "fleet.zip")
		f, err := os.Create(path)
		if err != nil {
			b.Fatal(err)
		}
		buildBenchFleet(b, f, fl, dbs, keys, fleetlog.New(etcdtest.NewClient(b, c.Endpoints()...), fleetlog.Config{}))
		f.Close()
		trusted := map[string]string{"a": keys[0], "b": keys[1], "c": keys[2]}
		for b.Loop() {
			fp, c, err := pack.OpenFleetFile(path)
			if err != nil {
				b.Fatal(err)
			}
			r, err := pack.VerifyFleet(fp, pack.FleetOptions{Keys: trusted})
			c.Close()
			if err != nil || !r.OK {
				b.Fatalf("verify: %v %v", err, r.Problems)
			}
			b.ReportMetric(float64(r.Dispatches["src-a"]), "src-a-dispatches/op")
		}
	})
}
