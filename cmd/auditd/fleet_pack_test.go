package main

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/witness"
)

const fleetRun = "01JFLEET0RUN00000000000000"

// fleetPackStart is when node 0's part of the fleet run starts.
var fleetPackStart = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// fleetPackNode writes node i's part of a fleet run (items i, i+3, ...
// below items, events 10ms apart, node i's from i seconds on) to a ledger in
// dir and returns its pack, proven against its latest checkpoint, with
// the ledger's checkpoint and key. mutate may change an event first.
func fleetPackNode(t *testing.T, dir string, i, items int, mutate func(*auditd.Event)) (packBytes, cp []byte, key string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	start := fleetPackStart.Add(time.Duration(i) * time.Second)
	clk := clock.NewFake(start)
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	app := func(e auditd.Event) {
		if mutate != nil {
			mutate(&e)
		}
		if _, err := l.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
		clk.Advance(10 * time.Millisecond)
	}
	app(auditd.Event{Type: auditd.EventRunStarted, RunID: fleetRun, Detail: `{"name":"fleet","award":{"fain":"F-FLEET"}}`})
	for k := i; k < items; k += 3 {
		key := fmt.Sprintf("item-%03d", k)
		app(auditd.Event{Type: auditd.EventItemQueued, RunID: fleetRun, SourceID: "county", ItemKey: key, Method: "GET", Path: "/q?n=" + strconv.Itoa(k)})
		app(auditd.Event{Type: auditd.EventDispatch, RunID: fleetRun, SourceID: "county", ItemKey: key, Attempt: 1, Method: "GET", Path: "/q?n=" + strconv.Itoa(k)})
		app(auditd.Event{Type: auditd.EventResponse, RunID: fleetRun, SourceID: "county", ItemKey: key, Attempt: 1, Status: 200, Bytes: 10, Outcome: auditd.OutcomeSuccess})
		app(auditd.Event{Type: auditd.EventItemFinished, RunID: fleetRun, SourceID: "county", ItemKey: key, Outcome: auditd.ItemSucceeded})
	}
	app(auditd.Event{Type: auditd.EventRunFinished, RunID: fleetRun, Outcome: auditd.Outcome(auditd.RunSucceeded)})
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if key, err = ledger.ReadPublicKey(dir); err != nil {
		t.Fatal(err)
	}
	r := ledger.NewReader(db)
	if cp, err = r.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	rec := reports.NewReconciler(r)
	var buf []byte
	rec.Hash = func(prev [32]byte, e *auditd.Event) (h [32]byte) {
		h, buf = ledger.HashEvent(buf, prev, e)
		return h
	}
	var out bytes.Buffer
	bl := &pack.Builder{Ledger: r, PublicKey: key, Exporter: reports.NewExporter(rec), TmpDir: t.TempDir()}
	if _, err := bl.Build(ctx, &out, pack.Request{Request: reports.Request{ExportID: "fleet", RunIDs: []string{fleetRun}, Filters: "run " + fleetRun}}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes(), cp, key
}

// TestFleetPackIndependentVerifier builds the fleet pack of a three-node
// run (node ledgers, their checkpoints in a fleet log on a real etcd,
// cosigned by the three) and verifies it with pack.VerifyFleet and with
// the outsider's verifier; editing a node's leaf, dropping a node's part,
// swapping a node's key, a forking node checkpoint, overlapping
// reservations and dispatches over the limit fail both.
func TestFleetPackIndependentVerifier(t *testing.T) {
	ctx := context.Background()
	c := etcdtest.Start(t, 1)
	flog := fleetlog.New(etcdtest.NewClient(t, c.Endpoints()...), fleetlog.Config{})
	names := []string{"a", "b", "c"}
	dirs := map[string]string{}
	keys := map[string]string{}
	packs := map[string][]byte{}
	var nodes []pack.FleetNode
	for i, name := range names {
		dirs[name] = t.TempDir()
		pb, cp, key := fleetPackNode(t, dirs[name], i, 15, nil)
		e, err := flog.Post(ctx, fleetlog.Post{Node: name, Key: key, Checkpoint: cp, Revision: int64(30 + i)})
		if err != nil {
			t.Fatal(err)
		}
		keys[name], packs[name] = key, pb
		leaf := fleetlog.Leaf{Node: name, Revision: int64(30 + i), Checkpoint: cp}.Marshal()
		nodes = append(nodes, pack.FleetNode{Name: name, Key: key, LeafIndex: e.Index, Leaf: base64.StdEncoding.EncodeToString(leaf),
			// Half a second of slots from the node's start: its dispatches' times.
			Blocks: []pack.FleetBlock{{Source: "county", First: fleetPackStart.Add(time.Duration(i) * time.Second).UnixNano(), Interval: int64(10 * time.Millisecond), Count: 50, Revision: int64(20 + i)}}})
	}
	head, err := flog.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i, name := range names {
		cs, err := witness.ReadCosigner(filepath.Join(dirs[name], ledger.PrivateKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := flog.Cosign(ctx, cs, head.Size); err != nil {
			t.Fatal(err)
		}
		p, err := flog.ProveLeaf(ctx, nodes[i].LeafIndex, head.Size)
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range p {
			nodes[i].Inclusion = append(nodes[i].Inclusion, base64.StdEncoding.EncodeToString(h[:]))
		}
	}
	fcp, _, err := flog.Checkpoint(ctx, head.Size)
	if err != nil {
		t.Fatal(err)
	}
	manifest := pack.FleetManifest{Origin: head.Origin, TreeSize: head.Size, Runs: []string{fleetRun}, Nodes: nodes,
		Limits: []pack.FleetLimit{{Source: "county", Limit: 100, Window: int64(time.Second)}}, SlotSlack: int64(50 * time.Millisecond)}
	// mergeRows is the fleet workbook of the node workbooks of packs,
	// each under the node name books gives it (its own when absent), its
	// sheets continued past limit rows (0: the default).
	mergeRows := func(packs map[string][]byte, books map[string]string, limit int) []byte {
		var parts []reports.FleetWorkbook
		for n, b := range packs {
			if from, ok := books[n]; ok {
				b = packs[from]
			}
			wb, err := zipEntry(b, "evidence.xlsx")
			if err != nil {
				t.Fatal(err)
			}
			parts = append(parts, reports.FleetWorkbook{Node: n, Book: bytes.NewReader(wb), Size: int64(len(wb))})
		}
		var buf bytes.Buffer
		if err := reports.WriteFleetEvidence(&buf, reports.FleetEvidence{RunID: fleetRun, Parts: parts, RowLimit: limit}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	merge := func(packs map[string][]byte, books map[string]string) []byte { return mergeRows(packs, books, 0) }
	writeBook := func(m pack.FleetManifest, packs map[string][]byte, book []byte) []byte {
		readers := map[string]io.Reader{}
		for n, b := range packs {
			readers[n] = bytes.NewReader(b)
		}
		var buf bytes.Buffer
		if err := pack.WriteFleet(&buf, pack.FleetParts{Manifest: m, Checkpoint: fcp, Packs: readers, Workbook: bytes.NewReader(book)}); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	write := func(m pack.FleetManifest, packs map[string][]byte) []byte {
		return writeBook(m, packs, merge(packs, nil))
	}
	verify := func(b []byte) (*pack.FleetReport, error) {
		fp, err := pack.OpenFleet(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			t.Fatal(err)
		}
		r, err := pack.VerifyFleet(fp, pack.FleetOptions{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		return r, outsideVerifyFleet(b, keys)
	}
	good := write(manifest, packs)
	if r, outside := verify(good); !r.OK || outside != nil {
		t.Fatalf("a good fleet pack: VerifyFleet %v, the outsider: %v", r.Problems, outside)
	}
	// Sheets continued on "Dispatches (2)" and on: each part's hash is
	// over its own rows, header first.
	if r, outside := verify(writeBook(manifest, packs, mergeRows(packs, nil, 8))); !r.OK || outside != nil {
		t.Fatalf("a good fleet pack, its sheets continued: VerifyFleet %v, the outsider: %v", r.Problems, outside)
	}
	// auditd verify --pack reads a fleet pack as one, with the nodes' keys
	// given on the command line.
	verifyCLI := func(b []byte, extra ...string) (int, string) {
		path := filepath.Join(t.TempDir(), "fleet-pack.zip")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		args := append([]string{"--pack", path}, extra...)
		for _, name := range names {
			args = append(args, "--node-key", name+"="+keys[name])
		}
		var stdout, stderr bytes.Buffer
		code := runVerify(ctx, args, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	if code, out := verifyCLI(good); code != 0 || !strings.Contains(out, "fleet pack verified: 3 nodes (a, b, c)") || !strings.Contains(out, "each the row of its Node's own workbook") {
		t.Fatalf("auditd verify --pack on a good fleet pack: exit %d\n%s", code, out)
	}
	// A node pack's checks asked of a fleet pack are refused, never
	// ignored: a pass that checked none of them would be a false pass.
	for _, extra := range [][]string{{"--key", keys[names[0]]}, {"--require-witness", "garbage"}, {"--previous", "earlier.zip"}} {
		if code, out := verifyCLI(good, extra...); code != 2 || !strings.Contains(out, extra[0]+": this pack is a fleet's") {
			t.Errorf("auditd verify --pack on a fleet pack with %s: exit %d, want 2 naming it\n%s", extra[0], code, out)
		}
	}

	with := func(name string, b []byte) map[string][]byte {
		out := map[string][]byte{}
		for n, p := range packs {
			out[n] = p
		}
		out[name] = b
		return out
	}
	_, otherKey, err := note.GenerateKey(rand.Reader, "auditd/0badc0de")
	if err != nil {
		t.Fatal(err)
	}
	forkDir := t.TempDir()
	for _, k := range []string{ledger.PrivateKeyFile, ledger.PublicKeyFile} {
		b, err := os.ReadFile(filepath.Join(dirs["b"], k))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(forkDir, k), b, 0o600)
	}
	forked, _, _ := fleetPackNode(t, forkDir, 1, 15, func(e *auditd.Event) {
		if e.Type == auditd.EventResponse {
			e.Bytes = 11
		}
	})
	for _, tc := range []struct {
		name    string
		pack    func() []byte
		named   []string // in a problem of VerifyFleet
		outside string   // in the outsider's error, when set
		clean   string   // in no problem of VerifyFleet, when set
	}{
		{"EditedLeaf", func() []byte {
			return write(manifest, with("b", editEntry(t, packs["b"], "events.bin", func(x []byte) []byte {
				x = bytes.Clone(x)
				x[len(x)-3] ^= 1
				return x
			})))
		}, []string{"node b:", "leaf"}, "", ""},
		{"DroppedNode", func() []byte {
			m := manifest
			m.Nodes = []pack.FleetNode{nodes[0], nodes[2]}
			p := with("b", nil)
			delete(p, "b")
			return write(m, p)
		}, []string{"node b:", "no part"}, "", ""},
		{"SwappedKey", func() []byte {
			m := manifest
			m.Nodes = append([]pack.FleetNode(nil), nodes...)
			m.Nodes[1].Key = otherKey
			return write(m, with("b", editEntry(t, packs["b"], "public-key.txt", func([]byte) []byte { return []byte(otherKey + "\n") })))
		}, []string{"node b:", "key"}, "", ""},
		{"ForkedNodeCheckpoint", func() []byte { return write(manifest, with("b", forked)) }, []string{"node b:", "forks"}, "", ""},
		{"OverlappingReservations", func() []byte {
			m := manifest
			m.Nodes = append([]pack.FleetNode(nil), nodes...)
			m.Nodes[2].Blocks = []pack.FleetBlock{nodes[2].Blocks[0]}
			m.Nodes[2].Blocks[0].First = nodes[1].Blocks[0].First + int64(400*time.Millisecond)
			return write(m, packs)
		}, []string{"source county", "overlaps"}, "", ""},
		{"DispatchOutsideReservations", func() []byte {
			m := manifest
			m.Nodes = append([]pack.FleetNode(nil), nodes...)
			m.Nodes[1].Blocks = []pack.FleetBlock{nodes[1].Blocks[0]}
			m.Nodes[1].Blocks[0].First += int64(300 * time.Millisecond) // after node b's first dispatches
			return write(m, packs)
		}, []string{"node b's dispatch event", "none of its reserved blocks"}, "", ""},
		{"WorkbookRowsOfAnotherNode", func() []byte {
			return writeBook(manifest, packs, merge(packs, map[string]string{"b": "c"}))
		}, []string{"node b:", "evidence.xlsx: sheet Dispatches row"}, "", ""},
		{"WorkbookNodeLeftOut", func() []byte {
			return writeBook(manifest, packs, merge(map[string][]byte{"a": packs["a"], "c": packs["c"]}, nil))
		}, []string{"node b:", "holds 0 of the node's"}, "", ""},
		{"WorkbookCellEdited", func() []byte {
			return writeBook(manifest, packs, editBook(t, merge(packs, nil), "/q?n=2", "/q?n=9"))
		}, []string{"node ", "evidence.xlsx: sheet Dispatches row"}, "", ""},
		{"WorkbookManifestKeyEdited", func() []byte {
			return writeBook(manifest, packs, editBook(t, merge(packs, nil), keys["b"], otherKey))
		}, []string{"evidence.xlsx: sheet Manifest row", "Node b: Public key"}, "", ""},
		{"WorkbookManifestNodesEdited", func() []byte {
			return writeBook(manifest, packs, editBook(t, merge(packs, nil), ">a b c<", ">a c<"))
		}, []string{"evidence.xlsx: sheet Manifest row", "Nodes is"}, "", ""},
		{"WorkbookManifestSHAEdited", func() []byte {
			// Another valid-looking hash for the Dispatches sheet: its rows
			// are untouched, so only the hash over them catches it.
			book := merge(packs, nil)
			sum := manifestSHA(t, book, "Dispatches")
			forged := strings.Map(func(r rune) rune {
				if r == '0' {
					return '1'
				}
				return r
			}, sum)
			if forged == sum {
				forged = strings.Repeat("0", len(sum))
			}
			return writeBook(manifest, packs, editBook(t, book, sum, forged))
		}, []string{"evidence.xlsx: sheet Manifest row", "sheet Dispatches's SHA-256 of rows"}, "sheet Dispatches's SHA-256", ""},
		{"WorkbookContinuationSHAEdited", func() []byte {
			book := mergeRows(packs, nil, 8)
			sum := manifestSHA(t, book, "Dispatches (2)")
			return writeBook(manifest, packs, editBook(t, book, sum, strings.Repeat("0", len(sum))))
		}, []string{"evidence.xlsx: sheet Manifest row", "sheet Dispatches (2)'s SHA-256 of rows"}, "sheet Dispatches (2)'s SHA-256", ""},
		{"WorkbookCellAndSHAEdited", func() []byte {
			// A data cell edited and its sheet's hash made to match: the
			// cell is still caught, cell by cell.
			book := merge(packs, nil)
			before, err := outsideSheetHashes(book)
			if err != nil {
				t.Fatal(err)
			}
			edited := editBook(t, book, "/q?n=2", "/q?n=9")
			after, err := outsideSheetHashes(edited)
			if err != nil {
				t.Fatal(err)
			}
			var changed []string
			for sheet, sum := range after {
				if sum != before[sheet] {
					changed = append(changed, sheet)
					edited = editBook(t, edited, before[sheet], sum)
				}
			}
			if len(changed) != 1 || manifestSHA(t, edited, changed[0]) != after[changed[0]] {
				t.Fatalf("the edit changed the hashes of sheets %q, want one, restated", changed)
			}
			return writeBook(manifest, packs, edited)
		}, []string{"node ", "evidence.xlsx: sheet Dispatches row"}, "sheet Dispatches row", "SHA-256"},
		{"DispatchesOverLimit", func() []byte {
			m := manifest
			m.Limits = []pack.FleetLimit{{Source: "county", Limit: 3, Window: int64(time.Second)}}
			return write(m, packs)
		}, []string{"source county", "over the limit 3"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := tc.pack()
			if code, out := verifyCLI(b); code != 1 || !strings.Contains(out, "fleet pack NOT verified") || !strings.Contains(out, tc.named[0]) {
				t.Errorf("auditd verify --pack: exit %d, want 1 naming %q\n%s", code, tc.named[0], out)
			}
			r, outside := verify(b)
			if outside == nil {
				t.Error("the outsider's verifier accepts it")
			} else if !strings.Contains(outside.Error(), tc.outside) {
				t.Errorf("the outsider's verifier: %v; want it to name %q", outside, tc.outside)
			}
			if r.OK {
				t.Fatal("VerifyFleet accepts it")
			}
			for _, p := range r.Problems {
				if tc.clean != "" && strings.Contains(p, tc.clean) {
					t.Errorf("a problem names %q: %s", tc.clean, p)
				}
			}
			for _, p := range r.Problems {
				if all := strings.Contains(p, tc.named[0]) && strings.Contains(p, tc.named[1]); all {
					t.Logf("named: %s; the outsider: %v", p, outside)
					return
				}
			}
			t.Errorf("no problem names %q:\n%s", tc.named, strings.Join(r.Problems, "\n"))
		})
	}
}

// editBook returns workbook book with the first old in its sheets' or
// shared strings' XML replaced by new.
func editBook(t *testing.T, book []byte, old, new string) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(book), int64(len(book)))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range zr.File {
		if !strings.HasPrefix(f.Name, "xl/") {
			continue
		}
		data, err := zipEntry(book, f.Name)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(old)) {
			return editEntry(t, book, f.Name, func(x []byte) []byte { return bytes.Replace(x, []byte(old), []byte(new), 1) })
		}
	}
	t.Fatalf("the workbook has no %q", old)
	return nil
}

// manifestSHA is the SHA-256 of rows the Manifest of workbook book states
// for sheet.
func manifestSHA(t *testing.T, book []byte, sheet string) string {
	t.Helper()
	sheets, err := outsideSheets(book)
	if err != nil {
		t.Fatal(err)
	}
	for _, row := range sheets["Manifest"] {
		if len(row) == 3 && row[0] == sheet {
			return row[2]
		}
	}
	t.Fatalf("the Manifest states no SHA-256 for sheet %s", sheet)
	return ""
}

// TestFleetVerifierImports: the outsider's fleet verifier uses no auditd
// code, only transparency-dev/merkle and x/mod/sumdb/note.
func TestFleetVerifierImports(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "fleet_verifier_test.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if strings.Contains(p, ".") && !strings.HasPrefix(p, "github.com/transparency-dev/merkle") && p != "golang.org/x/mod/sumdb/note" {
			t.Errorf("the fleet verifier imports %s", p)
		}
	}
}
