package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

var epoch = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// MustOpenDB opens a bbolt file in a fresh temporary directory, closed at
// the end of the test.
func MustOpenDB(tb testing.TB) *bolt.DB {
	tb.Helper()
	return MustOpenDBAt(tb, filepath.Join(tb.TempDir(), "auditd.db"))
}

// MustOpenDBAt opens the bbolt file at path, closed at the end of the test,
// with the options cmd/auditd opens it with (ledger.BoltOptions).
func MustOpenDBAt(tb testing.TB, path string) *bolt.DB {
	tb.Helper()
	db, err := bolt.Open(path, 0o600, ledger.BoltOptions(false))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// MustOpen opens a ledger on db, closed at the end of the test.
func MustOpen(tb testing.TB, db *bolt.DB, opts ledger.Options) *ledger.Ledger {
	tb.Helper()
	l, err := ledger.Open(db, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close(context.Background()) })
	return l
}

// sampleEvent is a dispatch of item i of run; every call with the same
// arguments gives the same event.
func sampleEvent(run string, i int) auditd.Event {
	return auditd.Event{
		Type: auditd.EventDispatch, RunID: run, SourceID: "county-gis",
		ItemKey: fmt.Sprintf("parcels-%04d", i), Attempt: 1, Method: "GET",
		Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?resultOffset=%d", i*1000),
	}
}

// fullEvent sets every field, so a round trip that drops one fails.
func fullEvent() auditd.Event {
	return auditd.Event{
		Type: auditd.EventThrottle, RunID: "01J0RUN", SourceID: "grants-gov", ItemKey: "search-1",
		Page: 3, Attempt: 2, IdempotencyKey: "01J0RUN/search-1/3/2/throttle",
		Method: "POST", Path: "/v1/api/search2", Status: 429, Bytes: -1, Latency: 120 * time.Millisecond,
		Wait: 30 * time.Second, Actual: 31 * time.Second, RetryAfterRaw: "Wed, 21 Oct 2026 07:28:00 GMT",
		RetryAfter: 29 * time.Second, Clamped: true, Backoff: 2 * time.Second, From: "closed", To: "open",
		Failures: 5, Threshold: 5, Cooldown: time.Minute, OldLimit: 60, NewLimit: 30,
		OldWindow: time.Minute, NewWindow: 2 * time.Minute, Group: "esri-gateway",
		Outcome: auditd.OutcomeThrottled, BodyError: "498", PayloadHash: "ab12", Reason: "429",
		Principal: "ops@example.gov", Detail: `{"award":{"fain":"X"}}`,
	}
}

func TestAppendRoundTrip(t *testing.T) {
	fake := clock.NewFake(epoch)
	l := MustOpen(t, MustOpenDB(t), ledger.Options{Clock: fake})
	ctx := context.Background()

	in := []auditd.Event{fullEvent(), sampleEvent("r1", 1), {Type: auditd.EventSourceChanged, Seq: 99, Hash: [32]byte{1}}}
	var out []auditd.Event
	for i, e := range in {
		fake.Advance(time.Duration(i+1) * time.Millisecond)
		got, err := l.Append(ctx, e)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		out = append(out, got)
	}

	var prev [32]byte
	for i, got := range out {
		t.Run(string(got.Type), func(t *testing.T) {
			want := in[i]
			want.Seq, want.Time, want.Mono, want.PrevHash, want.Hash = uint64(i+1), got.Time, got.Mono, prev, got.Hash
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("Append returned\n%+v\nwant\n%+v", got, want)
			}
			if got.PrevHash != prev || got.Hash == ([32]byte{}) {
				t.Fatalf("chain: prev %x hash %x", got.PrevHash, got.Hash)
			}
			stored, err := l.Event(got.Seq)
			if err != nil || !reflect.DeepEqual(stored, got) {
				t.Fatalf("Event(%d) = %+v, %v; want %+v", got.Seq, stored, err, got)
			}
		})
		prev = got.Hash
	}
	// The clock, not the caller, stamps events: UTC wall time and the
	// offset since Open.
	if want := epoch.Add(6 * time.Millisecond); !out[2].Time.Equal(want) || out[2].Time.Location() != time.UTC || out[2].Mono != 6*time.Millisecond {
		t.Fatalf("event 3 stamped %v mono %v, want %v mono 6ms", out[2].Time, out[2].Mono, want)
	}

	var scanned []auditd.Event
	if err := l.Scan(0, 0, func(e *auditd.Event) error { scanned = append(scanned, *e); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(scanned, out) {
		t.Fatalf("Scan returned %d events, differing from what Append returned", len(scanned))
	}
	if seq, hash := l.Head(); seq != 3 || hash != out[2].Hash {
		t.Fatalf("Head = %d %x, want 3 %x", seq, hash, out[2].Hash)
	}
}

func TestScanRange(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	appendN(t, l, "r", 10)
	for _, tc := range []struct {
		name     string
		from, to uint64
		want     []uint64
	}{
		{"All", 0, 0, seqs(1, 10)},
		{"FromOnly", 8, 0, seqs(8, 10)},
		{"Inner", 3, 5, seqs(3, 5)},
		{"One", 4, 4, seqs(4, 4)},
		{"PastHead", 11, 0, nil},
		{"ToPastHead", 9, 50, seqs(9, 10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []uint64
			if err := l.Scan(tc.from, tc.to, func(e *auditd.Event) error { got = append(got, e.Seq); return nil }); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Scan(%d, %d) = %v, want %v", tc.from, tc.to, got, tc.want)
			}
		})
	}
	t.Run("StopsOnError", func(t *testing.T) {
		stop := errors.New("stop")
		n := 0
		err := l.Scan(0, 0, func(*auditd.Event) error { n++; return stop })
		if !errors.Is(err, stop) || n != 1 {
			t.Fatalf("Scan returned %v after %d events", err, n)
		}
	})
}

