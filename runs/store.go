package runs

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/seal"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// Buckets of runs and their idempotency keys. They keep the fetch. prefix
// of the package that owned them first: data directories hold them under
// these names. A run's items and results are in chunks: see records.go.
var (
	bucketRuns = []byte("fetch.runs") // run id -> record JSON
	bucketIdem = []byte("fetch.idem") // idempotency key -> run id
	// bucketSendPaths keeps, until its run ends, the path as sent of each
	// item whose credentials were redacted from its stored Path, sealed.
	bucketSendPaths = []byte("fetch.sendpaths") // run id, 0, item key -> sealed SendPath
)

// LostSendPath is the SendPath Resume gives an item whose sealed path as
// sent did not open (the sealing key changed): the item cannot be sent.
const LostSendPath = "\x00lost"

// ErrKeyTaken means another run took the idempotency key while Create was
// storing this one: the caller should look the key up again.
var ErrKeyTaken = errors.New("idempotency key taken concurrently")

// Ledger is what the store needs of the ledger: acknowledgements are
// recorded in it, and those already recorded are read back from it.
type Ledger interface {
	auditd.Appender
	ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error
}

// Payloads is what the store needs of the payload store (*staging.Store):
// to open an item's payload.
type Payloads interface {
	Open(sum string) (io.ReadCloser, error)
}

// Options configure Open. Ledger and Payloads are required.
type Options struct {
	Ledger   Ledger
	Payloads Payloads
	// Pace returns the requests per window a source is paced at now, for
	// the finish estimate. Default: nil, no estimate.
	Pace func(sourceID string) (limit int, window time.Duration, err error)
	// Clock stamps new runs and the estimate. Default: clock.Real{}.
	Clock clock.Clock
	// Seal seals the paths as sent of items with credentials until their
	// run ends. Default: seal.Ephemeral(), whose key dies with the process:
	// such items cannot resume after a restart (LostSendPath).
	Seal *seal.Box
	// Stalled says why the ledger cannot write for now, and since when
	// (*ledger.Ledger.Stalled); meanwhile the views of live runs say they
	// are paused. Default: nil, never paused.
	Stalled func() (since time.Time, err error)
}

// Store keeps runs and their items in the shared bbolt file, and the live
// state of the runs the fetch loop is working on. It is safe for
// concurrent use.
type Store struct {
	db       *bolt.DB
	ledger   Ledger
	payloads Payloads
	pace     func(string) (int, time.Duration, error)
	clock    clock.Clock
	seal     *seal.Box
	stalled  func() (time.Time, error)

	mu      sync.Mutex
	live    map[string]*Live    // runs the loop is working on (Start)
	locks   map[string]*runLock // see lockRun
	pending map[string]uint32   // run id -> the first index of its pending page (pending.go)

	// ids keeps run ids minted in the same millisecond in the order they
	// were minted, so that Runs (newest first, by id) lists them in
	// submission order.
	ids *ulid.LockedMonotonicReader
}

// Open returns the store of runs kept in db, creating its buckets.
func Open(db *bolt.DB, opts Options) (*Store, error) {
	if opts.Ledger == nil || opts.Payloads == nil {
		return nil, errors.New("runs: Ledger and Payloads are required")
	}
	if opts.Clock == nil {
		opts.Clock = clock.Real{}
	}
	if opts.Seal == nil {
		opts.Seal = seal.Ephemeral()
	}
	err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketRuns, bucketIdem, bucketItemPages, bucketItemIndex, bucketItemResults, bucketItemChunks, bucketKeyChunks, bucketResultChunks, bucketItems, bucketKeys, bucketResults, bucketSendPaths, bucketPendingPages} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("create run buckets: %w", err)
	}
	return &Store{
		db: db, ledger: opts.Ledger, payloads: opts.Payloads, pace: opts.Pace, clock: opts.Clock, seal: opts.Seal, stalled: opts.Stalled,
		live: map[string]*Live{}, locks: map[string]*runLock{}, pending: map[string]uint32{},
		ids: &ulid.LockedMonotonicReader{MonotonicReader: ulid.Monotonic(rand.Reader, 0)},
	}, nil
}

