package seal

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// KeyFile is the name of the sealing key in the data directory.
const KeyFile = "secrets.key"

// version is the first byte of every sealed value: a stored value that
// does not start with it was stored before sealing.
const version = 0xA1

// ErrOpen means a sealed value does not open under the box's key: another
// key sealed it, or it was altered.
var ErrOpen = errors.New("seal: value does not open under this key")

// Box seals and opens values under one key. It is safe for concurrent use.
type Box struct {
	aead cipher.AEAD
}

// Open returns the box of the key in dir/KeyFile, making the key (mode
// 0600) when there is none.
func Open(dir string) (*Box, error) {
	path := filepath.Join(dir, KeyFile)
	key, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		key = make([]byte, 32)
		_, _ = rand.Read(key) // crypto/rand.Read never fails
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create sealing key: %w", err)
		}
		if _, err := f.Write(key); err != nil {
			f.Close()
			return nil, fmt.Errorf("write sealing key: %w", err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("write sealing key: %w", err)
		}
		if err := f.Close(); err != nil {
			return nil, fmt.Errorf("write sealing key: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("read sealing key: %w", err)
	}
	return New(key)
}

// New returns the box of a 32-byte key.
func New(key []byte) (*Box, error) {
	if len(key) != 32 {
		return nil, fmt.Errorf("seal: key is %d bytes, want 32", len(key))
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &Box{aead: aead}, nil
}

// Ephemeral returns a box whose key lives in this process only: what it
// seals cannot be opened after a restart.
func Ephemeral() *Box {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	b, _ := New(key) // 32 bytes: cannot fail
	return b
}

// Seal returns plain sealed, bound to context (a value sealed for one key
// of a bucket does not open for another).
func (b *Box) Seal(plain, context []byte) []byte {
	out := make([]byte, 1+b.aead.NonceSize(), 1+b.aead.NonceSize()+len(plain)+b.aead.Overhead())
	out[0] = version
	_, _ = rand.Read(out[1:])
	return b.aead.Seal(out, out[1:], plain, context)
}

// Open returns the plain value of sealed, which Seal made with the same
// context; ErrOpen when it does not open.
func (b *Box) Open(sealed, context []byte) ([]byte, error) {
	n := b.aead.NonceSize()
	if !IsSealed(sealed) || len(sealed) < 1+n+b.aead.Overhead() {
		return nil, ErrOpen
	}
	plain, err := b.aead.Open(nil, sealed[1:1+n], sealed[1+n:], context)
	if err != nil {
		return nil, ErrOpen
	}
	return plain, nil
}

// IsSealed reports whether a stored value is a sealed one rather than one
// stored in the clear before sealing (JSON, which starts otherwise).
func IsSealed(v []byte) bool { return len(v) > 0 && v[0] == version }
