package runs

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// A run's items come in pages: all of a batch run's with its submit, or
// a page at a time while it is open (Store.AddItems), and a proxy-mode
// run's one per request (Live.AddItem). Each page is stored as it comes,
// so a run's size costs disk, not memory:
//
//   - its items in chunks (records.go's encoding), each keyed by the
//     index of its first item, so that a page appends after the last;
//   - one index entry per item, key to index, which finds an item, a
//     listing's cursor and a repeated key in one lookup;
//   - one result per item that has ended, stored in the ledger's commit
//     of its item.finished (ResultPut).
//
// Runs stored before pages (items and keys in fixed chunks, results in
// chunks written at the run's end: records.go) are still read.
var (
	bucketItemPages   = []byte("runs.itempages")   // run id, 0, first index (uint32 BE) -> items in submission order
	bucketItemIndex   = []byte("runs.itemindex")   // run id, 0, item key -> index (uvarint)
	bucketItemResults = []byte("runs.itemresults") // run id, 0, item key -> result (a chunk of one)
)

// MaxItemsInRun is the most items a run may hold: far more than a
// pipeline sends (an item's index is a uint32).
const MaxItemsInRun = 1 << 31

// putPage stores items as the run's items from index from on, and indexes
// their keys. A key the run has already is EINVALID naming the item
// (field is the name of the items in the request: "items"), and then the
// caller's transaction must not commit.
func putPage(tx *bolt.Tx, runID string, from uint32, items []auditd.Item, field string) error {
	pb, kb := tx.Bucket(bucketItemPages), tx.Bucket(bucketItemIndex)
	if from == 0 {
		// A new run's keys sort after every earlier run's: appended.
		pb.FillPercent, kb.FillPercent = 1, 1
	}
	size := 0
	for i := range items {
		it := &items[i]
		size += len(it.Key) + len(it.SourceID) + len(it.Method) + len(it.Path) + len(it.Body) + len(it.Paging) + 7*maxLenLen
	}
	cb := chunkBuf{buf: make([]byte, 0, size+len(items)/chunkLen+1)}
	for start := 0; start < len(items); start += chunkLen {
		cb.start()
		for i := range items[start:min(start+chunkLen, len(items))] {
			cb.buf = appendItem(cb.buf, &items[start+i])
		}
		if err := pb.Put(itemKey(runID, from+uint32(start)), cb.chunk()); err != nil {
			return fmt.Errorf("store items of run %s: %w", runID, err)
		}
	}
	order := make([]uint32, len(items))
	for i := range order {
		order[i] = uint32(i)
	}
	slices.SortFunc(order, func(a, b uint32) int { return strings.Compare(items[a].Key, items[b].Key) })
	idx := make([]byte, 0, len(items)*binary.MaxVarintLen32)
	for _, i := range order {
		k := namedKey(runID, items[i].Key)
		if from > 0 && kb.Get(k) != nil {
			return &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("%s[%d].key", field, i),
				Message: fmt.Sprintf("Run %s already has an item %q.", runID, items[i].Key)}
		}
		at := len(idx)
		idx = binary.AppendUvarint(idx, uint64(from+i))
		if err := kb.Put(k, idx[at:len(idx):len(idx)]); err != nil {
			return fmt.Errorf("index items of run %s: %w", runID, err)
		}
	}
	return nil
}

// hasPages reports whether run runID's items are stored in pages.
func hasPages(tx *bolt.Tx, runID string) bool {
	prefix := append([]byte(runID), 0)
	k, _ := tx.Bucket(bucketItemPages).Cursor().Seek(prefix)
	return k != nil && bytes.HasPrefix(k, prefix)
}

// pagedCount is how many items run runID holds in pages: the index after
// its last.
func pagedCount(tx *bolt.Tx, runID string) (uint32, error) {
	prefix := append([]byte(runID), 0)
	c := tx.Bucket(bucketItemPages).Cursor()
	k, _ := c.Seek(append(bytes.Clone(prefix), 0xff, 0xff, 0xff, 0xff, 0xff))
	k, v := prevOf(c, k)
	if k == nil || !bytes.HasPrefix(k, prefix) {
		return 0, nil
	}
	n, err := chunkItems(v)
	if err != nil {
		return 0, fmt.Errorf("items of run %s: %w", runID, err)
	}
	return binary.BigEndian.Uint32(k[len(prefix):]) + n, nil
}