// record is what the store keeps of a run.
type record struct {
	auditd.Run
	Counts auditd.Counts `json:"counts"`
	// RequestHash fingerprints what the run was submitted with, when it was
	// submitted with an idempotency key (requestHash): the key's reuse for
	// a different run is refused. Runs stored before it have none.
	RequestHash string `json:"request_hash,omitempty"`
}

func decodeRecord(id, v []byte) (*record, error) {
	var rec record
	if err := json.Unmarshal(v, &rec); err != nil {
		return nil, fmt.Errorf("decode run %s: %w", id, err)
	}
	// Records stored before Pending was counted have none.
	rec.Counts.Pending = rec.Counts.Items - rec.Counts.Done()
	return &rec, nil
}

func loadRun(tx *bolt.Tx, id string) (*record, error) {
	v := tx.Bucket(bucketRuns).Get([]byte(id))
	if v == nil {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "run %q not found", id)
	}
	return decodeRecord([]byte(id), v)
}

func saveRun(tx *bolt.Tx, rec *record) error {
	v, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("encode run %s: %w", rec.ID, err)
	}
	return tx.Bucket(bucketRuns).Put([]byte(rec.ID), v)
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

// Create stores a new run, its items and its idempotency key in one
// transaction: a run is there whole or not at all. run is the run as
// submitted (nr) without its id, which Create mints from run.CreatedAt.
// When another run took nr.IdempotencyKey meanwhile, it stores nothing and
// returns ErrKeyTaken. The run is live once it starts (Start).
func (s *Store) Create(run auditd.Run, nr auditd.NewRun) (*Live, error) {
	if run.ID == "" { // a fleet run's part comes with the fleet's id
		run.ID = ulid.MustNew(ulid.Timestamp(run.CreatedAt), s.ids).String()
	}
	rec := &record{Run: run}
	if nr.IdempotencyKey != "" {
		rec.RequestHash = requestHash(nr)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		if nr.IdempotencyKey != "" && tx.Bucket(bucketIdem).Get([]byte(nr.IdempotencyKey)) != nil {
			return ErrKeyTaken
		}
		if nr.ID != "" && tx.Bucket(bucketRuns).Get([]byte(nr.ID)) != nil {
			return auditd.Errorf(auditd.ECONFLICT, "Run %s exists on this node.", nr.ID)
		}
		if err := saveRun(tx, rec); err != nil {
			return err
		}
		if err := putPage(tx, rec.ID, 0, nr.Items, "items"); err != nil {
			return err
		}
		if err := s.putSendPaths(tx, rec.ID, nr.Items); err != nil {
			return err
		}
		if nr.IdempotencyKey != "" {
			return tx.Bucket(bucketIdem).Put([]byte(nr.IdempotencyKey), []byte(rec.ID))
		}
		return nil
	})
	if errors.Is(err, ErrKeyTaken) {
		return nil, err
	} else if err != nil {
		return nil, fmt.Errorf("store run: %w", err)
	}
	return s.newLive(rec), nil
}

// AddItems adds a page of items to r, an open batch run, after those it
// has: stored, with their keys indexed and their paths as sent sealed, in
// one transaction. A key the run has already is EINVALID naming the item,
// and then nothing is stored. The caller records their item.queued.
func (s *Store) AddItems(r *Live, items []auditd.Item) error {
	r.adding.Lock()
	defer r.adding.Unlock()
	run := r.Run()
	if err := checkAddable(r.id, run, len(items)); err != nil {
		return err
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := putPage(tx, r.id, uint32(run.ItemCount), items, "items"); err != nil {
			return err
		}
		return s.putSendPaths(tx, r.id, items)
	})
	if auditd.ErrorCode(err) == auditd.EINVALID {
		return err
	} else if err != nil {
		return fmt.Errorf("store items of run %s: %w", r.id, err)
	}
	r.mu.Lock()
	r.rec.ItemCount += len(items)
	r.mu.Unlock()
	return nil
}

