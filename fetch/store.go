package fetch

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Buckets owned by the fetch loop. Runs and item definitions are written once
// when a run is submitted; results when the run ends (storeEnd), until
// then they are kept with the active run. The
// ledger stays the source of truth: on resume, progress is recounted from it.
var (
	bucketRuns    = []byte("fetch.runs")    // run id -> runRecord JSON
	bucketItems   = []byte("fetch.items")   // run id, 0, index (uint32 BE) -> auditd.Item JSON
	bucketKeys    = []byte("fetch.keys")    // run id, 0, item key -> index (uint32 BE)
	bucketResults = []byte("fetch.results") // run id, 0, item key -> ItemResult JSON
	bucketIdem    = []byte("fetch.idem")    // idempotency key -> run id
)

// runRecord is what the store keeps of a run.
type runRecord struct {
	auditd.Run
	Counts Counts `json:"counts"`
}

// ItemResult is how an item ended.
type ItemResult struct {
	Key         string         `json:"key"`
	Outcome     auditd.Outcome `json:"outcome"`
	Reason      string         `json:"reason,omitempty"`
	PayloadHash string         `json:"payload_hash,omitempty"`
	Bytes       int64          `json:"bytes,omitempty"`
	Attempts    int            `json:"attempts"`
	Pages       int            `json:"pages,omitempty"`
	Records     int            `json:"records,omitempty"`
	// Advertised is the upstream's own total for a paged item, -1 when it
	// gives none; CountMatched says whether the records fetched equal it.
	Advertised   int  `json:"advertised,omitempty"`
	CountMatched bool `json:"count_matched,omitempty"`
}

func createBuckets(db *bolt.DB) error {
	return db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketItems, bucketKeys, bucketResults, bucketIdem} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
}

func itemKey(runID string, idx uint32) []byte {
	k := make([]byte, 0, len(runID)+5)
	k = append(append(k, runID...), 0)
	return binary.BigEndian.AppendUint32(k, idx)
}

func namedKey(runID, key string) []byte {
	k := make([]byte, 0, len(runID)+1+len(key))
	return append(append(append(k, runID...), 0), key...)
}

// putRun stores a new run, its items and its idempotency key in one
// transaction: a run is there whole or not at all.
func putRun(tx *bolt.Tx, rec *runRecord, items []auditd.Item, idemKey string) error {
	if err := saveRun(tx, rec); err != nil {
		return err
	}
	ib, kb := tx.Bucket(bucketItems), tx.Bucket(bucketKeys)
	// A run's keys start with its id, which sorts after earlier runs': its
	// items are appended, so their pages are filled (bbolt's default of half
	// full leaves room for inserts that do not come).
	ib.FillPercent, kb.FillPercent = 1, 1
	for i := range items {
		v, err := json.Marshal(&items[i])
		if err != nil {
			return fmt.Errorf("encode item %s: %w", items[i].Key, err)
		}
		idx := binary.BigEndian.AppendUint32(nil, uint32(i))
		if err := ib.Put(itemKey(rec.ID, uint32(i)), v); err != nil {
			return err
		}
		if err := kb.Put(namedKey(rec.ID, items[i].Key), idx); err != nil {
			return err
		}
	}
	if idemKey != "" {
		return tx.Bucket(bucketIdem).Put([]byte(idemKey), []byte(rec.ID))
	}
	return nil
}

func saveRun(tx *bolt.Tx, rec *runRecord) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode run %s: %w", rec.ID, err)
	}
	return tx.Bucket(bucketRuns).Put([]byte(rec.ID), v)
}

func loadRun(tx *bolt.Tx, id string) (*runRecord, error) {
	v := tx.Bucket(bucketRuns).Get([]byte(id))
	if v == nil {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "run %q not found", id)
	}
	var rec runRecord
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("decode run %s: %w", id, err)
	}
	return &rec, nil
}

// forEachItem visits a run's items in submission order, starting after
// index after (-1 for all).
func forEachItem(tx *bolt.Tx, runID string, fn func(idx uint32, it *auditd.Item) error) error {
	prefix := append([]byte(runID), 0)
	c := tx.Bucket(bucketItems).Cursor()
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
		var it auditd.Item
		if err := json.Unmarshal(v, &it); err != nil {
			return fmt.Errorf("decode item of run %s: %w", runID, err)
		}
		if err := fn(binary.BigEndian.Uint32(k[len(prefix):]), &it); err != nil {
			return err
		}
	}
	return nil
}

func loadItem(tx *bolt.Tx, runID, key string) (*auditd.Item, error) {
	idx := tx.Bucket(bucketKeys).Get(namedKey(runID, key))
	if idx == nil {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "item %q not found in run %q", key, runID)
	}
	var it auditd.Item
	if err := json.Unmarshal(tx.Bucket(bucketItems).Get(itemKey(runID, binary.BigEndian.Uint32(idx))), &it); err != nil {
		return nil, fmt.Errorf("decode item %s: %w", key, err)
	}
	return &it, nil
}

func loadResult(tx *bolt.Tx, runID, key string) (*ItemResult, bool, error) {
	v := tx.Bucket(bucketResults).Get(namedKey(runID, key))
	if v == nil {
		return nil, false, nil
	}
	var r ItemResult
	if err := json.Unmarshal(v, &r); err != nil {
		return nil, false, fmt.Errorf("decode result %s: %w", key, err)
	}
	return &r, true, nil
}
