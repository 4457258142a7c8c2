package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// damageVariants is how many damaged copies of a data file
// TestVerifyDamagedFiles checks.
const damageVariants = 300

// damageDir writes a data directory whose file holds several runs in
// commit groups of many sizes (single records and blocks), idempotency
// keys, checkpoints and the other packages' buckets, and returns it with
// every event as stored.
func damageDir(tb testing.TB) (string, []auditd.Event) {
	tb.Helper()
	dir := tb.TempDir()
	db, err := openDB(dir, false)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, CheckpointEvery: 8})
	if err != nil {
		tb.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for g := range 60 {
		var batch []auditd.Event
		for i := range 1 + rng.IntN(12) {
			batch = append(batch, auditd.Event{Type: auditd.EventDispatch, RunID: fmt.Sprintf("run-%d", rng.IntN(4)),
				SourceID: "county", ItemKey: fmt.Sprintf("item-%d-%d", g, i), Attempt: 1, Method: "GET",
				Path: "/query?where=" + strings.Repeat("x", rng.IntN(300))})
		}
		if g%5 == 0 {
			batch = append(batch, auditd.Event{Type: auditd.EventSourceChanged, Principal: "op", IdempotencyKey: fmt.Sprintf("k%d", g)})
		}
		if _, err := l.AppendBatch(context.Background(), batch); err != nil {
			tb.Fatal(err)
		}
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte("other.bucket"))
		for i := 0; err == nil && i < 200; i++ {
			err = b.Put(fmt.Appendf(nil, "key-%04d", i), bytes.Repeat([]byte{byte(i)}, rng.IntN(200)))
		}
		return err
	}); err != nil {
		tb.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		tb.Fatal(err)
	}
	var events []auditd.Event
	if err := ledger.NewReader(db).Scan(1, 0, func(e *auditd.Event) error {
		events = append(events, *e)
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	db.Close()
	return dir, events
}

// damage changes file (a bbolt file of 4 KiB pages) as variant v says: bytes
// flipped in a page, a page zeroed, overwritten with another or with noise,
// two pages swapped, or the file cut short. It says what it did.
func damage(file []byte, v int) ([]byte, string) {
	const page = 4096
	rng := rand.New(rand.NewPCG(uint64(v), 17))
	pages := len(file) / page
	p, q := rng.IntN(pages), rng.IntN(pages)
	at := func(n int) []byte { return file[n*page : (n+1)*page] }
	switch v % 6 {
	case 0:
		n := 1 + rng.IntN(8)
		for range n {
			at(p)[rng.IntN(page)] ^= byte(1 + rng.IntN(255))
		}
		return file, fmt.Sprintf("%d bytes flipped in page %d", n, p)
	case 1:
		clear(at(p))
		return file, fmt.Sprintf("page %d zeroed", p)
	case 2:
		copy(at(p), at(q))
		return file, fmt.Sprintf("page %d overwritten with page %d", p, q)
	case 3:
		off := rng.IntN(page - 64)
		for i := range 1 + rng.IntN(64) {
			at(p)[off+i] = byte(rng.Uint32())
		}
		return file, fmt.Sprintf("noise in page %d at %d", p, off)
	case 4:
		a, b := bytes.Clone(at(p)), bytes.Clone(at(q))
		copy(at(p), b)
		copy(at(q), a)
		return file, fmt.Sprintf("pages %d and %d swapped", p, q)
	default:
		n := rng.IntN(len(file))
		return file[:n], fmt.Sprintf("cut to %d of %d bytes", n, len(file))
	}
}

// TestVerifyDamagedFiles damages copies of a data file page by page, a
// seeded variant at a time: verify never panics or faults (the test would
// die), exits 0 or 1, and never says "intact" of a file that bbolt's own
// check, the chain, the indexes or the events themselves show damaged.
func TestVerifyDamagedFiles(t *testing.T) {
	pristine, events := damageDir(t)
	orig, err := os.ReadFile(filepath.Join(pristine, dbFile))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(filepath.Join(pristine, "ledger.pub"))
	if err != nil {
		t.Fatal(err)
	}
	// bbolt grows its file ahead of use: damage goes to the pages below
	// its high-water mark, the ones it reads.
	orig = orig[:highWater(t, orig)*4096]
	if ledger.CheckFile(filepath.Join(pristine, dbFile)) != nil {
		t.Fatal("the pristine file does not pass CheckFile")
	}
	t.Logf("data file of %d pages in use, %d events", len(orig)/4096, len(events))
	var intact, notIntact int
	kinds := map[string]int{} // which layer found it
	defer func() { t.Logf("found by: %v", kinds) }()
	for v := range damageVariants {
		dir := t.TempDir()
		file, what := damage(bytes.Clone(orig), v)
		if err := os.WriteFile(filepath.Join(dir, dbFile), file, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "ledger.pub"), pub, 0o644); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"verify", "--data", dir}, &stdout, &stderr)
		switch code {
		case 1:
			notIntact++
			kind := "chain"
			switch o := stdout.String(); {
			case strings.Contains(o, "data file damaged"):
				kind = "checkfile"
			case strings.Contains(o, "data file:"):
				kind = "txcheck"
			case strings.Contains(o, "cannot open"):
				kind = "open"
			case strings.Contains(o, "index"):
				kind = "index"
			}
			kinds[kind]++
			if !strings.Contains(stdout.String(), "NOT intact") {
				t.Errorf("variant %d (%s): exit 1 without a finding: %s", v, what, stdout.String())
			}
			continue
		case 0:
			intact++
		default:
			t.Errorf("variant %d (%s): exit %d\n%s%s", v, what, code, stdout.String(), stderr.String())
			continue
		}
		// Said intact: the damage must have missed everything that matters.
		if err := stillIntact(dir, events); err != nil {
			t.Errorf("variant %d (%s): verify says intact, but %v\n%s", v, what, err, stdout.String())
		}
	}
	t.Logf("%d variants: %d found not intact, %d intact (damage where nothing is read)", damageVariants, notIntact, intact)
	if notIntact < damageVariants/2 {
		t.Errorf("only %d of %d damaged files found: the damage reaches too little to test", notIntact, damageVariants)
	}
}