// chunkItems counts the items in a chunk.
func chunkItems(v []byte) (uint32, error) {
	r, err := openChunk(v)
	n := uint32(0)
	for err == nil && len(r.b) > 0 {
		var it auditd.Item
		if err = r.item(&it); err == nil {
			n++
		}
	}
	return n, err
}

// scanPages visits run runID's items from index from on, in submission
// order, with their indexes, until fn returns an error (errStop ends it
// without one).
func scanPages(tx *bolt.Tx, runID string, from uint32, fn func(idx uint32, it *auditd.Item) error) error {
	prefix := append([]byte(runID), 0)
	c := tx.Bucket(bucketItemPages).Cursor()
	target := itemKey(runID, from)
	k, v := c.Seek(target)
	if k == nil || !bytes.Equal(k, target) {
		// The chunk holding from starts before it, or there is none.
		if pk, pv := prevOf(c, k); pk != nil && bytes.HasPrefix(pk, prefix) {
			k, v = pk, pv
		} else {
			k, v = c.Seek(target)
		}
	}
	for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		idx := binary.BigEndian.Uint32(k[len(prefix):])
		r, err := openChunk(v)
		for ; err == nil && len(r.b) > 0; idx++ {
			var it auditd.Item
			if err = r.item(&it); err == nil && idx >= from {
				err = fn(idx, &it)
			}
		}
		if errors.Is(err, errStop) {
			return nil
		} else if err != nil {
			return fmt.Errorf("items of run %s: %w", runID, err)
		}
	}
	return nil
}

// prevOf steps c back from where a Seek left it (k nil: past the end).
func prevOf(c *bolt.Cursor, k []byte) (key, value []byte) {
	if k == nil {
		return c.Last()
	}
	return c.Prev()
}

// pagedIndex returns the index of run runID's item with key.
func pagedIndex(tx *bolt.Tx, runID, key string) (uint32, bool) {
	v := tx.Bucket(bucketItemIndex).Get(namedKey(runID, key))
	if v == nil {
		return 0, false
	}
	idx, n := binary.Uvarint(v)
	return uint32(idx), n > 0
}

// loadPagedItem returns run runID's item at index idx.
func loadPagedItem(tx *bolt.Tx, runID string, idx uint32) (*auditd.Item, error) {
	var found *auditd.Item
	err := scanPages(tx, runID, idx, func(i uint32, it *auditd.Item) error {
		if i == idx {
			found = it
		}
		return errStop
	})
	if err == nil && found == nil {
		err = fmt.Errorf("%w: no item %d in run %s's pages", errMalformed, idx, runID)
	}
	return found, err
}

// ResultPut is what stores how an item of run runID ended: the ledger
// writes it in the commit of the item's item.finished, so that a result
// is stored exactly when its event is.
func ResultPut(runID, key string, res *auditd.ItemResult) auditd.Put {
	v := appendResult([]byte{chunkVersion}, key, res)
	return auditd.Put{Bucket: bucketItemResults, Key: namedKey(runID, key), Value: v}
}

// itemPuts are what store item it of a proxy-mode run, at index idx:
// the ledger writes them in the commit of its item.queued.
func itemPuts(runID string, idx uint32, it *auditd.Item) []auditd.Put {
	return []auditd.Put{
		{Bucket: bucketItemPages, Key: itemKey(runID, idx), Value: appendItem([]byte{chunkVersion}, it)},
		{Bucket: bucketItemIndex, Key: namedKey(runID, it.Key), Value: binary.AppendUvarint(nil, uint64(idx))},
	}
}

// pagedResult returns how run runID's item with key ended, if it has and
// the result was stored as it ended.
func pagedResult(tx *bolt.Tx, runID, key string) (*auditd.ItemResult, bool, error) {
	v := tx.Bucket(bucketItemResults).Get(namedKey(runID, key))
	if v == nil {
		return nil, false, nil
	}
	r, err := openChunk(v)
	if err != nil {
		return nil, false, err
	}
	var res auditd.ItemResult
	if _, err := r.result(&res); err != nil {
		return nil, false, fmt.Errorf("result %s of run %s: %w", key, runID, err)
	}
	return &res, true, nil
}
