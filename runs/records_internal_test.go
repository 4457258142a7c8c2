package runs

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// filled returns a T with every field set to a value of its own, so a codec
// that leaves a field out (one added to the type later) fails its round
// trip. Fields tagged json:"-" (Item.SendPath, kept sealed apart) are
// never encoded and stay zero.
func filled[T any](t *testing.T, seed int) T {
	t.Helper()
	var v T
	rv := reflect.ValueOf(&v).Elem()
	for i := range rv.NumField() {
		f := rv.Field(i)
		if rv.Type().Field(i).Tag.Get("json") == "-" {
			continue
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString(fmt.Sprintf("%s-%d", rv.Type().Field(i).Name, seed))
		case reflect.Int, reflect.Int64:
			f.SetInt(int64(-1000*i - seed))
		case reflect.Bool:
			f.SetBool(true)
		case reflect.Slice:
			f.SetBytes([]byte(fmt.Sprintf(`{"body":%d}`, seed)))
		case reflect.Pointer:
			if f.Type() != reflect.TypeFor[*auditd.CachedCopy]() {
				t.Fatalf("%s.%s: a pointer field; teach filled and the codec about it", rv.Type(), rv.Type().Field(i).Name)
			}
			f.Set(reflect.ValueOf(&auditd.CachedCopy{OriginRun: fmt.Sprintf("run-%d", seed),
				FetchedAt: time.Unix(1_800_000_000+int64(seed), 7).UTC(), Age: auditd.Duration(time.Duration(seed+1) * time.Minute)}))
		default:
			t.Fatalf("%s.%s: a field of kind %s; teach filled and the codec about it", rv.Type(), rv.Type().Field(i).Name, f.Kind())
		}
	}
	return v
}

func TestRecordCodecsRoundTrip(t *testing.T) {
	for seed := range 3 {
		it := filled[auditd.Item](t, seed)
		r, err := openChunk(appendItem([]byte{chunkVersion}, &it))
		var got auditd.Item
		if err == nil {
			err = r.item(&got)
		}
		if err != nil || !reflect.DeepEqual(got, it) || len(r.b) != 0 {
			t.Fatalf("item round trip: %+v, %v (%d bytes left)\nwant %+v", got, err, len(r.b), it)
		}

		key, res := fmt.Sprintf("Key-%d", seed), filled[auditd.ItemResult](t, seed)
		r, err = openChunk(appendResult([]byte{chunkVersion}, key, &res))
		var gotRes auditd.ItemResult
		var gotKey string
		if err == nil {
			gotKey, err = r.result(&gotRes)
		}
		if err != nil || gotKey != key || !reflect.DeepEqual(gotRes, res) || len(r.b) != 0 {
			t.Fatalf("result round trip: %s %+v, %v (%d bytes left)\nwant %s %+v", gotKey, gotRes, err, len(r.b), key, res)
		}
	}
}

func openRecordsDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "records.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if _, err := Open(db, Options{Ledger: noLedger{}, Payloads: noPayloads{}}); err != nil {
		t.Fatal(err)
	}
	return db
}

// testItems returns n items whose keys are not in submission order.
func testItems(run string, n int) []auditd.Item {
	items := make([]auditd.Item, n)
	for i, k := range rand.New(rand.NewPCG(uint64(n), 1)).Perm(n) {
		items[i] = auditd.Item{Key: fmt.Sprintf("%s-k%05d", run, k), SourceID: "s", Method: "GET", Path: fmt.Sprintf("/p/%d", i)}
		if i%3 == 0 {
			items[i].Method, items[i].Body = "POST", []byte(fmt.Sprintf(`{"i":%d}`, i))
		}
	}
	return items
}

