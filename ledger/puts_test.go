package ledger_test

import (
	"context"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// side is a bucket outside the ledger's own, as the staging spool is.
var side = []byte("test.side")

func mustCreateBucket(tb testing.TB, db *bolt.DB, name []byte) {
	tb.Helper()
	if err := db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(name)
		return err
	}); err != nil {
		tb.Fatal(err)
	}
}

func get(tb testing.TB, db *bolt.DB, bucket []byte, key string) string {
	tb.Helper()
	var v []byte
	if err := db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucket); b != nil {
			v = append([]byte(nil), b.Get([]byte(key))...)
		}
		return nil
	}); err != nil {
		tb.Fatal(err)
	}
	return string(v)
}

// addWait adds events with puts and waits for them.
func addWait(ctx context.Context, l *ledger.Ledger, events []auditd.Event, puts []auditd.Put) ([]auditd.Event, error) {
	f, err := l.Add(events, puts...)
	if err != nil {
		return nil, err
	}
	if err := f.Wait(ctx); err != nil {
		return nil, err
	}
	return events, nil
}

func TestAddStoresPutsWithEvents(t *testing.T) {
	db := MustOpenDB(t)
	mustCreateBucket(t, db, side)
	l := MustOpen(t, db, ledger.Options{})
	before := l.Stats()

	got, err := addWait(context.Background(), l,
		[]auditd.Event{sampleEvent("r", 1), sampleEvent("r", 2)},
		[]auditd.Put{{Bucket: side, Key: []byte("a"), Value: []byte("1")}, {Bucket: side, Key: []byte("b"), Value: []byte("2")}})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].Seq != 1 || got[1].Seq != 2 {
		t.Fatalf("events came back as %+v", got)
	}
	if a, b := get(t, db, side, "a"), get(t, db, side, "b"); a != "1" || b != "2" {
		t.Fatalf("puts stored as a=%q b=%q", a, b)
	}
	st := l.Stats()
	if st.Groups-before.Groups != 1 || st.Events-before.Events != 2 {
		t.Fatalf("stats moved by %d groups and %d events, want 1 and 2", st.Groups-before.Groups, st.Events-before.Events)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// A put that would fail its commit group is refused before it joins one:
// nothing of the append is written, and the other appenders are not hurt.
func TestAddRefusesBadPuts(t *testing.T) {
	db := MustOpenDB(t)
	mustCreateBucket(t, db, side)
	l := MustOpen(t, db, ledger.Options{})
	ctx := context.Background()
	cases := map[string]auditd.Put{
		"MissingBucket": {Bucket: []byte("test.nope"), Key: []byte("k"), Value: []byte("v")},
		"LedgerBucket":  {Bucket: []byte("ledger.events"), Key: []byte("k"), Value: []byte("v")},
		"EmptyKey":      {Bucket: side, Value: []byte("v")},
		"HugeKey":       {Bucket: side, Key: make([]byte, bolt.MaxKeySize+1), Value: []byte("v")},
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := addWait(ctx, l, []auditd.Event{sampleEvent("r", 1)}, []auditd.Put{p})
			if auditd.ErrorCode(err) != auditd.EINVALID {
				t.Fatalf("got %v, want an EINVALID refusal", err)
			}
			if seq, _ := l.Head(); seq != 0 {
				t.Fatalf("a refused append recorded %d events", seq)
			}
		})
	}
	t.Run("NoEvents", func(t *testing.T) {
		_, err := addWait(ctx, l, nil, []auditd.Put{{Bucket: side, Key: []byte("k"), Value: []byte("v")}})
		if auditd.ErrorCode(err) != auditd.EINVALID {
			t.Fatalf("puts without an event: got %v, want EINVALID", err)
		}
		if v := get(t, db, side, "k"); v != "" {
			t.Fatalf("a refused put was stored: %q", v)
		}
	})
	// The ledger still takes appends afterwards.
	if _, err := addWait(ctx, l, []auditd.Event{sampleEvent("r", 1)}, []auditd.Put{{Bucket: side, Key: []byte("k"), Value: []byte("v")}}); err != nil {
		t.Fatal(err)
	}
	if v := get(t, db, side, "k"); v != "v" {
		t.Fatalf("put stored as %q", v)
	}
}

// An Add repeated whole under the same idempotency keys records nothing
// and stores nothing: its puts came with the first.
func TestAddRepeatKeepsFirstPuts(t *testing.T) {
	db := MustOpenDB(t)
	mustCreateBucket(t, db, side)
	l := MustOpen(t, db, ledger.Options{})
	ctx := context.Background()
	e := sampleEvent("r", 1)
	e.IdempotencyKey = "r/parcels-0001/finished"
	first, err := addWait(ctx, l, []auditd.Event{e}, []auditd.Put{{Bucket: side, Key: []byte("result"), Value: []byte("first")}})
	if err != nil {
		t.Fatal(err)
	}
	again, err := addWait(ctx, l, []auditd.Event{e}, []auditd.Put{{Bucket: side, Key: []byte("result"), Value: []byte("second")}})
	if err != nil {
		t.Fatal(err)
	}
	if again[0].Seq != first[0].Seq {
		t.Fatalf("the repeat was recorded again, as %d", again[0].Seq)
	}
	if v := get(t, db, side, "result"); v != "first" {
		t.Fatalf("the repeat's put overwrote the first: %q", v)
	}
}
