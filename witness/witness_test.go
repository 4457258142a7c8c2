package witness_test

import (
	"context"
	"crypto/rand"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	fnote "github.com/transparency-dev/formats/note"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/witness"
)

// newWitness returns a C2SP cosignature/v1 signer made with
// transparency-dev/formats, and its verifier key.
func newWitness(t *testing.T, name string) (note.Signer, string) {
	t.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, name)
	if err != nil {
		t.Fatal(err)
	}
	s, err := fnote.NewSignerForCosignatureV1(skey)
	if err != nil {
		t.Fatal(err)
	}
	cvkey, err := fnote.VKeyToCosignatureV1(vkey)
	if err != nil {
		t.Fatal(err)
	}
	return s, cvkey
}

func openLedger(t testing.TB) (*bolt.DB, *ledger.Ledger) {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close(context.Background()) })
	for range 5 {
		if _, err := l.Append(context.Background(), auditd.Event{Type: auditd.EventSourceChanged, SourceID: "s"}); err != nil {
			t.Fatal(err)
		}
	}
	return db, l
}

// cosign adds w's cosignature to the signed checkpoint msg.
func cosign(t *testing.T, msg []byte, logKey string, w note.Signer) []byte {
	t.Helper()
	v, _ := note.NewVerifier(logKey)
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	out, err := note.Sign(n, w)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCosignatures: cosignatures made with transparency-dev/formats verify
// here, are kept merged per size, and what is not a cosigned checkpoint of
// this ledger is refused.
func TestCosignatures(t *testing.T) {
	db, l := openLedger(t)
	w1, k1 := newWitness(t, "witness.example/one")
	w2, k2 := newWitness(t, "witness.example/two")
	_, k3 := newWitness(t, "witness.example/stranger")
	st, err := witness.Open(db, l.PublicKey(), []string{k1, k2}, ledger.NewReader(db))
	if err != nil {
		t.Fatal(err)
	}
	cp, _ := l.Checkpoint()
	one := cosign(t, cp, l.PublicKey(), w1)
	v1, err := witness.NewVerifier(k1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := witness.Cosigned(one, v1); err != nil {
		t.Fatalf("a formats cosignature does not verify: %v", err)
	}
	v3, _ := witness.NewVerifier(k3)
	if _, err := witness.Cosigned(one, v3); !errors.Is(err, witness.ErrNotCosigned) {
		t.Errorf("another witness's cosignature: %v, want ErrNotCosigned", err)
	}
	size, names, err := st.Add(one)
	if err != nil || size != 5 || len(names) != 1 {
		t.Fatalf("Add: %d %v %v", size, names, err)
	}
	if _, names, err = st.Add(cosign(t, cp, l.PublicKey(), w2)); err != nil || len(names) != 2 {
		t.Fatalf("second witness: %v %v", names, err)
	}
	kept, err := st.Get(5)
	if err != nil {
		t.Fatal(err)
	}
	v2, _ := witness.NewVerifier(k2)
	if _, err := witness.Cosigned(kept, v1, v2); err != nil {
		t.Errorf("kept note lacks a cosignature: %v", err)
	}
	if _, err := ledger.OpenCheckpoint(kept, l.PublicKey()); err != nil {
		t.Errorf("kept note no longer opens as the ledger's checkpoint: %v", err)
	}

	if _, _, err := st.Add(cp); !errors.Is(err, witness.ErrUnknownWitness) {
		t.Errorf("no cosignature: %v", err)
	}
	bad := []byte(strings.Replace(string(one), "\n\n", "\nextra\n\n", 1))
	if _, _, err := st.Add(bad); !errors.Is(err, witness.ErrNotOurs) {
		t.Errorf("altered text: %v", err)
	}
	// A checkpoint of another ledger, cosigned by a known witness.
	_, other := openLedger(t)
	ocp, _ := other.Checkpoint()
	if _, _, err := st.Add(cosign(t, ocp, other.PublicKey(), w1)); !errors.Is(err, witness.ErrNotOurs) {
		t.Errorf("another ledger's checkpoint: %v", err)
	}
}
