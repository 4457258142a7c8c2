package runs

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// A run's items, the index of their keys and their results are stored in
// chunks of up to chunkLen records, one bbolt entry per chunk: a 20,000-item
// run is some 240 puts instead of 60,000 (each put allocates a cursor, a
// copy of its key and a share of its leaf's growth, and the commit writes
// the same pages either way). A chunk is a version byte, then its records,
// each in a binary encoding of its own (see the append functions).
//
// Runs stored before chunks (one JSON entry per item and per result, in
// bucketItems, bucketKeys and bucketResults) are still read: a run is read
// from chunks when it has any.
var (
	bucketItemChunks   = []byte("fetch.itemchunks")   // run id, 0, chunk number (uint32 BE) -> items in submission order
	bucketKeyChunks    = []byte("fetch.keychunks")    // run id, 0, first key -> (key, item index) in key order
	bucketResultChunks = []byte("fetch.resultchunks") // run id, 0, first key -> results in key order
)

const (
	chunkLen = 256 // records in a chunk
	// chunkVersion is the first byte of every chunk written. A chunk of
	// version 1 was written before items kept their cost: its items cost 1.
	chunkVersion = 2
)

// errMalformed means a stored record does not decode.
var errMalformed = errors.New("malformed record")

// putItems stores a run's items in submission order, and the index of their
// keys in key order. A run's keys start with its id, which sorts after
// earlier runs': its chunks are appended, so their pages are filled
// (bbolt's default of half full leaves room for inserts that do not come).
func putItems(tx *bolt.Tx, runID string, items []auditd.Item) error {
	ib, kb := tx.Bucket(bucketItemChunks), tx.Bucket(bucketKeyChunks)
	ib.FillPercent, kb.FillPercent = 1, 1
	size := 0
	for i := range items {
		it := &items[i]
		size += 2*len(it.Key) + len(it.SourceID) + len(it.Method) + len(it.Path) + len(it.Body) + len(it.Paging) + 9*maxLenLen
	}
	cb := chunkBuf{buf: make([]byte, 0, size+len(items)/chunkLen+2)}
	for n, start := uint32(0), 0; start < len(items); n, start = n+1, start+chunkLen {
		cb.start()
		for i := range items[start:min(start+chunkLen, len(items))] {
			cb.buf = appendItem(cb.buf, &items[start+i])
		}
		if err := ib.Put(itemKey(runID, n), cb.chunk()); err != nil {
			return fmt.Errorf("store items of run %s: %w", runID, err)
		}
	}
	order := make([]uint32, len(items))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortFunc(order, func(a, b uint32) int { return strings.Compare(items[a].Key, items[b].Key) })
	for start := 0; start < len(order); start += chunkLen {
		chunk := order[start:min(start+chunkLen, len(order))]
		cb.start()
		for _, i := range chunk {
			cb.buf = binary.AppendUvarint(appendString(cb.buf, items[i].Key), uint64(i))
		}
		if err := kb.Put(namedKey(runID, items[chunk[0]].Key), cb.chunk()); err != nil {
			return fmt.Errorf("index items of run %s: %w", runID, err)
		}
	}
	return nil
}

// maxLenLen is the most bytes a length or a small number takes encoded:
// enough for a size estimate (a string's length under 2 MiB takes 3).
const maxLenLen = 3

// chunkBuf is where a transaction's chunks are encoded, one after another.
// bbolt keeps a put's value until the transaction ends, so a chunk is cut
// from the buffer, not copied, and a buffer sized for all of them is one
// allocation (BenchmarkLoop1000x20's ms-submit: a 20,000-item run stores
// 160 chunks). Should it grow, the chunks already cut keep the old array.
type chunkBuf struct {
	buf  []byte
	from int // where the chunk being encoded starts
}

// start begins a chunk.
func (cb *chunkBuf) start() {
	cb.from = len(cb.buf)
	cb.buf = append(cb.buf, chunkVersion)
}

// chunk returns the chunk begun last.
func (cb *chunkBuf) chunk() []byte { return cb.buf[cb.from:len(cb.buf):len(cb.buf)] }

// result is how an item ended, with the item's key, as the store keeps it.
type result struct {
	key string
	*auditd.ItemResult
}