func TestScanRun(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	ctx := context.Background()
	// Interleaved runs, one id a prefix of the other, and a service event.
	want := map[string][]uint64{}
	for i := range 12 {
		run := []string{"run1", "run10", ""}[i%3]
		e, err := l.Append(ctx, sampleEvent(run, i))
		if err != nil {
			t.Fatal(err)
		}
		want[run] = append(want[run], e.Seq)
	}
	for _, tc := range []struct {
		name  string
		run   string
		after uint64
		want  []uint64
	}{
		{"Run", "run1", 0, want["run1"]},
		{"PrefixOfAnother", "run10", 0, want["run10"]},
		{"After", "run1", 4, want["run1"][2:]},
		{"Unknown", "run2", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []uint64
			err := l.ScanRun(tc.run, tc.after, func(e *auditd.Event) error {
				if e.RunID != tc.run {
					t.Errorf("event %d of run %q in scan of %q", e.Seq, e.RunID, tc.run)
				}
				got = append(got, e.Seq)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("ScanRun(%q, %d) = %v, want %v", tc.run, tc.after, got, tc.want)
			}
		})
	}
}

func TestIdempotency(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auditd.db")
	db := MustOpenDBAt(t, path)
	l := MustOpen(t, db, ledger.Options{})
	ctx := context.Background()

	e := sampleEvent("r", 1)
	e.IdempotencyKey = "r/parcels-0001/0/1/dispatch"
	first, err := l.Append(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("Again", func(t *testing.T) {
		again := e
		again.Path = "/different"
		got, err := l.Append(ctx, again)
		if err != nil || !reflect.DeepEqual(got, first) {
			t.Fatalf("second append = %+v, %v; want the first event", got, err)
		}
		if seq, _ := l.Head(); seq != 1 {
			t.Fatalf("head %d after a repeated key, want 1", seq)
		}
	})
	t.Run("InOneBatch", func(t *testing.T) {
		e2 := sampleEvent("r", 2)
		e2.IdempotencyKey = "batch-key"
		got, err := l.AppendBatch(ctx, []auditd.Event{e2, e2, e})
		if err != nil {
			t.Fatal(err)
		}
		if got[0].Seq != 2 || !reflect.DeepEqual(got[1], got[0]) || !reflect.DeepEqual(got[2], first) {
			t.Fatalf("batch returned seqs %d %d %d, want 2 2 1", got[0].Seq, got[1].Seq, got[2].Seq)
		}
	})
	t.Run("AfterReopen", func(t *testing.T) {
		if err := l.Close(ctx); err != nil {
			t.Fatal(err)
		}
		l2 := MustOpen(t, db, ledger.Options{})
		got, err := l2.Append(ctx, e)
		if err != nil || !reflect.DeepEqual(got, first) {
			t.Fatalf("append after reopen = %+v, %v; want the first event", got, err)
		}
	})
}

func TestConcurrentAppenders(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{MaxGroup: 16})
	const workers, each = 8, 60
	var wg sync.WaitGroup
	results := make([][]auditd.Event, workers)
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				e, err := l.Append(context.Background(), sampleEvent(fmt.Sprintf("run-%d", w), i))
				if err != nil {
					errs <- err
					return
				}
				results[w] = append(results[w], e)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	seen := make(map[uint64]bool)
	for w, evs := range results {
		for i, e := range evs {
			if seen[e.Seq] {
				t.Fatalf("seq %d handed out twice", e.Seq)
			}
			seen[e.Seq] = true
			// One appender's events keep its order.
			if i > 0 && e.Seq <= evs[i-1].Seq {
				t.Fatalf("worker %d: seq %d after %d", w, e.Seq, evs[i-1].Seq)
			}
		}
	}
	if seq, _ := l.Head(); seq != workers*each || len(seen) != workers*each {
		t.Fatalf("head %d, %d distinct seqs, want %d", seq, len(seen), workers*each)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

func TestReopenContinuesChain(t *testing.T) {
	dir := t.TempDir()
	db := MustOpenDBAt(t, filepath.Join(dir, "auditd.db"))
	ctx := context.Background()
	l := MustOpen(t, db, ledger.Options{})
	last := appendN(t, l, "r", 5)
	key := l.PublicKey()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, sampleEvent("r", 9)); !errors.Is(err, ledger.ErrClosed) {
		t.Fatalf("append after Close: %v, want ErrClosed", err)
	}
	for _, name := range []string{ledger.PrivateKeyFile, ledger.PublicKeyFile} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v mode %v, want 0600", name, err, fi.Mode())
		}
	}

	l2 := MustOpen(t, db, ledger.Options{})
	if l2.PublicKey() != key {
		t.Fatalf("reopen changed the key")
	}
	if seq, hash := l2.Head(); seq != 5 || hash != last.Hash {
		t.Fatalf("reopened head %d, want 5", seq)
	}
	e, err := l2.Append(ctx, sampleEvent("r", 6))
	if err != nil || e.Seq != 6 || e.PrevHash != last.Hash {
		t.Fatalf("append after reopen: seq %d prev %x, %v", e.Seq, e.PrevHash, err)
	}
	mustVerify(t, db, key, nil)
}

