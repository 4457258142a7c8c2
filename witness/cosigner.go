package witness

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"os"
	"strings"
	"time"
)

// Cosigner signs checkpoints in the cosignature/v1 format Verifier reads,
// with a note signer key: a fleet node cosigns the fleet log's checkpoints
// with its ledger's key (package fleetlog).
type Cosigner struct {
	name string
	hash uint32
	priv ed25519.PrivateKey
}

// NewCosigner returns the cosigner of a note signer key (the ledger's
// ledger.key: PRIVATE+KEY+<name>+<hash>+<base64 0x01 and seed>).
func NewCosigner(skey string) (*Cosigner, error) {
	f := strings.SplitN(strings.TrimSpace(skey), "+", 5)
	if len(f) != 5 || f[0] != "PRIVATE" || f[1] != "KEY" || f[2] == "" || strings.ContainsAny(f[2], " \n") {
		return nil, fmt.Errorf("%w: not a note signer key", ErrBadKey)
	}
	raw, err := base64.StdEncoding.DecodeString(f[4])
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != algEd25519 {
		return nil, fmt.Errorf("%w: not an Ed25519 note signer key", ErrBadKey)
	}
	priv := ed25519.NewKeyFromSeed(raw[1:])
	cosig := append([]byte{algCosignature1}, priv.Public().(ed25519.PublicKey)...)
	return &Cosigner{name: f[2], hash: keyHash(f[2], cosig), priv: priv}, nil
}

// Name is the cosigner's name: the key's.
func (c *Cosigner) Name() string { return c.name }

// Sign returns the note signature line of a checkpoint's text at t.
func (c *Cosigner) Sign(text string, t time.Time) string {
	secs := uint64(t.Unix())
	sig := make([]byte, 4, 4+8+ed25519.SignatureSize)
	binary.BigEndian.PutUint32(sig, c.hash)
	sig = binary.BigEndian.AppendUint64(sig, secs)
	sig = append(sig, ed25519.Sign(c.priv, signedMessage(secs, []byte(text)))...)
	return "\u2014 " + c.name + " " + base64.StdEncoding.EncodeToString(sig) + "\n"
}

// ReadCosigner returns the cosigner of the note signer key in the file at
// path (a ledger's ledger.key).
func ReadCosigner(path string) (*Cosigner, error) {
	skey, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read cosigner key: %w", err)
	}
	return NewCosigner(string(skey))
}