// Close closes r, an open batch run: it takes no more items, and ends once
// those it has do. The stored record says so, for a restart.
func (s *Store) Close(r *Live) error {
	r.adding.Lock()
	defer r.adding.Unlock()
	r.mu.Lock()
	r.rec.Open = false
	rec := r.rec
	rec.Counts = r.rec.Counts.Clone()
	r.mu.Unlock()
	return s.db.Update(func(tx *bolt.Tx) error { return saveRun(tx, &rec) })
}

// pagedItem reports the index of run runID's item with key, when the store
// has it in pages.
func (s *Store) pagedItem(runID, key string) (idx uint32, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		idx, ok = pagedIndex(tx, runID, key)
		return nil
	})
	return idx, ok, err
}

// Unfinished returns the ids of the runs that have not reached a terminal
// status: those a crash or restart left for the fetch loop to resume.
func (s *Store) Unfinished() ([]string, error) {
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			rec, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			if !rec.Status.Terminal() {
				ids = append(ids, rec.ID)
			}
			return nil
		})
	})
	return ids, err
}

// Resume returns an unfinished run, with counters at zero (the caller
// recounts them from the ledger). A batch run an earlier build stored
// (Live.Rebuilds) comes with its items in submission order; any other run
// with none: read them a chunk at a time (ItemsAt), so that resuming a run
// of millions holds no more of them than a chunk.
func (s *Store) Resume(id string) (*Live, []auditd.Item, error) {
	if err := s.dropPending(id); err != nil { // a page the stop left uncommitted
		return nil, nil, err
	}
	var rec *record
	var items []auditd.Item
	legacy := false
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		if rec, err = loadRun(tx, id); err != nil {
			return err
		}
		legacy = !hasPages(tx, id)
		if !legacy {
			n, err := pagedCount(tx, id)
			if err != nil {
				return err
			}
			rec.ItemCount = int(n)
		}
		if rec.Mode == auditd.RunProxy || !legacy {
			return nil // the ledger's, or the store's pages, a chunk at a time
		}
		sent := tx.Bucket(bucketSendPaths)
		return forEachItem(tx, id, func(it *auditd.Item) error {
			if v := sent.Get(namedKey(id, it.Key)); v != nil {
				it.SendPath = LostSendPath
				if p, err := s.seal.Open(v, namedKey(id, it.Key)); err == nil {
					it.SendPath = string(p)
				}
			}
			items = append(items, *it)
			return nil
		})
	})
	if err != nil {
		return nil, nil, err
	}
	rec.Counts = auditd.Counts{}
	if legacy && rec.Mode == auditd.RunProxy {
		rec.ItemCount = 0 // counted again as the ledger's items are restored
	}
	live := s.newLive(rec)
	live.legacy = legacy
	return live, items, nil
}