func TestOpenWithoutKeyFails(t *testing.T) {
	dir := t.TempDir()
	db := MustOpenDBAt(t, filepath.Join(dir, "auditd.db"))
	l := MustOpen(t, db, ledger.Options{})
	appendN(t, l, "r", 1)
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(dir, ledger.PrivateKeyFile)); err != nil {
		t.Fatal(err)
	}
	if _, err := ledger.Open(db, ledger.Options{}); !errors.Is(err, ledger.ErrKeyMissing) {
		t.Fatalf("Open without the key of a non-empty ledger: %v, want ErrKeyMissing", err)
	}
}

func TestAppendRejects(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	for _, tc := range []struct {
		name string
		e    auditd.Event
	}{
		{"NoType", auditd.Event{RunID: "r"}},
		{"TooLarge", auditd.Event{Type: auditd.EventRunStarted, Detail: string(make([]byte, ledger.MaxEventSize))}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := l.Append(context.Background(), tc.e); auditd.ErrorCode(err) != auditd.EINVALID {
				t.Fatalf("Append: %v, want code %s", err, auditd.EINVALID)
			}
		})
	}
	if seq, _ := l.Head(); seq != 0 {
		t.Fatalf("rejected events were written: head %d", seq)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Append(ctx, sampleEvent("r", 1)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append with a cancelled context: %v", err)
	}
}

func TestCheckpointCoversHead(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	for _, n := range []int{0, 1, 6} {
		last := appendN(t, l, "r", n)
		msg, err := l.Checkpoint()
		if err != nil {
			t.Fatal(err)
		}
		tree, err := ledger.OpenCheckpoint(msg, l.PublicKey())
		if err != nil {
			t.Fatalf("checkpoint does not verify: %v\n%s", err, msg)
		}
		seq, hash := l.Head()
		if tree.Size != seq || tree.Chain != hash || (n > 0 && hash != last.Hash) {
			t.Fatalf("checkpoint size %d chain %x, head %d %x", tree.Size, tree.Chain, seq, hash)
		}
	}
}