// putResults stores a run's results, which must be in key order.
func putResults(tx *bolt.Tx, runID string, results []result) error {
	b := tx.Bucket(bucketResultChunks)
	b.FillPercent = 1 // appended, as putItems's chunks are
	size := 0
	for _, res := range results {
		size += len(res.key) + len(res.Outcome) + len(res.Reason) + len(res.PayloadHash) + 4*maxLenLen + 5*binary.MaxVarintLen64 + 1
	}
	cb := chunkBuf{buf: make([]byte, 0, size+len(results)/chunkLen+1)}
	for start := 0; start < len(results); start += chunkLen {
		chunk := results[start:min(start+chunkLen, len(results))]
		cb.start()
		for _, res := range chunk {
			cb.buf = appendResult(cb.buf, res.key, res.ItemResult)
		}
		if err := b.Put(namedKey(runID, chunk[0].key), cb.chunk()); err != nil {
			return fmt.Errorf("store results of run %s: %w", runID, err)
		}
	}
	return nil
}

// forEachItem visits a run's items in submission order.
func forEachItem(tx *bolt.Tx, runID string, fn func(it *auditd.Item) error) error {
	if hasPages(tx, runID) {
		return scanPages(tx, runID, 0, func(_ uint32, it *auditd.Item) error { return fn(it) })
	}
	prefix := append([]byte(runID), 0)
	c := tx.Bucket(bucketItemChunks).Cursor()
	k, v := c.Seek(prefix)
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return forEachLegacyItem(tx, prefix, fn)
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		r, err := openChunk(v)
		for err == nil && len(r.b) > 0 {
			var it auditd.Item
			if err = r.item(&it); err == nil {
				err = fn(&it)
			}
		}
		if err != nil {
			return fmt.Errorf("items of run %s: %w", runID, err)
		}
	}
	return nil
}

// loadItem returns the item of a run with key.
func loadItem(tx *bolt.Tx, runID, key string) (*auditd.Item, error) {
	notFound := auditd.Errorf(auditd.ENOTFOUND, "item %q not found in run %q", key, runID)
	if hasPages(tx, runID) {
		idx, ok := pagedIndex(tx, runID, key)
		if !ok {
			return nil, notFound
		}
		return loadPagedItem(tx, runID, idx)
	}
	chunk, ok := seekChunk(tx.Bucket(bucketKeyChunks), runID, key)
	if !ok {
		return loadLegacyItem(tx, runID, key, notFound)
	}
	idx, found, err := findIndex(chunk, key)
	if err != nil {
		return nil, fmt.Errorf("item index of run %s: %w", runID, err)
	} else if !found {
		return nil, notFound
	}
	r, err := openChunk(tx.Bucket(bucketItemChunks).Get(itemKey(runID, idx/chunkLen)))
	var it auditd.Item
	for i := uint32(0); err == nil && i <= idx%chunkLen; i++ {
		err = r.item(&it)
	}
	if err != nil {
		return nil, fmt.Errorf("item %s of run %s: %w", key, runID, err)
	}
	return &it, nil
}

func findIndex(chunk []byte, key string) (idx uint32, found bool, err error) {
	r, err := openChunk(chunk)
	for err == nil && len(r.b) > 0 {
		k, i := r.bytes(), r.uvarint()
		if r.err == nil && string(k) == key {
			return uint32(i), true, nil
		}
		err = r.err
	}
	return 0, false, err
}

// resultReader looks up a run's stored results, keeping the last chunk it
// decoded: a listing asks for one result after another in the same chunk.
type resultReader struct {
	tx    *bolt.Tx
	runID string
	paged byte   // 0 not known yet, 1 not in pages, 2 in pages (pages.go)
	first []byte // the key of the chunk in all
	all   []keyedResult
}

// keyedResult is a result decoded from a chunk.
type keyedResult struct {
	key string
	res auditd.ItemResult
}

