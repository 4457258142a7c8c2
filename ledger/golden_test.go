package ledger_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// updateGolden rewrites testdata/v1/auditd.db (and, when they are missing,
// its key pair) from testdata/v1/events.ndjson. The committed file was
// written by commit eb97ac6, before the event fields that say why were
// split by type; TestGoldenLedgerV1 holds every later build to reading it
// and to writing the same bytes.
var updateGolden = flag.Bool("update-golden", false, "rewrite testdata/v1/auditd.db from testdata/v1/events.ndjson")

const goldenDir = "testdata/v1"

// goldenEvent is one line of testdata/v1/events.ndjson: an event in the
// shape of the API's event JSON (durations in nanoseconds), with the group
// of appends it belongs to and the fake clock's offset from epoch then.
type goldenEvent struct {
	GroupID        int    `json:"group_id"`
	At             int64  `json:"at"`
	Type           string `json:"type"`
	RunID          string `json:"run_id"`
	SourceID       string `json:"source_id"`
	ItemKey        string `json:"item_key"`
	Page           uint32 `json:"page"`
	Attempt        uint32 `json:"attempt"`
	IdempotencyKey string `json:"idempotency_key"`
	Method         string `json:"method"`
	Path           string `json:"path"`
	Status         int    `json:"status"`
	Bytes          int64  `json:"bytes"`
	Latency        int64  `json:"latency"`
	Wait           int64  `json:"wait"`
	Actual         int64  `json:"actual"`
	RetryAfterRaw  string `json:"retry_after_raw"`
	RetryAfter     int64  `json:"retry_after"`
	Clamped        bool   `json:"clamped"`
	Backoff        int64  `json:"backoff"`
	From           string `json:"from"`
	To             string `json:"to"`
	Failures       int    `json:"failures"`
	Threshold      int    `json:"threshold"`
	Cooldown       int64  `json:"cooldown"`
	OldLimit       int    `json:"old_limit"`
	NewLimit       int    `json:"new_limit"`
	OldWindow      int64  `json:"old_window"`
	NewWindow      int64  `json:"new_window"`
	Group          string `json:"group"`
	Outcome        string `json:"outcome"`
	BodyError      string `json:"body_error"`
	PayloadHash    string `json:"payload_hash"`
	Cause          string `json:"cause"`
	Principal      string `json:"principal"`
	Detail         string `json:"detail"`
}

func (g goldenEvent) event(tb testing.TB) auditd.Event {
	tb.Helper()
	e := auditd.Event{
		Type: auditd.EventType(g.Type), RunID: g.RunID, SourceID: g.SourceID, ItemKey: g.ItemKey,
		Page: g.Page, IdempotencyKey: g.IdempotencyKey, Method: g.Method, Path: g.Path,
		Status: g.Status, Bytes: g.Bytes, Latency: time.Duration(g.Latency), Wait: time.Duration(g.Wait),
		Actual: time.Duration(g.Actual), RetryAfterRaw: g.RetryAfterRaw, RetryAfter: time.Duration(g.RetryAfter),
		Clamped: g.Clamped, Backoff: time.Duration(g.Backoff), From: g.From, To: g.To, Failures: g.Failures,
		Threshold: g.Threshold, Cooldown: time.Duration(g.Cooldown), OldLimit: g.OldLimit, NewLimit: g.NewLimit,
		OldWindow: time.Duration(g.OldWindow), NewWindow: time.Duration(g.NewWindow), Group: g.Group,
		Outcome: auditd.Outcome(g.Outcome), BodyError: g.BodyError, PayloadHash: g.PayloadHash,
		Principal: g.Principal, Detail: g.Detail,
	}
	if err := e.SetShared(g.Attempt, g.Cause); err != nil {
		tb.Fatal(err)
	}
	return e
}