func TestProve(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	appendN(t, l, "r", 13) // not a power of two: proofs cross partial subtrees
	key := l.PublicKey()
	for seq := uint64(1); seq <= 13; seq++ {
		p, err := l.Prove(seq)
		if err != nil {
			t.Fatal(err)
		}
		text, _ := p.MarshalText()
		var q ledger.Proof
		if err := q.UnmarshalText(text); err != nil {
			t.Fatalf("proof %d does not parse back: %v\n%s", seq, err, text)
		}
		e, tree, err := q.Verify(key)
		if err != nil || e.Seq != seq || tree.Size != 13 {
			t.Fatalf("proof of %d: event %d, tree %d, %v", seq, e.Seq, tree.Size, err)
		}
	}

	p, err := l.Prove(5)
	if err != nil {
		t.Fatal(err)
	}
	other := MustOpen(t, MustOpenDB(t), ledger.Options{KeyDir: t.TempDir()})
	for _, tc := range []struct {
		name   string
		key    string
		mutate func(p *ledger.Proof)
		want   error
	}{
		{"EditedRecord", key, func(p *ledger.Proof) { p.Record = append(p.Record[:len(p.Record)-1], 'X') }, ledger.ErrBadProof},
		{"OtherSeq", key, func(p *ledger.Proof) { p.Seq = 6 }, ledger.ErrBadProof},
		{"EditedPath", key, func(p *ledger.Proof) { p.Path[0][0] ^= 1 }, ledger.ErrBadProof},
		{"ShortPath", key, func(p *ledger.Proof) { p.Path = p.Path[1:] }, ledger.ErrBadProof},
		{"OtherKey", other.PublicKey(), func(*ledger.Proof) {}, ledger.ErrBadCheckpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q := *p
			q.Record = append([]byte(nil), p.Record...)
			q.Path = append(q.Path[:0:0], p.Path...)
			tc.mutate(&q)
			if _, _, err := q.Verify(tc.key); !errors.Is(err, tc.want) {
				t.Fatalf("Verify: %v, want %v", err, tc.want)
			}
		})
	}
	for _, seq := range []uint64{0, 14} {
		if _, err := l.Prove(seq); !errors.Is(err, ledger.ErrNotFound) {
			t.Fatalf("Prove(%d): %v, want ErrNotFound", seq, err)
		}
	}
}

func TestVerifyIntact(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{CheckpointEvery: 4})
	appendN(t, l, "r", 10)
	trusted, _ := l.Checkpoint()
	appendN(t, l, "r", 3)
	var calls int
	r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{
		VerifierKey: l.PublicKey(), Trusted: trusted,
		Progress: func(done, total uint64) { calls++ },
	})
	if err != nil {
		t.Fatal(err)
	}
	// History at 0, 4, 8, 12 (groups of one), the latest (13) and the trusted (10).
	if !r.OK || r.Events != 13 || r.Head != 13 || r.FirstBad != 0 || r.Checkpoints != 6 || calls == 0 {
		t.Fatalf("Verify = %+v (progress calls %d)", r, calls)
	}
}

// appendN appends n sample events of run one at a time (n commit groups)
// and returns the last.
func appendN(tb testing.TB, l *ledger.Ledger, run string, n int) auditd.Event {
	tb.Helper()
	var last auditd.Event
	for i := range n {
		var err error
		if last, err = l.Append(context.Background(), sampleEvent(run, i)); err != nil {
			tb.Fatal(err)
		}
	}
	return last
}

func mustVerify(tb testing.TB, db *bolt.DB, key string, trusted []byte) *ledger.Report {
	tb.Helper()
	r, err := ledger.Verify(context.Background(), db, ledger.VerifyOptions{VerifierKey: key, Trusted: trusted})
	if err != nil {
		tb.Fatal(err)
	}
	if !r.OK {
		tb.Fatalf("Verify: first bad %d: %s", r.FirstBad, r.Problem)
	}
	return r
}

func seqs(from, to uint64) []uint64 {
	var s []uint64
	for i := from; i <= to; i++ {
		s = append(s, i)
	}
	return s
}

func TestReaderOnReadOnlyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auditd.db")
	db := MustOpenDBAt(t, path)
	l := MustOpen(t, db, ledger.Options{})
	appendN(t, l, "r", 4)
	key := l.PublicKey()
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	ro, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	r := ledger.NewReader(ro)
	var got []uint64
	if err := r.ScanRun("r", 1, func(e *auditd.Event) error { got = append(got, e.Seq); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, seqs(2, 4)) {
		t.Fatalf("ScanRun on a read-only file = %v", got)
	}
	p, err := ledger.Prove(ro, 3, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.Verify(key); err != nil {
		t.Fatalf("offline proof: %v", err)
	}
	mustVerify(t, ro, key, nil)
}

// TestAddFillsInPlace: once Add's Future has waited, the events given to
// Add are what Append would return (the event as stored, read back the
// same), the first event for a repeated idempotency key; an event Add
// refuses is left untouched.
func TestAddFillsInPlace(t *testing.T) {
	ctx := context.Background()
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	if _, err := l.Append(ctx, sampleEvent("r", 1)); err != nil {
		t.Fatal(err)
	}
	add := func(e *auditd.Event) error {
		events := []auditd.Event{*e}
		f, err := l.Add(events)
		if err == nil {
			err = f.Wait(ctx)
		}
		if err == nil {
			*e = events[0]
		}
		return err
	}
	e := fullEvent()
	if err := add(&e); err != nil {
		t.Fatal(err)
	}
	if e.Seq != 2 || e.Time.IsZero() || e.Hash == ([32]byte{}) || e.PrevHash == ([32]byte{}) {
		t.Fatalf("Add left seq %d, time %v, hash %x, prev %x: not filled in", e.Seq, e.Time, e.Hash, e.PrevHash)
	}
	stored, err := l.Event(2)
	if err != nil || !reflect.DeepEqual(stored, e) {
		t.Fatalf("stored event 2 = %+v, %v\nAdd left %+v", stored, err, e)
	}

	again := fullEvent() // the same idempotency key
	again.Path = "/different"
	if err := add(&again); err != nil || !reflect.DeepEqual(again, e) {
		t.Fatalf("Add with a repeated key left %+v, %v; want the first event", again, err)
	}

	bad := []auditd.Event{{RunID: "no-type"}}
	if _, err := l.Add(bad); auditd.ErrorCode(err) != auditd.EINVALID {
		t.Fatalf("Add without a type: %v, want code %s", err, auditd.EINVALID)
	}
	if !reflect.DeepEqual(bad[0], auditd.Event{RunID: "no-type"}) {
		t.Fatalf("a refused event was changed: %+v", bad[0])
	}
	if seq, _ := l.Head(); seq != 2 {
		t.Fatalf("head %d, want 2", seq)
	}
}

// TestAddOrdersLaterAppends: events Add has queued are stored before
// whatever is added or appended after Add returns, even when those are
// appended before its Wait; Wait leaves in them the events as stored, and
// Then hands them over; after Close, Add refuses.
func TestAddOrdersLaterAppends(t *testing.T) {
	ctx := context.Background()
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	first := []auditd.Event{sampleEvent("r", 1)}
	f, err := l.Add(first)
	if err != nil {
		t.Fatal(err)
	}
	posted := make(chan auditd.Event, 1)
	second, err := l.Add([]auditd.Event{sampleEvent("r", 2)})
	if err != nil {
		t.Fatal(err)
	}
	second.Then(func(got []auditd.Event, err error) {
		if err != nil {
			t.Error(err)
		}
		posted <- got[0]
	})
	appended, err := l.Append(ctx, sampleEvent("r", 3))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(ctx); err != nil {
		t.Fatal(err)
	}
	p := <-posted
	if first[0].Seq != 1 || p.Seq != 2 || appended.Seq != 3 {
		t.Fatalf("stored as %d (added), %d (added after), %d (appended after): want 1, 2, 3", first[0].Seq, p.Seq, appended.Seq)
	}
	stored, err := l.Event(1)
	if err != nil || !reflect.DeepEqual(stored, first[0]) {
		t.Fatalf("stored event 1 = %+v, %v\nWait left %+v", stored, err, first[0])
	}

	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Add([]auditd.Event{sampleEvent("r", 4)}); !errors.Is(err, ledger.ErrClosed) {
		t.Fatalf("Add after Close: %v, want ErrClosed", err)
	}
}

// TestSeqAtFindsTheFirstEventAtOrAfter: SeqAt finds the first event recorded
// at or after a time, one past the head when none is, and 1 in an empty
// ledger.
func TestSeqAtFindsTheFirstEventAtOrAfter(t *testing.T) {
	ctx := context.Background()
	fake := clock.NewFake(epoch)
	l := MustOpen(t, MustOpenDB(t), ledger.Options{Clock: fake})
	if seq, err := l.SeqAt(epoch); err != nil || seq != 1 {
		t.Fatalf("empty ledger: SeqAt = %d, %v; want 1", seq, err)
	}
	// Events 1 to 3 at epoch, 4 to 6 a second later, 7 to 9 two seconds later.
	for i := range 9 {
		if i > 0 && i%3 == 0 {
			fake.Advance(time.Second)
		}
		if _, err := l.Append(ctx, sampleEvent("r", i)); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		at   time.Duration
		want uint64
	}{
		{-time.Hour, 1}, {0, 1}, {time.Nanosecond, 4}, {time.Second, 4},
		{1500 * time.Millisecond, 7}, {2 * time.Second, 7}, {3 * time.Second, 10},
	} {
		if seq, err := l.SeqAt(epoch.Add(c.at)); err != nil || seq != c.want {
			t.Errorf("SeqAt(epoch%+v) = %d, %v; want %d", c.at, seq, err, c.want)
		}
	}
}
