package witness

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// bucketCosigned holds, by tree size (8 bytes, big-endian), the
// checkpoint of that size with every cosignature accepted for it.
const bucketCosigned = "witness.cosigned"

// ErrUnknownWitness means a note carries no cosignature of a configured
// witness that verifies.
var ErrUnknownWitness = errors.New("no cosignature of a configured witness")

// ErrNotOurs means a cosigned note is not a checkpoint of this ledger: not
// signed by its key, or of another tree than the ledger's at that size.
var ErrNotOurs = errors.New("not a checkpoint of this ledger")

// TreeHasher gives the ledger's tree root at a size; *ledger.Reader
// provides it.
type TreeHasher interface {
	TreeHash(size uint64) (tlog.Hash, error)
}

// Store keeps cosigned checkpoints. It accepts a note only when the
// ledger's own signature verifies, its tree is the ledger's at its size,
// and it carries a valid cosignature of a configured witness.
type Store struct {
	db        *bolt.DB
	log       note.Verifier
	witnesses []*Verifier
	tree      TreeHasher
}

// Open returns the store in db. logKey is the ledger's verifier key,
// witnessKeys the witnesses whose cosignatures are accepted.
func Open(db *bolt.DB, logKey string, witnessKeys []string, tree TreeHasher) (*Store, error) {
	lv, err := note.NewVerifier(logKey)
	if err != nil {
		return nil, fmt.Errorf("witness store: log key: %w", err)
	}
	s := &Store{db: db, log: lv, tree: tree}
	for _, k := range witnessKeys {
		v, err := NewVerifier(k)
		if err != nil {
			return nil, err
		}
		s.witnesses = append(s.witnesses, v)
	}
	if !db.IsReadOnly() {
		if err := db.Update(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists([]byte(bucketCosigned))
			return err
		}); err != nil {
			return nil, fmt.Errorf("witness store: %w", err)
		}
	}
	return s, nil
}

// Add checks msg, a checkpoint note carrying witness cosignatures, and
// keeps it merged with the cosignatures already kept for its size. It
// returns the size and the names of the witnesses whose cosignatures it
// now holds.
func (s *Store) Add(msg []byte) (uint64, []string, error) {
	vs := []note.Verifier{s.log}
	for _, w := range s.witnesses {
		vs = append(vs, w)
	}
	n, err := note.Open(msg, note.VerifierList(vs...))
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrNotOurs, err)
	}
	var logSigned bool
	var cosigs []note.Signature
	for _, sig := range n.Sigs {
		if sig.Name == s.log.Name() && sig.Hash == s.log.KeyHash() {
			logSigned = true
		} else {
			cosigs = append(cosigs, sig)
		}
	}
	if !logSigned {
		return 0, nil, fmt.Errorf("%w: the ledger's signature is missing", ErrNotOurs)
	}
	if len(cosigs) == 0 {
		return 0, nil, ErrUnknownWitness
	}
	t, err := ledger.ParseCheckpoint(n.Text)
	if err != nil {
		return 0, nil, fmt.Errorf("%w: %v", ErrNotOurs, err)
	}
	size := t.Size
	if h, err := s.tree.TreeHash(size); err != nil || h != t.Root {
		return 0, nil, fmt.Errorf("%w: the ledger's tree at size %d is another", ErrNotOurs, size)
	}
	var names []string
	err = s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte(bucketCosigned))
		key := binary.BigEndian.AppendUint64(nil, size)
		merged := n
		if old := b.Get(key); old != nil {
			if on, err := note.Open(old, note.VerifierList(vs...)); err == nil && on.Text == n.Text {
				merged = &note.Note{Text: n.Text, Sigs: on.Sigs}
				for _, sig := range cosigs {
					if !slices.ContainsFunc(merged.Sigs, func(o note.Signature) bool { return o.Hash == sig.Hash && o.Name == sig.Name }) {
						merged.Sigs = append(merged.Sigs, sig)
					}
				}
			}
		}
		out, err := note.Sign(merged)
		if err != nil {
			return err
		}
		for _, sig := range merged.Sigs {
			if sig.Name != s.log.Name() {
				names = append(names, sig.Name)
			}
		}
		return b.Put(key, out)
	})
	if err != nil {
		return 0, nil, fmt.Errorf("keep cosigned checkpoint %d: %w", size, err)
	}
	return size, names, nil
}

// Get returns the cosigned checkpoint of size, or nil.
func (s *Store) Get(size uint64) ([]byte, error) {
	var out []byte
	err := s.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket([]byte(bucketCosigned)); b != nil {
			out = bytes.Clone(b.Get(binary.BigEndian.AppendUint64(nil, size)))
		}
		return nil
	})
	return out, err
}

// Witnesses names the configured witnesses.
func (s *Store) Witnesses() string {
	var names []string
	for _, w := range s.witnesses {
		names = append(names, w.Name())
	}
	return strings.Join(names, ", ")
}
