package fetch

import (
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
	bucketRuns = []byte("fetch.runs") // run id -> runRecord JSON
	bucketIdem = []byte("fetch.idem") // idempotency key -> run id
	// and a run's items and results, in chunks: see records.go
)

// runRecord is what the store keeps of a run.
type runRecord struct {
	auditd.Run
	Counts Counts `json:"counts"`
	// RequestHash fingerprints what the run was submitted with, when it was
	// submitted with an idempotency key (requestHash): the key's reuse for
	// a different run is refused. Runs stored before it have none.
	RequestHash string `json:"request_hash,omitempty"`
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
		for _, b := range [][]byte{bucketRuns, bucketIdem, bucketItemChunks, bucketKeyChunks, bucketResultChunks, bucketItems, bucketKeys, bucketResults} {
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
	if err := putItems(tx, rec.ID, items); err != nil {
		return err
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