// goldenGroups reads testdata/v1/events.ndjson as groups of events appended
// together, with the clock's offset from epoch for each group.
func goldenGroups(tb testing.TB) (groups [][]auditd.Event, at []time.Duration) {
	tb.Helper()
	f, err := os.Open(filepath.Join(goldenDir, "events.ndjson"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	last := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var g goldenEvent
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			tb.Fatalf("%s: %v", sc.Text(), err)
		}
		if g.GroupID != last {
			groups, at, last = append(groups, nil), append(at, time.Duration(g.At)), g.GroupID
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], g.event(tb))
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return groups, at
}

// writeGolden appends the golden events to a new ledger in dir, each group
// in one commit at its own time of a fake clock, and returns them as
// stored and the last checkpoint.
func writeGolden(tb testing.TB, dir string) ([]auditd.Event, []byte) {
	tb.Helper()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	clk := clock.NewFake(epoch)
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk, CheckpointEvery: 8})
	if err != nil {
		tb.Fatal(err)
	}
	groups, at := goldenGroups(tb)
	var stored []auditd.Event
	for i, g := range groups {
		clk.Set(epoch.Add(at[i]))
		got, err := l.AppendBatch(context.Background(), g)
		if err != nil {
			tb.Fatal(err)
		}
		stored = append(stored, got...)
	}
	note, err := l.Checkpoint()
	if err != nil {
		tb.Fatal(err)
	}
	if err := l.Close(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return stored, note
}

// TestGoldenLedgerV1: a ledger written by an earlier build (testdata/v1)
// verifies, reads back as the events it was written from, re-hashes to the
// hashes it stores, and this build, given the same events, clock and key,
// writes the same hashes and signs the same checkpoint.
func TestGoldenLedgerV1(t *testing.T) {
	if *updateGolden {
		os.Remove(filepath.Join(goldenDir, "auditd.db"))
		writeGolden(t, goldenDir)
	}
	src, err := os.ReadFile(filepath.Join(goldenDir, "auditd.db"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "auditd.db"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	key, err := ledger.ReadPublicKey(goldenDir)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: key})
	if err != nil || !rep.OK {
		t.Fatalf("golden ledger does not verify: %+v, %v", rep, err)
	}

	groups, at := goldenGroups(t)
	var want []auditd.Event
	for i, g := range groups {
		for _, e := range g {
			e.Time, e.Mono = epoch.Add(at[i]), at[i]
			want = append(want, e)
		}
	}
	if rep.Events != uint64(len(want)) {
		t.Fatalf("golden ledger holds %d events, events.ndjson %d", rep.Events, len(want))
	}
	var got []auditd.Event
	var buf []byte
	var prev [32]byte
	if err := ledger.NewReader(db).Scan(1, 0, func(e *auditd.Event) error {
		var h [32]byte
		h, buf = ledger.HashEvent(buf, prev, e)
		if h != e.Hash || e.PrevHash != prev {
			t.Errorf("event %d (%s) re-hashes to %x, stored %x", e.Seq, e.Type, h, e.Hash)
		}
		prev = e.Hash
		got = append(got, *e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		g := got[i]
		g.Seq, g.PrevHash, g.Hash = 0, [32]byte{}, [32]byte{}
		if g != want[i] {
			t.Errorf("event %d reads as\n%+v\nwant\n%+v", i+1, g, want[i])
		}
	}

	// The same events, clock and key give the same ledger.
	again := t.TempDir()
	for _, name := range []string{ledger.PrivateKeyFile, ledger.PublicKeyFile} {
		b, err := os.ReadFile(filepath.Join(goldenDir, name))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(again, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	rewritten, note := writeGolden(t, again)
	for i := range rewritten {
		if rewritten[i].Hash != got[i].Hash {
			t.Errorf("event %d (%s) is written as %x, the golden ledger holds %x", i+1, got[i].Type, rewritten[i].Hash, got[i].Hash)
		}
	}
	var latest []byte
	if err := db.View(func(tx *bolt.Tx) error {
		latest = bytes.Clone(tx.Bucket([]byte("ledger.meta")).Get([]byte("checkpoint")))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(note, latest) {
		t.Errorf("the rewritten ledger's checkpoint is\n%s\nthe golden one\n%s", note, latest)
	}
}
