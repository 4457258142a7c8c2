package pack_test

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/witness"
)

// fleetBase is when the fleet run's first event happened.
var fleetBase = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// fleetNode is one node's ledger of its part of the fleet run.
type fleetNode struct {
	name string
	dir  string
	db   *bolt.DB
	key  string
	pack []byte
}

// nodeLedger writes node i's part of the fleet run (items i, i+3, ...,
// each event 10ms after the one before, the nodes interleaved) into a
// ledger in dir, whose key files may already be there; edit may change an
// event first.
func nodeLedger(tb testing.TB, name, dir string, i, items int, edit func(*auditd.Event)) *fleetNode {
	tb.Helper()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	clk := clock.NewFake(fleetBase)
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	at := fleetBase.Add(time.Duration(i) * 3 * time.Millisecond)
	app := func(e auditd.Event) {
		clk.Set(at) // the ledger stamps each event with its clock
		at = at.Add(10 * time.Millisecond)
		if edit != nil {
			edit(&e)
		}
		if _, err := l.Append(ctx, e); err != nil {
			tb.Fatal(err)
		}
	}
	app(auditd.Event{Type: auditd.EventRunStarted, RunID: benchRun, Detail: `{"name":"fleet","award":{"fain":"F-FLEET"}}`})
	for k := i; k < items; k += 3 {
		app(auditd.Event{Type: auditd.EventItemQueued, RunID: benchRun, SourceID: "src-" + string(rune('a'+k%4)), ItemKey: fmt.Sprintf("item-%07d", k), Method: "GET", Path: "/q"})
		for _, e := range itemEvents(k) {
			app(e)
		}
	}
	app(auditd.Event{Type: auditd.EventRunFinished, RunID: benchRun, Outcome: auditd.Outcome(auditd.RunSucceeded)})
	if err := l.Close(ctx); err != nil {
		tb.Fatal(err)
	}
	key, err := ledger.ReadPublicKey(dir)
	if err != nil {
		tb.Fatal(err)
	}
	return &fleetNode{name: name, dir: dir, db: db, key: key}
}