// result returns the stored result of the item with key, if there is one.
func (rr *resultReader) result(key string) (*auditd.ItemResult, bool, error) {
	if res, ok, err := pagedResult(rr.tx, rr.runID, key); ok || err != nil {
		return res, ok, err
	}
	if rr.paged == 0 {
		rr.paged = 1
		if hasPages(rr.tx, rr.runID) {
			rr.paged = 2
		}
	}
	if rr.paged == 2 {
		return nil, false, nil // a run in pages has its results stored as they ended
	}
	b := rr.tx.Bucket(bucketResultChunks)
	c := b.Cursor()
	k, v := seekChunkCursor(c, rr.runID, key)
	if k == nil {
		return loadLegacyResult(rr.tx, rr.runID, key)
	}
	if !bytes.Equal(k, rr.first) {
		r, err := openChunk(v)
		all := rr.all[:0]
		for err == nil && len(r.b) > 0 {
			var kr keyedResult
			kr.key, err = r.result(&kr.res)
			all = append(all, kr)
		}
		if err != nil {
			rr.first, rr.all = nil, nil
			return nil, false, fmt.Errorf("results of run %s: %w", rr.runID, err)
		}
		rr.first, rr.all = bytes.Clone(k), all
	}
	i, ok := slices.BinarySearchFunc(rr.all, key, func(r keyedResult, key string) int { return strings.Compare(r.key, key) })
	if !ok {
		return nil, false, nil
	}
	res := rr.all[i].res
	return &res, true, nil
}

// seekChunk returns the chunk of b, among run runID's, that would hold key:
// the last whose first key is not after it. ok is false when the run has
// no chunks in b.
func seekChunk(b *bolt.Bucket, runID, key string) (chunk []byte, ok bool) {
	k, v := seekChunkCursor(b.Cursor(), runID, key)
	return v, k != nil
}

func seekChunkCursor(c *bolt.Cursor, runID, key string) (k, v []byte) {
	target := namedKey(runID, key)
	prefix := target[:len(runID)+1]
	k, v = c.Seek(target)
	if k == nil || !bytes.Equal(k, target) {
		if k == nil {
			k, v = c.Last()
		} else {
			k, v = c.Prev()
		}
	}
	if k == nil || !bytes.HasPrefix(k, prefix) {
		// key sorts before the run's first chunk, or the run has none: is
		// there any chunk of the run at all?
		if k, v = c.Seek(prefix); k == nil || !bytes.HasPrefix(k, prefix) {
			return nil, nil
		}
	}
	return k, v
}

// The encodings. Strings are a uvarint length and the bytes; numbers are
// uvarints, or varints where they can be negative.

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendItem(b []byte, it *auditd.Item) []byte {
	b = appendString(b, it.Key)
	b = appendString(b, it.SourceID)
	b = appendString(b, it.Method)
	b = appendString(b, it.Path)
	b = appendString(b, string(it.Body))
	b = appendString(b, string(it.Paging))
	b = binary.AppendVarint(b, int64(it.PageSize))
	return binary.AppendUvarint(b, uint64(it.Cost))
}

func appendResult(b []byte, key string, res *auditd.ItemResult) []byte {
	b = appendString(b, key)
	b = appendString(b, string(res.Outcome))
	b = appendString(b, res.Reason)
	b = appendString(b, res.PayloadHash)
	b = binary.AppendVarint(b, res.Bytes)
	b = binary.AppendVarint(b, int64(res.Attempts))
	b = binary.AppendVarint(b, int64(res.Pages))
	b = binary.AppendVarint(b, int64(res.Records))
	b = binary.AppendVarint(b, int64(res.Advertised))
	// A flags byte: bit 0 the count matched, bit 1 a cached copy's origin
	// follows (results stored before it have only bit 0).
	var flags byte
	if res.CountMatched {
		flags |= flagCountMatched
	}
	if res.Cached == nil {
		return append(b, flags)
	}
	b = append(b, flags|flagCached)
	b = appendString(b, res.Cached.OriginRun)
	b = binary.AppendVarint(b, res.Cached.FetchedAt.UnixNano())
	return binary.AppendVarint(b, int64(res.Cached.Age))
}

// The flags of a stored result.
const (
	flagCountMatched = 1 << iota
	flagCached
)

// chunkReader decodes a chunk's records; the first error sticks.
type chunkReader struct {
	b       []byte
	version byte
	err     error
}

