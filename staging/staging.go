package staging

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"

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
	bucketLastGood = []byte("staging.lastgood") // request key -> payload hash
	bucketInline   = []byte("staging.payloads") // payload hash -> bytes, for small payloads
)

// ErrTooLarge means a payload was larger than the store's cap; nothing was kept.
var ErrTooLarge = errors.New("payload larger than the staging cap")

// ErrNotFound means no payload is stored under a hash.
var ErrNotFound = errors.New("payload not found")

// ErrCorrupt means a stored payload no longer hashes to its name.
var ErrCorrupt = errors.New("payload does not match its hash")

// Store is a content-addressed payload store with a last-good index.
type Store struct {
	dir string
	db  *bolt.DB

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
		for _, b := range [][]byte{bucketLastGood, bucketInline} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("create staging buckets: %w", err)
	}
	return &Store{dir: dir, db: db, MaxBytes: DefaultMaxBytes, InlineMax: DefaultInlineMax}, nil
}

// Writer stages one payload written in pieces (the pages of a paged item).
// Commit makes it durable and returns its hash; Abort discards it. A payload
// stays in memory until it outgrows InlineMax; only then is its file created.
type Writer struct {
	s    *Store
	buf  []byte   // the payload while it is small
	f    *os.File // the payload once it is not
	h    hash.Hash
	n    int64
	done bool
}

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
	if w.f == nil && len(w.buf)+len(p) <= w.s.InlineMax {
		w.buf = append(w.buf, p...)
		return len(p), nil
	}
	if w.f == nil {
		f, err := os.CreateTemp(w.s.dir, ".staging-*")
		if err != nil {
			return 0, fmt.Errorf("create staging file: %w", err)
		}
		w.f = f
		if _, err := f.Write(w.buf); err != nil {
			return 0, err
		}
		w.buf = nil
	}
	return w.f.Write(p)
}

// Len is how many bytes were written so far.
func (w *Writer) Len() int64 { return w.n }

// Payload is a finished payload: its hash and size, and, for a small one,
// the bytes that PutPayload stores inside the bbolt file.
type Payload struct {
	Sum    string
	N      int64
	small  bool   // kept inside the bbolt file
	inline []byte // its bytes, when small
}

// Commit makes the payload durable under its hash. Storing bytes that are
// already there is a no-op that returns the same hash.
func (w *Writer) Commit() (sum string, n int64, err error) {
	p, err := w.Finish()
	if err != nil {
		return "", 0, err
	}
	// Batch: the payloads of items finishing together share a commit.
	if err := w.s.db.Batch(func(tx *bolt.Tx) error { return w.s.PutPayload(tx, p) }); err != nil {
		return "", 0, fmt.Errorf("store payload: %w", err)
	}
	return p.Sum, p.N, nil
}

// Finish ends the payload: a large one is made durable as its file now; a
// small one is durable only once PutPayload has committed it, which lets the
// caller store it in the same transaction as what refers to it.
func (w *Writer) Finish() (Payload, error) {
	w.done = true
	sum := hex.EncodeToString(w.h.Sum(nil))
	if w.f == nil {
		return Payload{Sum: sum, N: w.n, small: true, inline: w.buf}, nil
	}
	n, err := w.commitFile(sum)
	return Payload{Sum: sum, N: n}, err
}

// PutPayload stores a small payload in tx; for a large one, already filed
// by Finish, it does nothing.
func (s *Store) PutPayload(tx *bolt.Tx, p Payload) error {
	if !p.small {
		return nil
	}
	v := p.inline
	if v == nil {
		v = []byte{} // the empty payload
	}
	return tx.Bucket(bucketInline).Put([]byte(p.Sum), v)
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
	var inline []byte
	if err := s.db.View(func(tx *bolt.Tx) error {
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
		return nil, ErrNotFound
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

// SetLastGood records sum as the last good payload of a request.
func (s *Store) SetLastGood(requestKey, sum string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return s.PutLastGood(tx, requestKey, sum) })
}

// PutLastGood is SetLastGood inside the caller's transaction, so an item's
// result and its last-good index commit together.
func (s *Store) PutLastGood(tx *bolt.Tx, requestKey, sum string) error {
	return tx.Bucket(bucketLastGood).Put([]byte(requestKey), []byte(sum))
}

// LastGood returns the last good payload of a request, if there is one.
func (s *Store) LastGood(requestKey string) (sum string, ok bool, err error) {
	err = s.db.View(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bucketLastGood).Get([]byte(requestKey)); v != nil {
			sum, ok = string(v), true
		}
		return nil
	})
	return sum, ok, err
}

// RequestKey names a request for the last-good index: the same source,
// method, path and body are the same request whatever run asks for it.
func RequestKey(sourceID, method, path string, body []byte) string {
	h := sha256.New()
	for _, part := range [][]byte{[]byte(sourceID), []byte(method), []byte(path), body} {
		fmt.Fprintf(h, "%d:", len(part))
		h.Write(part)
	}
	return hex.EncodeToString(h.Sum(nil))
}

func (s *Store) path(sum string) string { return filepath.Join(s.dir, sum[:2], sum) }

func validSum(sum string) bool {
	if len(sum) != 64 {
		return false
	}
	_, err := hex.DecodeString(sum)
	return err == nil
}
