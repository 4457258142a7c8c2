package staging

import (
	"encoding/binary"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Entries written before the index recorded runs (fetched at, then the
// hash alone) still read back, with no run; new entries and recent records
// keep theirs.
func TestDecodeLastGoodBothFormats(t *testing.T) {
	at := time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC)
	sum := "7d865e959b2466918c9863afca942d0fb89d7c9ac0c99bafc3749504ded97730"
	old := append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), sum...)
	if c, ok := decodeLastGood(old); !ok || c != (Copy{Sum: sum, FetchedAt: at}) {
		t.Errorf("old entry: %+v %v", c, ok)
	}
	want := Copy{Sum: sum, FetchedAt: at, Run: "01JRUN"}
	if c, ok := decodeLastGood(appendLastGood(nil, want)); !ok || c != want {
		t.Errorf("new entry: %+v %v, want %+v", c, ok, want)
	}
	for _, h := range []Copy{
		{Sum: sum, FetchedAt: at, Run: "01JRUN", ContentType: "application/json; charset=utf-8"},
		{Sum: sum, FetchedAt: at, ContentType: "text/xml", ContentEncoding: "br"},
		{Sum: sum, FetchedAt: at, Run: "01JRUN", ContentEncoding: "gzip"},
	} {
		if c, ok := decodeLastGood(appendLastGood(nil, h)); !ok || c != h {
			t.Errorf("entry with headers: %+v %v, want %+v", c, ok, h)
		}
	}
	want.ContentType = "application/geo+json"
	s := &Store{recent: newRecentCopies()}
	rec := s.LastGoodRecord("req", want)
	if key, rk, c, ok := decodeRecent(rec.Key, rec.Value); !ok || key != 1 || rk != "req" || c != want {
		t.Errorf("recent record: %d %q %+v %v", key, rk, c, ok)
	}
	if _, ok := decodeLastGood(old[:8]); ok {
		t.Error("an entry with no hash decodes")
	}
}

// storeRecord stores rec as the ledger would, in a transaction of its own.
func storeRecord(t *testing.T, db *bolt.DB, rec auditd.Put) {
	t.Helper()
	if err := db.Update(func(tx *bolt.Tx) error { return tx.Bucket(rec.Bucket).Put(rec.Key, rec.Value) }); err != nil {
		t.Fatal(err)
	}
}

// A copy is its request's last good one from the moment its record is
// stored and Stored says so, before any compaction; a compaction moves it
// into the index; a crash between the commit and Stored loses nothing (Open
// compacts); a newer copy wins over an older, wherever each is kept; a
// purge removes a recent copy too.
func TestRecentCopies(t *testing.T) {
	db, s, reopen := openInternal(t)
	t0 := time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC)
	sum := func(c byte) string { return strings.Repeat(string(c), 64) }
	a := Copy{Sum: sum('a'), FetchedAt: t0, Run: "run-1"}
	got := func(key string) Copy {
		t.Helper()
		c, _, err := s.LastGood(key)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}

	rec := s.LastGoodRecord("req-1", a)
	if _, ok, _ := s.LastGood("req-1"); ok {
		t.Fatal("a copy is usable before its record is stored")
	}
	storeRecord(t, db, rec)
	s.Stored([]auditd.Put{rec})
	if c := got("req-1"); c != a {
		t.Fatalf("stored, not compacted: %+v, want %+v", c, a)
	}
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	if c := got("req-1"); c != a || len(s.recent.byKey) != 0 {
		t.Fatalf("after compaction: %+v (%d recent), want %+v from the index", c, len(s.recent.byKey), a)
	}

	// An older copy recorded later does not replace a newer one, in memory
	// or in the index.
	b := Copy{Sum: sum('b'), FetchedAt: t0.Add(time.Minute), Run: "run-2"}
	older := Copy{Sum: sum('c'), FetchedAt: t0.Add(30 * time.Second), Run: "run-3"}
	for _, c := range []Copy{b, older} {
		rec := s.LastGoodRecord("req-1", c)
		storeRecord(t, db, rec)
		s.Stored([]auditd.Put{rec})
	}
	if c := got("req-1"); c != b {
		t.Fatalf("recent: %+v, want the newest %+v", c, b)
	}
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	if c := got("req-1"); c != b {
		t.Fatalf("compacted: %+v, want the newest %+v", c, b)
	}

	// Stored after a compaction moved the record: nothing kept twice.
	late := s.LastGoodRecord("req-2", a)
	storeRecord(t, db, late)
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	s.Stored([]auditd.Put{late})
	if c := got("req-2"); c != a || len(s.recent.byKey) != 0 {
		t.Fatalf("late Stored: %+v, %d recent", c, len(s.recent.byKey))
	}

	// A record whose transaction failed is forgotten: never usable.
	failed := s.LastGoodRecord("req-5", Copy{Sum: sum('f'), FetchedAt: t0, Run: "run-6"})
	s.Unspool(failed)
	s.Stored([]auditd.Put{failed}) // as if: it must not resurrect it
	if c, ok, _ := s.LastGood("req-5"); ok || len(s.recent.pending) != 0 {
		t.Fatalf("an unspooled record is usable (%+v) or pending (%d)", c, len(s.recent.pending))
	}

	// A crash after the commit, before Stored: the next Open compacts it.
	lost := Copy{Sum: sum('d'), FetchedAt: t0.Add(time.Hour), Run: "run-4"}
	storeRecord(t, db, s.LastGoodRecord("req-3", lost))
	s = reopen()
	if c := got("req-3"); c != lost {
		t.Fatalf("after a reopen: %+v, want %+v", c, lost)
	}

	// A purge removes the copies naming its payloads, recent ones too.
	gone := Copy{Sum: sum('e'), FetchedAt: t0.Add(2 * time.Hour), Run: "run-5"}
	rec = s.LastGoodRecord("req-4", gone)
	storeRecord(t, db, rec)
	s.Stored([]auditd.Put{rec})
	if err := s.Purge(99, []string{gone.Sum}); err != nil {
		t.Fatal(err)
	}
	if c, ok, _ := s.LastGood("req-4"); ok {
		t.Fatalf("a purged recent copy is still the last good one: %+v", c)
	}
	if _, err := s.Compact(); err != nil {
		t.Fatal(err)
	}
	if c, ok, _ := s.LastGood("req-4"); ok {
		t.Fatalf("a purged copy came back with the compaction: %+v", c)
	}
}
