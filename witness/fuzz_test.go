package witness_test

import (
	"testing"

	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/witness"
)

// FuzzAdd: a cosigned checkpoint comes from outside (a witness's POST);
// parsing a key or a note never panics, and nothing unverified is kept.
func FuzzAdd(f *testing.F) {
	f.Add([]byte("auditd/x\n1\nAAAA\n\n— auditd/x AAAA\n"), "w+00000000+BAAA")
	f.Add([]byte{}, "")
	db, l := openLedger(f)
	st, err := witness.Open(db, l.PublicKey(), nil, ledger.NewReader(db))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, msg []byte, key string) {
		if v, err := witness.NewVerifier(key); err == nil {
			witness.Cosigned(msg, v)
			v.Verify(msg, msg)
		}
		if _, _, err := st.Add(msg); err == nil {
			t.Fatalf("kept a note no configured witness cosigned: %q", msg)
		}
	})
}