// buildPack writes n's pack of the run, proven against checkpoint.
func (n *fleetNode) buildPack(tb testing.TB, checkpoint []byte) []byte {
	tb.Helper()
	var buf bytes.Buffer
	bl := &pack.Builder{Ledger: ledger.NewReader(n.db), PublicKey: n.key, Exporter: benchExporter(n.db), TmpDir: tb.TempDir()}
	req := pack.Request{Request: reports.Request{ExportID: "fleet-" + n.name, RunIDs: []string{benchRun}, Filters: "run " + benchRun}, Checkpoint: checkpoint}
	if _, err := bl.Build(context.Background(), &buf, req); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// fleetFixture is a three-node fleet run: the nodes' ledgers, their
// checkpoints posted to a fleet log in a real etcd and cosigned, and the
// parts of its fleet pack.
type fleetFixture struct {
	nodes []*fleetNode
	parts pack.FleetParts
	keys  map[string]string
}

// logNodes makes nodes the fixture's: it posts each node's checkpoint to
// the fleet log (revisions 100 on), builds its pack at that checkpoint,
// has every node cosign the log's head and keeps the fleet checkpoint. It
// returns the head and each node's entry and leaf.
func (f *fleetFixture) logNodes(tb testing.TB, ctx context.Context, log *fleetlog.Log, nodes []*fleetNode) (fleetlog.Tree, []fleetlog.Entry, [][]byte) {
	tb.Helper()
	var entries []fleetlog.Entry
	var leaves [][]byte
	for i, n := range nodes {
		cp, err := ledger.NewReader(n.db).Checkpoint()
		if err != nil {
			tb.Fatal(err)
		}
		rev := int64(100 + i)
		e, err := log.Post(ctx, fleetlog.Post{Node: n.name, Key: n.key, Checkpoint: cp, Revision: rev})
		if err != nil {
			tb.Fatal(err)
		}
		f.nodes, f.keys[n.name] = append(f.nodes, n), n.key
		entries = append(entries, e)
		leaves = append(leaves, fleetlog.Leaf{Node: n.name, Revision: rev, Checkpoint: cp}.Marshal())
		n.pack = n.buildPack(tb, cp)
	}
	head, err := log.Head(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	for _, n := range f.nodes {
		cs, err := witness.ReadCosigner(filepath.Join(n.dir, ledger.PrivateKeyFile))
		if err != nil {
			tb.Fatal(err)
		}
		if _, err := log.Cosign(ctx, cs, head.Size); err != nil {
			tb.Fatal(err)
		}
	}
	if f.parts.Checkpoint, _, err = log.Checkpoint(ctx, head.Size); err != nil {
		tb.Fatal(err)
	}
	return head, entries, leaves
}

func newFleetFixture(tb testing.TB, items int) *fleetFixture {
	tb.Helper()
	ctx := context.Background()
	c := etcdtest.Start(tb, 1)
	log := fleetlog.New(etcdtest.NewClient(tb, c.Endpoints()...), fleetlog.Config{})
	f := &fleetFixture{keys: map[string]string{}}
	f.parts.Packs = map[string]io.Reader{}
	var nodes []*fleetNode
	for i, name := range []string{"a", "b", "c"} {
		nodes = append(nodes, nodeLedger(tb, name, tb.TempDir(), i, items, nil))
	}
	head, entries, leaves := f.logNodes(tb, ctx, log, nodes)
	m := &f.parts.Manifest
	*m = pack.FleetManifest{Origin: head.Origin, TreeSize: head.Size, Runs: []string{benchRun},
		Limits: []pack.FleetLimit{{Source: "src-a", Limit: 200, Window: int64(time.Second)}, {Source: "src-b", Limit: 200, Window: int64(time.Second)}}}
	for i, n := range f.nodes {
		p, err := log.ProveLeaf(ctx, entries[i].Index, head.Size)
		if err != nil {
			tb.Fatal(err)
		}
		fn := pack.FleetNode{Name: n.name, Key: n.key, LeafIndex: entries[i].Index, Leaf: b64s(leaves[i]), Inclusion: b64h(p)}
		// Each node held every third block of 10 slots 20ms apart.
		for k := range 5 {
			slot := 3*k + i
			fn.Blocks = append(fn.Blocks, pack.FleetBlock{Source: "src-a", First: fleetBase.Add(time.Duration(slot) * 200 * time.Millisecond).UnixNano(),
				Interval: int64(20 * time.Millisecond), Count: 10, Revision: int64(10 + slot)})
		}
		m.Nodes = append(m.Nodes, fn)
	}
	return f
}

// write writes the fleet pack of f's parts, each node's pack from its
// bytes, and opens it.
func (f *fleetFixture) write(tb testing.TB) *pack.FleetPack {
	tb.Helper()
	parts := f.parts
	parts.Packs = map[string]io.Reader{}
	for _, n := range f.nodes {
		parts.Packs[n.name] = bytes.NewReader(n.pack)
	}
	var buf bytes.Buffer
	if err := pack.WriteFleet(&buf, parts); err != nil {
		tb.Fatal(err)
	}
	fp, err := pack.OpenFleet(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		tb.Fatal(err)
	}
	return fp
}

func b64s(b []byte) string {
	return encodeB64(b)
}

func b64h(p tlog.RecordProof) []string {
	var out []string
	for _, h := range p {
		out = append(out, encodeB64(h[:]))
	}
	return out
}

// rezip returns the ZIP z with entry name's bytes passed through edit,
// every entry kept in its method.
func rezip(tb testing.TB, z []byte, name string, edit func([]byte) []byte) []byte {
	tb.Helper()
	zr, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			tb.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			tb.Fatal(err)
		}
		if f.Name == name {
			b = edit(b)
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.Name, Method: f.Method, Modified: f.Modified})
		if err != nil {
			tb.Fatal(err)
		}
		w.Write(b)
	}
	if err := zw.Close(); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func verifyFleet(tb testing.TB, fp *pack.FleetPack, keys map[string]string) *pack.FleetReport {
	tb.Helper()
	r, err := pack.VerifyFleet(fp, pack.FleetOptions{Keys: keys})
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// mustName fails unless r failed with a problem holding every one of want.
func mustName(tb testing.TB, r *pack.FleetReport, want ...string) {
	tb.Helper()
	if r.OK {
		tb.Fatal("a tampered fleet pack verified")
	}
	for _, p := range r.Problems {
		if all(p, want) {
			tb.Logf("named: %s", p)
			return
		}
	}
	tb.Errorf("no problem names %q:\n%s", want, strings.Join(r.Problems, "\n"))
}

func all(s string, subs []string) bool {
	for _, w := range subs {
		if !strings.Contains(s, w) {
			return false
		}
	}
	return true
}

func TestFleetPack(t *testing.T) {
	f := newFleetFixture(t, 18)
	r := verifyFleet(t, f.write(t), f.keys)
	if !r.OK {
		t.Fatalf("a good fleet pack fails:\n%s", strings.Join(r.Problems, "\n"))
	}
	if len(r.Nodes) != 3 || r.Dispatches["src-a"] == 0 || r.Dispatches["src-b"] == 0 {
		t.Fatalf("report: %d nodes, dispatches %v", len(r.Nodes), r.Dispatches)
	}
	if untrusted := verifyFleet(t, f.write(t), nil); !untrusted.OK || untrusted.KeysTrusted {
		t.Fatalf("without trusted keys: ok %v, trusted %v: %v", untrusted.OK, untrusted.KeysTrusted, untrusted.Problems)
	}

	t.Run("EditedLeaf", func(t *testing.T) {
		f := *f
		f.nodes = cloneNodes(f.nodes)
		b := f.nodes[1]
		// The 40th byte of events.bin is inside its second leaf.
		b.pack = rezip(t, b.pack, pack.FileLeaves, func(x []byte) []byte {
			x = bytes.Clone(x)
			x[40] ^= 1
			return x
		})
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node b:", "is not event 1 as its leaf says")
	})
	t.Run("EditedRow", func(t *testing.T) {
		f := *f
		f.nodes = cloneNodes(f.nodes)
		c := f.nodes[2]
		c.pack = rezip(t, c.pack, pack.FileWorkbook, func(x []byte) []byte {
			return rezip(t, x, "xl/worksheets/sheet4.xml", func(s []byte) []byte {
				return bytes.Replace(s, []byte("item-0000002"), []byte("item-0000009"), 1)
			})
		})
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node c:", "row")
	})
	t.Run("DroppedNode", func(t *testing.T) {
		f := *f
		f.nodes = []*fleetNode{f.nodes[0], f.nodes[2]}
		f.parts.Manifest.Nodes = []pack.FleetNode{f.parts.Manifest.Nodes[0], f.parts.Manifest.Nodes[2]}
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node b:", "no part")
		// Without the trusted keys, b's cosignature still names it.
		mustName(t, verifyFleet(t, f.write(t), nil), "cosigned by auditd/", "no part")
	})
	t.Run("SwappedKey", func(t *testing.T) {
		f := *f
		f.nodes = cloneNodes(f.nodes)
		_, other, err := note.GenerateKey(rand.Reader, "auditd/0badc0de")
		if err != nil {
			t.Fatal(err)
		}
		f.parts.Manifest.Nodes = append([]pack.FleetNode(nil), f.parts.Manifest.Nodes...)
		f.parts.Manifest.Nodes[1].Key = other
		f.nodes[1].pack = rezip(t, f.nodes[1].pack, pack.FilePublicKey, func([]byte) []byte { return []byte(other + "\n") })
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node b:", "not the trusted key")
		r := verifyFleet(t, f.write(t), nil)
		mustName(t, r, "node b:", "fleet-checkpoint.txt")
		mustName(t, r, "node b:", "fleet leaf 1", "not signed by the node's key")
	})
	t.Run("WrongTrustedKey", func(t *testing.T) {
		// Another node's key given for node b: one problem says so, not
		// every signature of b's part failing again.
		keys := maps.Clone(f.keys)
		keys["b"] = f.keys["a"]
		r := verifyFleet(t, f.write(t), keys)
		if r.OK || len(r.Problems) != 1 || !strings.Contains(r.Problems[0], "node b:") || !strings.Contains(r.Problems[0], "not the trusted key") {
			t.Errorf("another node's key for node b: %q, want one problem naming b's key", r.Problems)
		}
		// A key left out for one node is said to be left out.
		delete(keys, "b")
		mustName(t, verifyFleet(t, f.write(t), keys), "node b:", "no trusted key given for it")
	})
	t.Run("ForkedNodeCheckpoint", func(t *testing.T) {
		f := *f
		f.nodes = cloneNodes(f.nodes)
		// b's ledger again, under its key, with one event changed: a
		// ledger of the same size whose checkpoint forks the one the
		// fleet log holds.
		dir := t.TempDir()
		for _, k := range []string{ledger.PrivateKeyFile, ledger.PublicKeyFile} {
			b, err := os.ReadFile(filepath.Join(f.nodes[1].dir, k))
			if err != nil {
				t.Fatal(err)
			}
			os.WriteFile(filepath.Join(dir, k), b, 0o600)
		}
		forked := nodeLedger(t, "b", dir, 1, 18, func(e *auditd.Event) {
			if e.Type == auditd.EventResponse && e.Status == 200 {
				e.Bytes++
			}
		})
		f.nodes[1] = forked
		forked.pack = forked.buildPack(t, nil)
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node b:", "forks the node checkpoint the fleet log holds")
	})
	t.Run("OverlappingReservations", func(t *testing.T) {
		f := *f
		nodes := append([]pack.FleetNode(nil), f.parts.Manifest.Nodes...)
		nodes[2].Blocks = append([]pack.FleetBlock(nil), nodes[2].Blocks...)
		nodes[2].Blocks[0].First = nodes[0].Blocks[0].First + int64(50*time.Millisecond)
		f.parts.Manifest.Nodes = nodes
		mustName(t, verifyFleet(t, f.write(t), f.keys), "source src-a", "node a's block at revision 10", "overlaps node c's block at revision 12")
	})
	t.Run("BlockAfterCheckpoint", func(t *testing.T) {
		f := *f
		nodes := append([]pack.FleetNode(nil), f.parts.Manifest.Nodes...)
		nodes[1].Blocks = append([]pack.FleetBlock(nil), nodes[1].Blocks...)
		nodes[1].Blocks[4].Revision = 500
		f.parts.Manifest.Nodes = nodes
		mustName(t, verifyFleet(t, f.write(t), f.keys), "node b:", "revision 500 is after revision 101")
	})
	t.Run("WorkbookSHA", func(t *testing.T) {
		// The merged workbook verifies, its sheets' hashes taken again
		// from the rows as read (latencies such as 0.08, dates, booleans);
		// another hash for one sheet fails, naming it and its Manifest row.
		book := f.workbook(t)
		f := *f
		f.parts.Workbook = bytes.NewReader(book)
		if r := verifyFleet(t, f.write(t), f.keys); !r.OK {
			t.Fatalf("with its merged workbook, a good fleet pack fails:\n%s", strings.Join(r.Problems, "\n"))
		}
		edited := rezip(t, book, "xl/worksheets/sheet1.xml", func(x []byte) []byte {
			i := bytes.Index(x, []byte("<v>Dispatches</v>"))
			if i < 0 {
				i = bytes.Index(x, []byte(">Dispatches<"))
			}
			j := bytes.Index(x[i:], []byte("</row>"))
			if i < 0 || j < 0 {
				t.Fatal("the Manifest lists no Dispatches sheet")
			}
			row := x[i : i+j]
			k := bytes.LastIndex(row, []byte("<t>"))
			x = bytes.Clone(x)
			if x[i+k+3] != '0' { // the hash's first digit, another hex digit
				x[i+k+3] = '0'
			} else {
				x[i+k+3] = '1'
			}
			return x
		})
		f.parts.Workbook = bytes.NewReader(edited)
		mustName(t, verifyFleet(t, f.write(t), f.keys), "evidence.xlsx: sheet Manifest row", "sheet Dispatches's SHA-256 of rows is")
	})
	t.Run("DispatchesOverLimit", func(t *testing.T) {
		f := *f
		f.parts.Manifest.Limits = []pack.FleetLimit{{Source: "src-a", Limit: 3, Window: int64(time.Second)}}
		mustName(t, verifyFleet(t, f.write(t), f.keys), "source src-a", "over the limit 3 per 1s", "node ")
	})
}

// workbook is the fleet workbook of f's node packs, as auditd's fleet
// pack merges it.
func (f *fleetFixture) workbook(tb testing.TB) []byte {
	tb.Helper()
	nodes := map[string]*pack.Pack{}
	for _, n := range f.nodes {
		p, err := pack.Open(bytes.NewReader(n.pack), int64(len(n.pack)))
		if err != nil {
			tb.Fatal(err)
		}
		nodes[n.name] = p
	}
	var buf bytes.Buffer
	if err := pack.WriteFleetWorkbook(&buf, benchRun, nodes, tb.TempDir()); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

func cloneNodes(ns []*fleetNode) []*fleetNode {
	out := make([]*fleetNode, len(ns))
	for i, n := range ns {
		c := *n
		out[i] = &c
	}
	return out
}

func encodeB64(b []byte) string { return base64.StdEncoding.EncodeToString(b) }
