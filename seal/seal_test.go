package seal_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/auditd/auditd/seal"
)

func TestSealOpen(t *testing.T) {
	dir := t.TempDir()
	box, err := seal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, seal.KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", st, err)
	}
	plain := []byte("Bearer very-secret")
	sealed := box.Seal(plain, []byte("a"))
	if bytes.Contains(sealed, plain) || !seal.IsSealed(sealed) {
		t.Fatalf("sealed value %q shows the plain text or is not marked", sealed)
	}
	again, err := seal.Open(dir) // the same key, read back
	if err != nil {
		t.Fatal(err)
	}
	if got, err := again.Open(sealed, []byte("a")); err != nil || !bytes.Equal(got, plain) {
		t.Fatalf("Open = %q, %v", got, err)
	}
	if _, err := again.Open(sealed, []byte("b")); !errors.Is(err, seal.ErrOpen) {
		t.Fatalf("opened under another context: %v", err)
	}
	if _, err := seal.Ephemeral().Open(sealed, []byte("a")); !errors.Is(err, seal.ErrOpen) {
		t.Fatalf("opened under another key: %v", err)
	}
	if seal.IsSealed([]byte(`{"X-Api-Key":"v"}`)) {
		t.Fatal("a value stored in the clear passes for sealed")
	}
}
