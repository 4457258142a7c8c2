// Package witness checks and keeps witness cosignatures of the ledger's
// checkpoints, in the C2SP tlog-cosignature format (cosignature/v1 with
// Ed25519): a witness that has checked a checkpoint is consistent with
// every earlier one it saw adds a signature line of its own to the note.
//
// A cosignature's key is a note verifier key whose key bytes are 0x04 and
// the Ed25519 public key; its key hash is the first four bytes of
// SHA-256(name || "\n" || 0x04 || public key). The signature is an 8-byte
// big-endian Unix time and the Ed25519 signature of
//
//	cosignature/v1
//	time <that time, decimal>
//	<the checkpoint's note text>
//
// A standard Ed25519 note key (0x01) is accepted too and read as the
// cosignature key of the same public key, as transparency-dev/formats
// does. The package implements the format itself: the production binary
// depends on golang.org/x/mod/sumdb/note only.
//
// Cosigner makes such signatures with a note signer key: a fleet node
// cosigns the fleet log's checkpoints with its ledger's key (package
// fleetlog).
//
// Store keeps the cosigned checkpoints in the bbolt file (bucket
// witness.cosigned), so that packs can be proven against them.
package witness

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
)

// Key types of a verifier key's first byte.
const (
	algEd25519      = 0x01
	algCosignature1 = 0x04
)

// ErrBadKey means a witness key does not parse as an Ed25519 note or
// cosignature/v1 verifier key.
var ErrBadKey = errors.New("bad witness key")

// ErrNotCosigned means a checkpoint carries no valid cosignature of a
// required witness.
var ErrNotCosigned = errors.New("checkpoint not cosigned")

// Verifier checks one witness's cosignatures; it is a note.Verifier, so
// note.Open checks cosignatures beside the log's own signature.
type Verifier struct {
	name string
	hash uint32
	pub  ed25519.PublicKey
}

// NewVerifier parses a witness's verifier key.
func NewVerifier(vkey string) (*Verifier, error) {
	name, rest, _ := strings.Cut(vkey, "+")
	hash16, key64, _ := strings.Cut(rest, "+")
	key, err := base64.StdEncoding.DecodeString(key64)
	if name == "" || len(hash16) != 8 || err != nil || len(key) != 1+ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: %q", ErrBadKey, vkey)
	}
	if key[0] != algEd25519 && key[0] != algCosignature1 {
		return nil, fmt.Errorf("%w: key type %#x is not Ed25519", ErrBadKey, key[0])
	}
	if key[0] == algCosignature1 {
		h, err := strconv.ParseUint(hash16, 16, 32)
		if err != nil || uint32(h) != keyHash(name, key) {
			return nil, fmt.Errorf("%w: key hash does not match", ErrBadKey)
		}
	}
	cosig := append([]byte{algCosignature1}, key[1:]...)
	return &Verifier{name: name, hash: keyHash(name, cosig), pub: ed25519.PublicKey(key[1:])}, nil
}

func keyHash(name string, key []byte) uint32 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte("\n"))
	h.Write(key)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// Name implements note.Verifier.
func (v *Verifier) Name() string { return v.name }

// KeyHash implements note.Verifier.
func (v *Verifier) KeyHash() uint32 { return v.hash }

// Verify implements note.Verifier: msg is the note's text.
func (v *Verifier) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	t := binary.BigEndian.Uint64(sig)
	return ed25519.Verify(v.pub, signedMessage(t, msg), sig[8:])
}

func signedMessage(t uint64, msg []byte) []byte {
	return append(fmt.Appendf(nil, "cosignature/v1\ntime %d\n", t), msg...)
}

// Cosigned checks that msg, a signed checkpoint note, carries a valid
// cosignature of every verifier, and returns when each signed it.
func Cosigned(msg []byte, vs ...*Verifier) ([]time.Time, error) {
	out := make([]time.Time, len(vs))
	for i, v := range vs {
		n, err := note.Open(msg, note.VerifierList(v))
		if err != nil {
			return nil, fmt.Errorf("%w by %s: %v", ErrNotCosigned, v.name, err)
		}
		for _, s := range n.Sigs {
			if s.Name == v.name && s.Hash == v.hash {
				raw, _ := base64.StdEncoding.DecodeString(s.Base64)
				if len(raw) >= 12 {
					out[i] = time.Unix(int64(binary.BigEndian.Uint64(raw[4:])), 0).UTC()
				}
			}
		}
	}
	return out, nil
}
