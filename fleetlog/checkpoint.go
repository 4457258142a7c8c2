package fleetlog

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"sort"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/tlog"
)

// Tree is a fleet checkpoint's body: the fleet log held Size leaves whose
// RFC 6962 tree hash is Root. Text is its C2SP form:
//
//	<origin>
//	<size>
//	<base64 root>
type Tree struct {
	Origin string
	Size   uint64
	Root   tlog.Hash
}

// Text returns the checkpoint body that cosignatures sign.
func (t Tree) Text() string {
	return fmt.Sprintf("%s\n%d\n%s\n", t.Origin, t.Size, base64.StdEncoding.EncodeToString(t.Root[:]))
}

// Cosigner signs fleet checkpoints for one node in the C2SP cosignature/v1
// format (package witness reads it), with the node's ledger key.
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
	if err != nil || len(raw) != 1+ed25519.SeedSize || raw[0] != 0x01 {
		return nil, fmt.Errorf("%w: not an Ed25519 note signer key", ErrBadKey)
	}
	priv := ed25519.NewKeyFromSeed(raw[1:])
	cosig := append([]byte{0x04}, priv.Public().(ed25519.PublicKey)...)
	return &Cosigner{name: f[2], hash: keyHash(f[2], cosig), priv: priv}, nil
}

// Name is the cosigner's name: the node ledger's origin.
func (c *Cosigner) Name() string { return c.name }

// sign returns the note signature line of text at t.
func (c *Cosigner) sign(text string, t time.Time) string {
	secs := uint64(t.Unix())
	msg := append(fmt.Appendf(nil, "cosignature/v1\ntime %d\n", secs), text...)
	sig := make([]byte, 4, 4+8+ed25519.SignatureSize)
	binary.BigEndian.PutUint32(sig, c.hash)
	sig = binary.BigEndian.AppendUint64(sig, secs)
	sig = append(sig, ed25519.Sign(c.priv, msg)...)
	return "\u2014 " + c.name + " " + base64.StdEncoding.EncodeToString(sig) + "\n"
}

func keyHash(name string, key []byte) uint32 {
	h := sha256.New()
	h.Write([]byte(name))
	h.Write([]byte("\n"))
	h.Write(key)
	return binary.BigEndian.Uint32(h.Sum(nil))
}

// assemble returns the note of text and its signature lines, in name
// order, so that every node assembles the same bytes.
func assemble(text string, lines []string) []byte {
	sort.Strings(lines)
	return []byte(text + "\n" + strings.Join(lines, ""))
}