// Start stores r's record as it starts (once run.started is recorded, and
// again when the loop resumes it) and makes it live: until its end is
// stored (End), views read it and not the stored record.
//
// It stores too what a resume rebuilt that the store lacked (Rebuilt,
// RestoreItem): results and items of a run an earlier build kept in
// memory until the run's end.
func (s *Store) Start(r *Live) error {
	rec := r.record()
	r.mu.Lock()
	rebuilt := r.rebuilt
	var restored []pendingItem
	if r.proxied != nil {
		for _, key := range r.proxied.restored {
			restored = append(restored, r.proxied.pending[key])
		}
	}
	r.mu.Unlock()
	err := s.db.Update(func(tx *bolt.Tx) error {
		for _, res := range rebuilt {
			p := ResultPut(r.id, res.key, res.ItemResult)
			if err := tx.Bucket(p.Bucket).Put(p.Key, p.Value); err != nil {
				return err
			}
		}
		for i := range restored {
			for _, p := range itemPuts(r.id, restored[i].idx, &restored[i].it) {
				if err := tx.Bucket(p.Bucket).Put(p.Key, p.Value); err != nil {
					return err
				}
			}
		}
		return saveRun(tx, &rec)
	})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.rebuilt = nil
	if r.proxied != nil {
		for _, key := range r.proxied.restored {
			delete(r.proxied.pending, key)
		}
		r.proxied.restored = nil
	}
	r.mu.Unlock()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[r.id] = r
	return nil
}

func (s *Store) tracked(id string) *Live {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[id]
}

// End stores a run's terminal record, which run.finished (fin)
// completes, and forgets its items' sealed paths as sent. Its items and
// their results are stored already, as they came and ended. Then the run
// is no longer live. A crash before this commits leaves the run
// unfinished in the store; the fetch loop then finds run.finished in the
// ledger and stores its end.
func (s *Store) End(r *Live, fin *auditd.Event) error {
	defer s.lockRun(r.id)() // an acknowledgement counts in the live run or the stored record, not neither
	r.mu.Lock()
	rec := r.rec
	rec.Counts = r.rec.Counts.Clone()
	rec.Status = auditd.RunStatus(fin.Outcome)
	rec.FinishedAt = fin.Time
	rec.HeadAtEnd = hex.EncodeToString(fin.Hash[:])
	rec.Open = false
	r.mu.Unlock()

	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := deleteSendPaths(tx, rec.ID); err != nil {
			return err
		}
		return saveRun(tx, &rec)
	})
	if err != nil {
		return fmt.Errorf("store the end of run %s: %w", rec.ID, err)
	}
	// Views show the run ended only now that the store has all of its end.
	r.mu.Lock()
	r.rec.Status, r.rec.FinishedAt, r.rec.HeadAtEnd, r.rec.Open = rec.Status, rec.FinishedAt, rec.HeadAtEnd, false
	r.mu.Unlock()
	close(r.ended)
	s.mu.Lock()
	delete(s.live, r.id)
	s.mu.Unlock()
	return nil
}

// runLock serialises what changes a run's counters outside the fetch
// loop's workers: acknowledgements, and the store of the run's end.
type runLock struct {
	mu    sync.Mutex
	users int // holding or waiting for mu
}

// lockRun locks run id's runLock and returns its unlock.
func (s *Store) lockRun(id string) (unlock func()) {
	s.mu.Lock()
	l := s.locks[id]
	if l == nil {
		l = &runLock{}
		s.locks[id] = l
	}
	l.users++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.users--; l.users == 0 {
			delete(s.locks, id)
		}
		s.mu.Unlock()
	}
}

// Acknowledge records that the downstream pipeline loaded the given items
// of run runID, on behalf of principal, and returns how many were newly
// acknowledged. Every key must name an item of the run that ended with a
// payload; nothing is recorded when one does not (EINVALID naming it).
// Keys already acknowledged are skipped. Acknowledgements of one run are
// serialised, so a key acknowledged twice at once is recorded once.
func (s *Store) Acknowledge(ctx context.Context, runID string, keys []string, principal string) (int, error) {
	defer s.lockRun(runID)()
	acked := map[string]bool{}
	if err := s.ledger.ScanRun(runID, 0, func(e *auditd.Event) error {
		if e.Type == auditd.EventAcknowledged {
			acked[e.ItemKey] = true
		}
		return nil
	}); err != nil {
		return 0, err
	}
	var todo []auditd.ItemView
	for i, k := range keys {
		v, err := s.Item(ctx, runID, k)
		if err != nil {
			if auditd.ErrorCode(err) == auditd.ENOTFOUND {
				return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: auditd.ErrorMessage(err)}
			}
			return 0, err
		}
		if v.Result == nil || v.Result.PayloadHash == "" {
			return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: fmt.Sprintf("item %q delivered nothing to acknowledge", k)}
		}
		if !acked[k] {
			acked[k] = true
			todo = append(todo, v)
		}
	}
	for _, v := range todo {
		got, err := s.ledger.Append(ctx, auditd.Event{Type: auditd.EventAcknowledged, RunID: runID, SourceID: v.SourceID,
			ItemKey: v.Key, Principal: principal, PayloadHash: v.Result.PayloadHash})
		if err != nil {
			return 0, err
		}
		if r := s.tracked(runID); r != nil {
			r.Count(got)
		} else if err := s.countStored(&got); err != nil {
			return 0, err
		}
	}
	return len(todo), nil
}

