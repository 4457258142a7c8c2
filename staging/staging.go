package staging

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Defaults for Store fields.
const (
	// DefaultMaxBytes caps one staged payload (64 MiB).
	DefaultMaxBytes = 64 << 20
	// DefaultInlineMax is the largest payload kept inside the bbolt file
	// rather than as a file of its own: most API pages are a few KiB, and a
	// file create, fsync and rename per item costs far more than a share of
	// one batched bbolt commit.
	DefaultInlineMax = 64 << 10
)

var (
	bucketLastGood = []byte("staging.lastgood") // request key -> fetched at, payload hash, run (decodeLastGood)
	bucketRecent   = []byte("staging.recent")   // recent key -> request key and its last-good entry, until compacted (lastgood.go)
	bucketInline   = []byte("staging.payloads") // payload hash -> bytes, for small payloads
	bucketSpool    = []byte("staging.spool")    // spool key -> payload hash (32 bytes), bytes
)

// ErrTooLarge means a payload was larger than the store's cap; nothing was kept.
var ErrTooLarge = errors.New("payload larger than the staging cap")

// ErrNotFound means no payload is stored under a hash.
var ErrNotFound = errors.New("payload not found")

// ErrCorrupt means a stored payload no longer hashes to its name.
var ErrCorrupt = errors.New("payload does not match its hash")

// Store is a content-addressed payload store with a last-good index.
//
// Small payloads are written twice. When an item finishes, its payload is
// appended to the spool under the next spool key, in the transaction that
// records it (see Payload.Record): appends touch the spool's last page,
// where putting it under its hash would rewrite a page of the payload
// bucket chosen at random for every item. Compact later moves spooled
// payloads to the payload bucket in hash order, many to a transaction.
// Until then the store finds a spooled payload through pending, an index
// in memory; Open compacts, so a restart needs no index.
type Store struct {
	dir string
	db  *bolt.DB

	mu        sync.Mutex
	spoolNext uint64            // the last spool key handed out
	pending   map[string]uint64 // payload hash -> spool key, until compacted
	recent    recentCopies      // last-good copies stored since the last compaction (lastgood.go)

	// MaxBytes caps one payload. Default DefaultMaxBytes.
	MaxBytes int64
	// InlineMax is the largest payload kept in the bbolt file; larger ones
	// are files below the staging directory. Default DefaultInlineMax.
	InlineMax int
}

// Open returns a store keeping payloads below dir and in db.
func Open(db *bolt.DB, dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("create staging directory: %w", err)
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLastGood, bucketInline, bucketSpool, bucketRecent} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("create staging buckets: %w", err)
	}
	s := &Store{dir: dir, db: db, MaxBytes: DefaultMaxBytes, InlineMax: DefaultInlineMax, pending: map[string]uint64{}, recent: newRecentCopies()}
	if _, err := s.compact(math.MaxUint64, math.MaxUint64); err != nil {
		return nil, err
	}
	return s, nil
}

// ErrNoStore means a bbolt file holds no payload store: nothing ever
// opened one in it.
var ErrNoStore = errors.New("no payload store in this file")

