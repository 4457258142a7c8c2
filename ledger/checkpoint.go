package ledger

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// Key files in Options.KeyDir. Both are written 0600: the public key is
// handed out through PublicKey, not by opening the directory to others.
const (
	PrivateKeyFile = "ledger.key"
	PublicKeyFile  = "ledger.pub"
)

// SignedTree is what a checkpoint says: the ledger held Size events, whose
// RFC 6962 tree hash is Root and whose hash chain ended at Chain, at Time.
//
// The note text is the C2SP checkpoint body, origin, size and base64 root on
// the first three lines, followed by two extension lines:
//
//	auditd/1f2e3d4c
//	1042
//	K0m7V5...=
//	time 2026-01-02T03:04:05.123456789Z
//	chain 9f1c...=
type SignedTree struct {
	Origin string
	Size   uint64
	Root   tlog.Hash
	Time   time.Time
	Chain  [32]byte
}

// format returns the checkpoint body for t, ready to sign.
func (t SignedTree) format() string {
	return fmt.Sprintf("%s\n%d\n%s\ntime %s\nchain %s\n", t.Origin, t.Size,
		base64.StdEncoding.EncodeToString(t.Root[:]), t.Time.UTC().Format(time.RFC3339Nano),
		base64.StdEncoding.EncodeToString(t.Chain[:]))
}

// OpenCheckpoint checks a signed checkpoint note against verifierKey and
// returns what it says. It fails with ErrBadCheckpoint for a note that is
// not signed by that key or not a checkpoint of this form.
func OpenCheckpoint(msg []byte, verifierKey string) (SignedTree, error) {
	v, err := note.NewVerifier(verifierKey)
	if err != nil {
		return SignedTree{}, fmt.Errorf("%w: verifier key: %v", ErrBadCheckpoint, err)
	}
	return openCheckpoint(msg, v)
}

func openCheckpoint(msg []byte, v note.Verifier) (SignedTree, error) {
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		return SignedTree{}, fmt.Errorf("%w: %v", ErrBadCheckpoint, err)
	}
	t, err := parseCheckpoint(n.Text)
	if err != nil {
		return SignedTree{}, err
	}
	if t.Origin != v.Name() {
		return SignedTree{}, fmt.Errorf("%w: origin %q is not the key's name %q", ErrBadCheckpoint, t.Origin, v.Name())
	}
	return t, nil
}

func parseCheckpoint(text string) (SignedTree, error) {
	lines := strings.Split(text, "\n")
	// note.Open guarantees the text ends in a newline, so the last element
	// is empty; anything but exactly five lines is not ours.
	if len(lines) != 6 || lines[5] != "" {
		return SignedTree{}, fmt.Errorf("%w: want 5 lines", ErrBadCheckpoint)
	}
	var t SignedTree
	t.Origin = lines[0]
	if t.Origin == "" {
		return SignedTree{}, fmt.Errorf("%w: empty origin", ErrBadCheckpoint)
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != lines[1] || size > 1<<62 {
		return SignedTree{}, fmt.Errorf("%w: bad size %q", ErrBadCheckpoint, lines[1])
	}
	t.Size = size
	if err := decodeHash(lines[2], t.Root[:]); err != nil {
		return SignedTree{}, fmt.Errorf("%w: root: %v", ErrBadCheckpoint, err)
	}
	ts, ok := strings.CutPrefix(lines[3], "time ")
	if !ok {
		return SignedTree{}, fmt.Errorf("%w: missing time line", ErrBadCheckpoint)
	}
	if t.Time, err = time.Parse(time.RFC3339Nano, ts); err != nil {
		return SignedTree{}, fmt.Errorf("%w: time: %v", ErrBadCheckpoint, err)
	}
	cs, ok := strings.CutPrefix(lines[4], "chain ")
	if !ok {
		return SignedTree{}, fmt.Errorf("%w: missing chain line", ErrBadCheckpoint)
	}
	if err := decodeHash(cs, t.Chain[:]); err != nil {
		return SignedTree{}, fmt.Errorf("%w: chain: %v", ErrBadCheckpoint, err)
	}
	return t, nil
}

func decodeHash(s string, dst []byte) error {
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return err
	}
	if len(b) != len(dst) {
		return fmt.Errorf("%d bytes, want %d", len(b), len(dst))
	}
	copy(dst, b)
	return nil
}

// loadKey reads the signing key from dir, generating a new pair when there
// is none and create is set (only for an empty ledger: a new key could not
// vouch for events the old one signed).
func loadKey(dir string, create bool) (note.Signer, string, error) {
	skey, err := os.ReadFile(filepath.Join(dir, PrivateKeyFile))
	if errors.Is(err, fs.ErrNotExist) && create {
		return generateKey(dir)
	} else if errors.Is(err, fs.ErrNotExist) {
		return nil, "", fmt.Errorf("%w: %s", ErrKeyMissing, filepath.Join(dir, PrivateKeyFile))
	} else if err != nil {
		return nil, "", fmt.Errorf("read signing key: %w", err)
	}
	vkey, err := ReadPublicKey(dir)
	if err != nil {
		return nil, "", err
	}
	signer, err := note.NewSigner(string(bytes.TrimSpace(skey)))
	if err != nil {
		return nil, "", fmt.Errorf("parse signing key: %w", err)
	}
	return signer, vkey, nil
}

// ReadPublicKey returns the note verifier key kept in dir.
func ReadPublicKey(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, PublicKeyFile))
	if errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("%w: %s", ErrKeyMissing, filepath.Join(dir, PublicKeyFile))
	} else if err != nil {
		return "", fmt.Errorf("read public key: %w", err)
	}
	vkey := string(bytes.TrimSpace(b))
	if _, err := note.NewVerifier(vkey); err != nil {
		return "", fmt.Errorf("parse public key: %w", err)
	}
	return vkey, nil
}

func generateKey(dir string) (note.Signer, string, error) {
	// The origin names this ledger in every checkpoint; the random suffix
	// keeps two deployments' checkpoints from claiming the same log.
	var id [4]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, "", fmt.Errorf("generate key: %w", err)
	}
	skey, vkey, err := note.GenerateKey(rand.Reader, "auditd/"+hex.EncodeToString(id[:]))
	if err != nil {
		return nil, "", fmt.Errorf("generate key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, "", fmt.Errorf("create key directory: %w", err)
	}
	// Public first: a crash between the two leaves no private key, and the
	// next start (still an empty ledger) generates a fresh pair.
	if err := writeFileSync(filepath.Join(dir, PublicKeyFile), vkey+"\n"); err != nil {
		return nil, "", err
	}
	if err := writeFileSync(filepath.Join(dir, PrivateKeyFile), skey+"\n"); err != nil {
		return nil, "", err
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		return nil, "", fmt.Errorf("generate key: %w", err)
	}
	return signer, vkey, nil
}

// writeFileSync writes a 0600 file atomically and durably.
func writeFileSync(path, data string) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	if _, err := f.WriteString(data); err != nil {
		f.Close()
		return fmt.Errorf("write key: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write key: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write key: %w", err)
	}
	return nil
}