// highWater reads the high-water mark (pages in use) of a bbolt file of
// 4 KiB pages from its newer meta page.
func highWater(tb testing.TB, file []byte) int {
	tb.Helper()
	var best, txid uint64
	for _, off := range []int{0, 4096} {
		m := file[off+16:]
		if t := binary.LittleEndian.Uint64(m[48:]); t >= txid {
			best, txid = binary.LittleEndian.Uint64(m[40:]), t
		}
	}
	if best < 2 || int(best)*4096 > len(file) {
		tb.Fatalf("high-water mark %d of a file of %d bytes", best, len(file))
	}
	return int(best)
}

// stillIntact checks a file verify called intact the long way round: its
// pages pass bbolt's check and every event reads back as it was stored.
func stillIntact(dir string, want []auditd.Event) error {
	path := filepath.Join(dir, dbFile)
	if err := ledger.CheckFile(path); err != nil {
		return err
	}
	db, err := bolt.Open(path, 0o600, ledger.BoltOptions(true))
	if err != nil {
		return err
	}
	defer db.Close()
	err = db.View(func(tx *bolt.Tx) error {
		for err := range tx.Check() {
			return fmt.Errorf("bbolt's check: %v", err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	i := 0
	err = ledger.NewReader(db).Scan(1, 0, func(e *auditd.Event) error {
		if i >= len(want) || e.Seq != want[i].Seq || e.Hash != want[i].Hash || e.PrevHash != want[i].PrevHash {
			return fmt.Errorf("event %d reads back changed", e.Seq)
		}
		i++
		return nil
	})
	if err == nil && i != len(want) {
		err = fmt.Errorf("%d of %d events read back", i, len(want))
	}
	return err
}