// OpenReadOnly returns a store that reads the payloads below dir and in db,
// which may be opened read-only: auditd reconcile re-hashes a stopped
// server's payloads this way. It creates and compacts nothing; it indexes
// the spool as it finds it, skipping an entry too short to name its
// payload (which is then not found). Only Open, VerifyPayload and LastGood
// are for use on it. ErrNoStore if db holds no payload store.
func OpenReadOnly(db *bolt.DB, dir string) (*Store, error) {
	s := &Store{dir: dir, db: db, MaxBytes: DefaultMaxBytes, InlineMax: DefaultInlineMax, pending: map[string]uint64{}, recent: newRecentCopies()}
	err := db.View(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketLastGood, bucketInline, bucketSpool} {
			if tx.Bucket(b) == nil {
				return ErrNoStore
			}
		}
		c := tx.Bucket(bucketSpool).Cursor()
		for k, v := c.First(); k != nil; k, v = c.Next() {
			if len(k) == 8 && len(v) >= sha256.Size {
				s.pending[hex.EncodeToString(v[:sha256.Size])] = binary.BigEndian.Uint64(k)
			}
		}
		// A file of a build before the recent copies has none.
		if b := tx.Bucket(bucketRecent); b != nil {
			s.recent.load(b)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// Writer stages one payload written in pieces (the pages of a paged item).
// Commit makes it durable and returns its hash; Abort discards it. A payload
// stays in memory until it outgrows InlineMax; only then is its file created.
type Writer struct {
	s *Store
	// rec is, while the payload is small, its spool entry as Record
	// returns it, in one array: the spool key and the payload's hash
	// (recordHeader bytes, which Finish fills in), then the payload.
	// Writing the payload there from the start saves copying it into an
	// entry of its own. It is nil until the first Write, and once the
	// payload has a file.
	rec  []byte
	f    *os.File // the payload once it is not small
	h    hash.Hash
	n    int64
	done bool
}

// recordHeader is what comes before a small payload in its spool entry's
// array (Writer.rec): the spool key (8 bytes, big-endian), then the
// payload's SHA-256, which starts the entry's value.
const recordHeader = 8 + sha256.Size

// NewWriter starts a payload.
func (s *Store) NewWriter() (*Writer, error) {
	return &Writer{s: s, h: sha256.New()}, nil
}

// Write appends p to the payload. It fails with ErrTooLarge past the cap.
func (w *Writer) Write(p []byte) (int, error) {
	if w.n+int64(len(p)) > w.s.MaxBytes {
		return 0, ErrTooLarge
	}
	w.h.Write(p)
	w.n += int64(len(p))
	if w.f == nil && w.n <= int64(w.s.InlineMax) {
		if w.rec == nil {
			w.rec = make([]byte, recordHeader, recordHeader+len(p))
		}
		w.rec = append(w.rec, p...)
		return len(p), nil
	}
	if w.f == nil {
		f, err := os.CreateTemp(w.s.dir, ".staging-*")
		if err != nil {
			return 0, fmt.Errorf("create staging file: %w", err)
		}
		w.f = f
		if w.rec != nil {
			if _, err := f.Write(w.rec[recordHeader:]); err != nil {
				return 0, err
			}
		}
		w.rec = nil
	}
	return w.f.Write(p)
}

// Len is how many bytes were written so far.
func (w *Writer) Len() int64 { return w.n }

// Payload is a finished payload: its hash and size, and, for a small one,
// the spool entry its Record keeps inside the bbolt file.
type Payload struct {
	Sum string
	N   int64
	rec []byte // a small payload's spool entry (see Writer.rec); nil for a large one
}

// Commit makes the payload durable under its hash. Storing bytes that are
// already there is a no-op that returns the same hash.
func (w *Writer) Commit() (sum string, n int64, err error) {
	p, err := w.Finish()
	if err != nil {
		return "", 0, err
	}
	rec, ok := p.Record()
	if !ok {
		return p.Sum, p.N, nil // a large payload: Finish filed it
	}
	// Batch: the payloads of items finishing together share a commit.
	if err := w.s.db.Batch(func(tx *bolt.Tx) error { return tx.Bucket(rec.Bucket).Put(rec.Key, rec.Value) }); err != nil {
		return "", 0, fmt.Errorf("store payload: %w", err)
	}
	return p.Sum, p.N, nil
}

// Finish ends the payload: a large one is made durable as its file now; a
// small one is durable only once its Record is stored, which lets the
// caller store it in the same transaction as what refers to it.
func (w *Writer) Finish() (Payload, error) {
	w.done = true
	if w.f != nil {
		sum := hexSum(w.h.Sum(nil))
		n, err := w.commitFile(sum)
		return Payload{Sum: sum, N: n}, err
	}
	if w.rec == nil { // an empty payload
		w.rec = make([]byte, recordHeader)
	}
	// Sum appends the hash to its argument, here an empty slice of rec
	// with room for it: the hash lands in its place in the header without
	// a buffer of its own. (The copy does nothing, unless a Sum did not
	// append in place.)
	raw := w.rec[8:recordHeader]
	copy(raw, w.h.Sum(raw[:0]))
	sum := hexSum(raw)
	binary.BigEndian.PutUint64(w.rec, w.s.spool(sum))
	return Payload{Sum: sum, N: w.n, rec: w.rec}, nil
}

// spool hands out the next spool key, for the payload sum. The store finds
// the payload there from now on; until the caller's transaction commits it
// is not there, and the store looks in the payload bucket and the files
// instead, which is where a payload Record never committed is not either.
func (s *Store) spool(sum string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.spoolNext++
	s.pending[sum] = s.spoolNext
	return s.spoolNext
}

// Record is the spool entry of a small payload: storing it makes the
// payload durable. ok is false for a large payload, which Finish has
// already filed. Key and Value share the payload's array, which nothing
// changes once it is finished: bbolt copies the key, and keeps the value
// until the transaction ends.
func (p Payload) Record() (rec auditd.Put, ok bool) {
	if p.rec == nil {
		return auditd.Put{}, false
	}
	return auditd.Put{Bucket: bucketSpool, Key: p.rec[:8:8], Value: p.rec[8:]}, true
}

// Unspool forgets rec, the spool entry of a payload (Payload.Record), when
// the transaction meant to store it failed: the store stops looking for the
// payload in the spool under rec's key, and the index of spooled payloads
// does not keep an entry that no Compact would ever clear. A last-good
// record (LastGoodRecord) is forgotten too: its copy never becomes usable.
// A record of another bucket, or one whose payload has since been spooled
// again under a later key, is left alone.
func (s *Store) Unspool(rec auditd.Put) {
	if bytes.Equal(rec.Bucket, bucketRecent) && len(rec.Key) == 8 {
		s.mu.Lock()
		delete(s.recent.pending, binary.BigEndian.Uint64(rec.Key)) // a last-good record (LastGoodRecord)
		s.mu.Unlock()
		return
	}
	if !bytes.Equal(rec.Bucket, bucketSpool) || len(rec.Key) != 8 || len(rec.Value) < sha256.Size {
		return
	}
	sum := hex.EncodeToString(rec.Value[:sha256.Size])
	key := binary.BigEndian.Uint64(rec.Key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pending[sum] == key {
		delete(s.pending, sum)
	}
}

// commitFile syncs the payload's file and files it under sum.
func (w *Writer) commitFile(sum string) (n int64, err error) {
	tmp := w.f.Name()
	defer os.Remove(tmp) // gone after a successful rename; cleans up otherwise
	if err := w.f.Sync(); err != nil {
		w.f.Close()
		return 0, fmt.Errorf("sync payload: %w", err)
	}
	if err := w.f.Close(); err != nil {
		return 0, fmt.Errorf("close payload: %w", err)
	}
	dst := w.s.path(sum)
	if _, err := os.Stat(dst); err == nil {
		return w.n, nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
		return 0, fmt.Errorf("create payload directory: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return 0, fmt.Errorf("file payload: %w", err)
	}
	return w.n, nil
}

// Abort discards an uncommitted payload.
func (w *Writer) Abort() {
	if w.done {
		return
	}
	w.done = true
	if w.f != nil {
		w.f.Close()
		os.Remove(w.f.Name())
	}
}

// Put stages everything r yields and returns its hash and size.
func (s *Store) Put(r io.Reader) (sum string, n int64, err error) {
	w, err := s.NewWriter()
	if err != nil {
		return "", 0, err
	}
	if _, err := io.Copy(w, r); err != nil {
		w.Abort()
		return "", 0, err
	}
	return w.Commit()
}

// Open returns the payload stored under sum.
func (s *Store) Open(sum string) (io.ReadCloser, error) {
	if !validSum(sum) {
		return nil, ErrNotFound
	}
	s.mu.Lock()
	key, spooled := s.pending[sum]
	s.mu.Unlock()
	var inline []byte
	if err := s.db.View(func(tx *bolt.Tx) error {
		if spooled {
			v := tx.Bucket(bucketSpool).Get(binary.BigEndian.AppendUint64(nil, key))
			if len(v) >= sha256.Size && hex.EncodeToString(v[:sha256.Size]) == sum {
				inline = bytes.Clone(v[sha256.Size:])
				return nil
			}
		}
		if v := tx.Bucket(bucketInline).Get([]byte(sum)); v != nil {
			inline = bytes.Clone(v)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	if inline != nil {
		return io.NopCloser(bytes.NewReader(inline)), nil
	}
	f, err := os.Open(s.path(sum))
	if errors.Is(err, os.ErrNotExist) {
		return nil, s.notFound(sum)
	}
	return f, err
}

// VerifyPayload re-hashes the payload stored under sum: nil when it is there
// and unaltered, ErrNotFound or ErrCorrupt otherwise.
func (s *Store) VerifyPayload(sum string) error {
	f, err := s.Open(sum)
	if err != nil {
		return err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return fmt.Errorf("read payload %s: %w", sum, err)
	}
	if hex.EncodeToString(h.Sum(nil)) != sum {
		return fmt.Errorf("payload %s: %w", sum, ErrCorrupt)
	}
	return nil
}

// RequestKey names a request for the last-good index: the same source,
// method, path and body are the same request whatever run asks for it.
func RequestKey(sourceID, method, path string, body []byte) string {
	h := sha256.New()
	var buf [20]byte
	for _, part := range [][]byte{[]byte(sourceID), []byte(method), []byte(path), body} {
		h.Write(append(strconv.AppendInt(buf[:0], int64(len(part)), 10), ':'))
		h.Write(part)
	}
	var sum [sha256.Size]byte
	return hexSum(h.Sum(sum[:0]))
}

// hexSum is hex.EncodeToString of a SHA-256 sum in one allocation, the
// string's, where EncodeToString takes two: staging names three of them
// per payload (BenchmarkLoopInMemory's allocs/req).
func hexSum(sum []byte) string {
	var buf [2 * sha256.Size]byte
	return string(hex.AppendEncode(buf[:0], sum))
}

func (s *Store) path(sum string) string { return filepath.Join(s.dir, sum[:2], sum) }

func validSum(sum string) bool {
	if len(sum) != 64 {
		return false
	}
	_, err := hex.DecodeString(sum)
	return err == nil
}