func openChunk(v []byte) (*chunkReader, error) {
	if len(v) == 0 || v[0] < 1 || v[0] > chunkVersion {
		return nil, fmt.Errorf("%w: chunk of version %v", errMalformed, v[:min(len(v), 1)])
	}
	return &chunkReader{b: v[1:], version: v[0]}, nil
}

func (r *chunkReader) fail() {
	if r.err == nil {
		r.err = errMalformed
	}
	r.b = nil
}

func (r *chunkReader) uvarint() uint64 {
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *chunkReader) varint() int64 {
	x, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail()
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *chunkReader) int() int {
	x := r.varint()
	if int64(int(x)) != x {
		r.fail()
	}
	return int(x)
}

func (r *chunkReader) bytes() []byte {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.fail()
		return nil
	}
	s := r.b[:n]
	r.b = r.b[n:]
	return s
}

func (r *chunkReader) string() string { return string(r.bytes()) }

func (r *chunkReader) item(it *auditd.Item) error {
	it.Key, it.SourceID, it.Method, it.Path = r.string(), r.string(), r.string(), r.string()
	if body := r.bytes(); len(body) > 0 {
		it.Body = bytes.Clone(body)
	} else {
		it.Body = nil
	}
	it.Paging, it.PageSize = auditd.Paging(r.string()), r.int()
	it.Cost = 0
	if r.version >= 2 {
		it.Cost = int(r.uvarint())
	}
	return r.err
}

// result decodes a result into res and returns its item's key.
func (r *chunkReader) result(res *auditd.ItemResult) (key string, err error) {
	key, res.Outcome, res.Reason, res.PayloadHash = r.string(), auditd.Outcome(r.string()), r.string(), r.string()
	res.Bytes = r.varint()
	res.Attempts, res.Pages, res.Records, res.Advertised = r.int(), r.int(), r.int(), r.int()
	if len(r.b) == 0 || r.b[0] > flagCountMatched|flagCached {
		r.fail()
		return key, r.err
	}
	flags := r.b[0]
	res.CountMatched, r.b = flags&flagCountMatched != 0, r.b[1:]
	if flags&flagCached != 0 {
		c := &auditd.CachedCopy{OriginRun: r.string()}
		c.FetchedAt = time.Unix(0, r.varint()).UTC()
		c.Age = auditd.Duration(r.varint())
		res.Cached = c
	}
	return key, r.err
}

// Runs stored before chunks: one JSON entry per item, per key and per
// result.
var (
	bucketItems   = []byte("fetch.items")   // run id, 0, index (uint32 BE) -> auditd.Item JSON
	bucketKeys    = []byte("fetch.keys")    // run id, 0, item key -> index (uint32 BE)
	bucketResults = []byte("fetch.results") // run id, 0, item key -> legacyResult JSON
)

// legacyResult is a result as runs stored before chunks keep it.
type legacyResult struct {
	Key string `json:"key"`
	auditd.ItemResult
}

func forEachLegacyItem(tx *bolt.Tx, prefix []byte, fn func(it *auditd.Item) error) error {
	c := tx.Bucket(bucketItems).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var it auditd.Item
		if err := json.Unmarshal(v, &it); err != nil {
			return fmt.Errorf("decode item of run %s: %w", prefix[:len(prefix)-1], err)
		}
		if err := fn(&it); err != nil {
			return err
		}
	}
	return nil
}

func loadLegacyItem(tx *bolt.Tx, runID, key string, notFound error) (*auditd.Item, error) {
	idx := tx.Bucket(bucketKeys).Get(namedKey(runID, key))
	if len(idx) != 4 {
		return nil, notFound
	}
	var it auditd.Item
	if err := json.Unmarshal(tx.Bucket(bucketItems).Get(itemKey(runID, binary.BigEndian.Uint32(idx))), &it); err != nil {
		return nil, fmt.Errorf("decode item %s: %w", key, err)
	}
	return &it, nil
}

func loadLegacyResult(tx *bolt.Tx, runID, key string) (*auditd.ItemResult, bool, error) {
	v := tx.Bucket(bucketResults).Get(namedKey(runID, key))
	if v == nil {
		return nil, false, nil
	}
	var r legacyResult
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, false, fmt.Errorf("decode result %s: %w", key, err)
	}
	return &r.ItemResult, true, nil
}