// TestChunkedRecords stores runs whose item counts fall on and around the
// chunk boundaries, next to each other in one file, and reads every item
// and result back: in order, by key, and not at all for keys of no item
// (before the first, between two, after the last, another run's).
func TestChunkedRecords(t *testing.T) {
	db := openRecordsDB(t)
	sizes := []int{1, chunkLen - 1, chunkLen, chunkLen + 1, 2*chunkLen + 7}
	runs := map[string][]auditd.Item{}
	for i, n := range sizes {
		run := fmt.Sprintf("run%d", i) // neighbours in the buckets
		runs[run] = testItems(run, n)
	}
	err := db.Update(func(tx *bolt.Tx) error {
		for run, items := range runs {
			if err := putItems(tx, run, items); err != nil {
				return err
			}
			results := make([]result, 0, len(items))
			for _, it := range items {
				if it.Method == "POST" {
					continue // an item without a stored result
				}
				results = append(results, result{it.Key, &auditd.ItemResult{Outcome: auditd.ItemSucceeded, PayloadHash: "h" + it.Path, Attempts: 1, Advertised: -1}})
			}
			slices.SortFunc(results, func(a, b result) int { return strings.Compare(a.key, b.key) })
			if err := putResults(tx, run, results); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	err = db.View(func(tx *bolt.Tx) error {
		for run, items := range runs {
			var got []auditd.Item
			if err := forEachItem(tx, run, func(it *auditd.Item) error {
				got = append(got, *it)
				return nil
			}); err != nil {
				return err
			}
			if !reflect.DeepEqual(got, items) {
				t.Errorf("%s: forEachItem gave %d items, not the %d stored in order", run, len(got), len(items))
			}
			rr := &resultReader{tx: tx, runID: run}
			for _, it := range items {
				byKey, err := loadItem(tx, run, it.Key)
				if err != nil || !reflect.DeepEqual(*byKey, it) {
					t.Errorf("%s: loadItem(%s) = %+v, %v", run, it.Key, byKey, err)
				}
				res, ok, err := rr.result(it.Key)
				switch {
				case err != nil:
					t.Errorf("%s: result(%s): %v", run, it.Key, err)
				case it.Method == "POST" && ok:
					t.Errorf("%s: result(%s) found one never stored: %+v", run, it.Key, res)
				case it.Method != "POST" && (!ok || res.PayloadHash != "h"+it.Path):
					t.Errorf("%s: result(%s) = %+v, %v", run, it.Key, res, ok)
				}
			}
			for _, key := range []string{run + "-a", run + "-k00000x", run + "-z", "other"} {
				if _, err := loadItem(tx, run, key); auditd.ErrorCode(err) != auditd.ENOTFOUND {
					t.Errorf("%s: loadItem(%q) = %v, want not found", run, key, err)
				}
				if res, ok, err := rr.result(key); ok || err != nil {
					t.Errorf("%s: result(%q) = %+v, %v, %v; want none", run, key, res, ok, err)
				}
			}
		}
		for _, run := range []string{"run", "run9", "zzz"} {
			if err := forEachItem(tx, run, func(it *auditd.Item) error { return fmt.Errorf("run %s has item %s", run, it.Key) }); err != nil {
				t.Error(err)
			}
			if _, err := loadItem(tx, run, run+"-k00000"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
				t.Errorf("loadItem in run %s that has none: %v", run, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestLegacyRecordsRead: a run stored before chunks, one JSON entry per
// item, key and result, is read as it was.
func TestLegacyRecordsRead(t *testing.T) {
	db := openRecordsDB(t)
	items := testItems("old", 5)
	err := db.Update(func(tx *bolt.Tx) error {
		ib, kb, rb := tx.Bucket(bucketItems), tx.Bucket(bucketKeys), tx.Bucket(bucketResults)
		for i := range items {
			v, _ := json.Marshal(&items[i])
			if err := ib.Put(itemKey("old", uint32(i)), v); err != nil {
				return err
			}
			if err := kb.Put(namedKey("old", items[i].Key), []byte{0, 0, 0, byte(i)}); err != nil {
				return err
			}
			r, _ := json.Marshal(&legacyResult{Key: items[i].Key, ItemResult: auditd.ItemResult{Outcome: auditd.ItemFailed, Reason: "why", Advertised: -1}})
			if err := rb.Put(namedKey("old", items[i].Key), r); err != nil {
				return err
			}
		}
		return putItems(tx, "new", testItems("new", 3)) // a chunked neighbour
	})
	if err != nil {
		t.Fatal(err)
	}
	err = db.View(func(tx *bolt.Tx) error {
		var got []auditd.Item
		if err := forEachItem(tx, "old", func(it *auditd.Item) error {
			got = append(got, *it)
			return nil
		}); err != nil {
			return err
		}
		if !reflect.DeepEqual(got, items) {
			t.Errorf("legacy items read as %+v", got)
		}
		rr := &resultReader{tx: tx, runID: "old"}
		for _, it := range items {
			if byKey, err := loadItem(tx, "old", it.Key); err != nil || !reflect.DeepEqual(*byKey, it) {
				t.Errorf("legacy loadItem(%s) = %+v, %v", it.Key, byKey, err)
			}
			if res, ok, err := rr.result(it.Key); err != nil || !ok || res.Reason != "why" {
				t.Errorf("legacy result(%s) = %+v, %v, %v", it.Key, res, ok, err)
			}
		}
		if _, err := loadItem(tx, "old", "missing"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
			t.Errorf("legacy loadItem of a missing key: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// FuzzChunkDecode: decoding any stored bytes as a chunk of items, of keys
// or of results fails or succeeds, never panics, and never reads past the
// chunk.
func FuzzChunkDecode(f *testing.F) {
	it := auditd.Item{Key: "k", SourceID: "s", Method: "POST", Path: "/p", Body: []byte("{}"), Paging: auditd.PagingArcGIS, PageSize: 10}
	f.Add(appendItem([]byte{chunkVersion}, &it))
	f.Add(appendResult([]byte{chunkVersion}, "k", &auditd.ItemResult{Outcome: auditd.ItemSucceeded, Bytes: 9, Advertised: -1, CountMatched: true}))
	f.Add([]byte{chunkVersion, 0x80})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, v []byte) {
		for _, decode := range []func(r *chunkReader) error{
			func(r *chunkReader) error { var it auditd.Item; return r.item(&it) },
			func(r *chunkReader) error { var res auditd.ItemResult; _, err := r.result(&res); return err },
			func(r *chunkReader) error { r.bytes(); r.uvarint(); return r.err },
		} {
			r, err := openChunk(v)
			for err == nil && len(r.b) > 0 {
				before := len(r.b)
				if err = decode(r); err == nil && len(r.b) >= before {
					t.Fatalf("a record decoded from %d bytes left %d", before, len(r.b))
				}
			}
		}
		_, _, _ = findIndex(v, "k")
	})
}

// noLedger and noPayloads stand in for what the record tests never use.
type (
	noLedger   struct{ Ledger }
	noPayloads struct{ Payloads }
)

// A chunk written before items kept their cost (version 1) still decodes:
// its items cost 1 (Cost 0), and what follows them is read as before.
func TestVersionOneChunkHasNoCost(t *testing.T) {
	it := auditd.Item{Key: "k", SourceID: "s", Method: "GET", Path: "/p", PageSize: 50}
	v := []byte{1}
	for _, s := range []string{it.Key, it.SourceID, it.Method, it.Path, "", ""} {
		v = appendString(v, s)
	}
	v = binary.AppendVarint(v, int64(it.PageSize))
	v = appendString(v, "next") // the chunk's next record starts here
	r, err := openChunk(v)
	if err != nil {
		t.Fatal(err)
	}
	var got auditd.Item
	if err := r.item(&got); err != nil || !reflect.DeepEqual(got, it) {
		t.Fatalf("version 1 item: %+v, %v; want %+v", got, err, it)
	}
	if next := r.string(); next != "next" {
		t.Fatalf("read %q after the item, want %q", next, "next")
	}
}