// countStored counts e, an event of a run that is not live, in the run's
// stored record.
func (s *Store) countStored(e *auditd.Event) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		rec, err := loadRun(tx, e.RunID)
		if err != nil {
			return err
		}
		rec.Counts.Count(e)
		rec.LastSeq = max(rec.LastSeq, e.Seq)
		return saveRun(tx, rec)
	})
}

// putSendPaths stores, sealed, the path as sent of each of a new run's
// items that has one.
func (s *Store) putSendPaths(tx *bolt.Tx, runID string, items []auditd.Item) error {
	b := tx.Bucket(bucketSendPaths)
	for i := range items {
		if items[i].SendPath == "" {
			continue
		}
		k := namedKey(runID, items[i].Key)
		if err := b.Put(k, s.seal.Seal([]byte(items[i].SendPath), k)); err != nil {
			return fmt.Errorf("store the sealed paths of run %s: %w", runID, err)
		}
	}
	return nil
}

// deleteSendPaths forgets a run's sealed paths as sent: it has ended.
func deleteSendPaths(tx *bolt.Tx, runID string) error {
	c := tx.Bucket(bucketSendPaths).Cursor()
	prefix := append([]byte(runID), 0)
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Seek(prefix) {
		if err := c.Delete(); err != nil {
			return fmt.Errorf("forget the sealed paths of run %s: %w", runID, err)
		}
	}
	return nil
}

// Todo returns, among run id's items with indexes in [from, upTo), those
// of source that have not ended (no result stored), in submission order,
// with their paths as sent; it looks at up to max items, and returns the
// index after the last it looked at. The fetch loop feeds a run's workers
// from it a chunk at a time, so that a run's size costs no memory.
func (s *Store) Todo(id, source string, from, upTo uint32, max int) ([]auditd.Item, uint32, error) {
	var items []auditd.Item
	next := from
	err := s.db.View(func(tx *bolt.Tx) error {
		sent := tx.Bucket(bucketSendPaths)
		results := &resultReader{tx: tx, runID: id}
		visit := func(idx uint32, it *auditd.Item) error {
			if idx >= upTo || int(idx-from) >= max {
				return errStop
			}
			next = idx + 1
			if it.SourceID != source {
				return nil
			}
			if _, done, err := results.result(it.Key); err != nil || done {
				return err
			}
			if v := sent.Get(namedKey(id, it.Key)); v != nil {
				it.SendPath = LostSendPath
				if p, err := s.seal.Open(v, namedKey(id, it.Key)); err == nil {
					it.SendPath = string(p)
				}
			}
			items = append(items, *it)
			return nil
		}
		if hasPages(tx, id) {
			return scanPages(tx, id, from, visit)
		}
		idx := uint32(0)
		err := forEachItem(tx, id, func(it *auditd.Item) error {
			defer func() { idx++ }()
			if idx < from {
				return nil
			}
			return visit(idx, it)
		})
		if errors.Is(err, errStop) {
			return nil
		}
		return err
	})
	return items, next, err
}
