package ledger_test

import (
	"bytes"
	"crypto/rand"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"golang.org/x/mod/sumdb/note"
)

func TestCanonicalRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		e    auditd.Event
	}{
		{"Empty", auditd.Event{}},
		{"EveryField", fullEvent()},
		{"UnixEpoch", auditd.Event{Type: "x", Time: time.Unix(0, 0).UTC()}},
		{"BeforeEpoch", auditd.Event{Type: "x", Time: time.Date(1969, 7, 20, 20, 17, 0, 0, time.UTC)}},
		{"Negative", auditd.Event{Type: "x", Mono: -1, Status: -1, Bytes: -1 << 40}},
		{"MaxUint32", auditd.Event{Type: "x", Seq: 1<<64 - 1, Page: 1<<32 - 1, Attempt: 1<<32 - 1}},
		// The fields that share tag 7 or tag 35 by type, each with its type.
		{"Gate", auditd.Event{Type: auditd.EventWait, Gate: "rate", Attempt: 2}},
		{"ShedGate", auditd.Event{Type: auditd.EventShed, Gate: "pause"}},
		{"Probe", auditd.Event{Type: auditd.EventDispatch, Attempt: 3, Probe: true}},
		{"ErrorText", auditd.Event{Type: auditd.EventTransportError, ErrorText: "connection reset"}},
		{"Cause", auditd.Event{Type: auditd.EventRegistryChanged, Cause: "429"}},
		{"Snapshot", auditd.Event{Type: auditd.EventRegistrySnapshot, Snapshot: "run.end"}},
		{"Head", auditd.Event{Type: auditd.EventExport, Head: "57"}},
		{"Attempts", auditd.Event{Type: auditd.EventItemFinished, Attempts: 4, Reason: "deadline"}},
		{"Reason", auditd.Event{Type: auditd.EventRunResumed, Reason: "restart"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := ledger.MarshalCanonical(nil, &tc.e)
			var got auditd.Event
			if err := ledger.UnmarshalCanonical(b, &got); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.e) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, tc.e)
			}
			if again := ledger.MarshalCanonical(nil, &got); !bytes.Equal(again, b) {
				t.Fatalf("re-encoding differs")
			}
		})
	}
}

// TestCanonicalSharedTags: the fields that share a tag by event type are
// written under it, as the one field of their type they were before the
// split (testdata/v1 holds a whole ledger of them).
func TestCanonicalSharedTags(t *testing.T) {
	for _, tc := range []struct {
		e    auditd.Event
		want []byte
	}{
		{auditd.Event{Type: auditd.EventShed, Gate: "rate"}, []byte{1, 2, 4, 's', 'h', 'e', 'd', 35, 4, 'r', 'a', 't', 'e'}},
		{auditd.Event{Type: auditd.EventDispatch, Attempt: 2, Probe: true},
			[]byte{1, 2, 8, 'd', 'i', 's', 'p', 'a', 't', 'c', 'h', 7, 2, 35, 5, 'p', 'r', 'o', 'b', 'e'}},
		{auditd.Event{Type: "x", Attempt: 2, Reason: "y"}, []byte{1, 2, 1, 'x', 7, 2, 35, 1, 'y'}},
		{auditd.Event{Type: auditd.EventItemFinished, Attempts: 3},
			[]byte{1, 2, 13, 'i', 't', 'e', 'm', '.', 'f', 'i', 'n', 'i', 's', 'h', 'e', 'd', 7, 3}},
	} {
		if got := ledger.MarshalCanonical(nil, &tc.e); !bytes.Equal(got, tc.want) {
			t.Errorf("%s: canonical bytes\n got % x\nwant % x", tc.e.Type, got, tc.want)
		}
	}
}

// TestCanonicalGolden pins the bytes of one event: if it fails, stored
// hashes would change meaning, which the format forbids.
func TestCanonicalGolden(t *testing.T) {
	e := auditd.Event{Seq: 300, Type: auditd.EventWait, RunID: "r", Time: time.Unix(1, 5).UTC(), Wait: -2, Clamped: true}
	got := ledger.MarshalCanonical(nil, &e)
	want := []byte{1, 1, 0xac, 0x02, 2, 4, 'w', 'a', 'i', 't', 3, 1, 'r', 8, 0x8a, 0xa8, 0xd6, 0xb9, 0x07, 16, 3, 20}
	if !bytes.Equal(got, want) {
		t.Fatalf("canonical bytes\n got % x\nwant % x", got, want)
	}
}

func TestUnmarshalCanonicalRejects(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"Empty", nil},
		{"UnknownVersion", []byte{2}},
		{"OutOfOrder", []byte{1, 3, 1, 'r', 2, 1, 'x'}},
		{"Repeated", []byte{1, 3, 1, 'r', 3, 1, 'r'}},
		{"UnknownTag", []byte{1, 99, 0}},
		{"ZeroValue", []byte{1, 1, 0}},
		{"NonMinimalVarint", []byte{1, 1, 0x81, 0x00}},
		{"StringPastEnd", []byte{1, 2, 9, 'x'}},
		{"TruncatedVarint", []byte{1, 1, 0x80}},
		{"PageOverflow", []byte{1, 6, 0x80, 0x80, 0x80, 0x80, 0x10}},
		{"DispatchCauseNotProbe", []byte{1, 2, 8, 'd', 'i', 's', 'p', 'a', 't', 'c', 'h', 35, 1, 'x'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var e auditd.Event
			if err := ledger.UnmarshalCanonical(tc.b, &e); !errors.Is(err, ledger.ErrCorrupt) {
				t.Fatalf("UnmarshalCanonical(% x) = %v, want ErrCorrupt", tc.b, err)
			}
		})
	}
}

// FuzzUnmarshalCanonical: the decoder never panics, and whatever it accepts
// re-encodes to the same bytes (one event, one encoding, one hash).
func FuzzUnmarshalCanonical(f *testing.F) {
	full := fullEvent()
	full.Seq, full.Time = 7, time.Unix(1700000000, 1).UTC()
	f.Add(ledger.MarshalCanonical(nil, &full))
	f.Add([]byte{1})
	f.Add([]byte{1, 1, 0xac, 0x02, 20})
	f.Fuzz(func(t *testing.T, b []byte) {
		var e auditd.Event
		if err := ledger.UnmarshalCanonical(b, &e); err != nil {
			return
		}
		if again := ledger.MarshalCanonical(nil, &e); !bytes.Equal(again, b) {
			t.Fatalf("accepted % x but re-encodes as % x", b, again)
		}
	})
}

// FuzzProofUnmarshalText: proofs arrive from outside; parsing never panics,
// a parsed proof re-marshals to what was parsed, and Verify never accepts
// an event that is not in the ledger.
func FuzzProofUnmarshalText(f *testing.F) {
	l := MustOpen(f, MustOpenDB(f), ledger.Options{})
	appendN(f, l, "r", 5)
	p, err := l.Prove(3)
	if err != nil {
		f.Fatal(err)
	}
	good, _ := p.MarshalText()
	f.Add(good)
	f.Add([]byte("auditd inclusion proof v1\nseq 1\nrecord AQ==\n\n"))
	key := l.PublicKey()
	f.Fuzz(func(t *testing.T, text []byte) {
		var q ledger.Proof
		if err := q.UnmarshalText(text); err != nil {
			return
		}
		again, _ := q.MarshalText()
		if !bytes.Equal(again, text) {
			t.Fatalf("parsed proof re-marshals differently")
		}
		e, _, err := q.Verify(key)
		if err != nil {
			return
		}
		// A proof that verifies may differ in form (note.Open ignores
		// signatures by unknown keys) but must speak for a stored event.
		stored, err := l.Event(q.Seq)
		if err != nil {
			t.Fatalf("proof of unknown event %d verifies", q.Seq)
		}
		stored.PrevHash, stored.Hash = [32]byte{}, [32]byte{}
		if !reflect.DeepEqual(e, stored) {
			t.Fatalf("proof verifies an event that is not the stored one:\n%s", text)
		}
	})
}

// FuzzOpenCheckpoint signs arbitrary text, so the checkpoint body parser
// behind the signature check is what gets fuzzed.
func FuzzOpenCheckpoint(f *testing.F) {
	skey, vkey, err := note.GenerateKey(rand.Reader, "auditd/fuzz")
	if err != nil {
		f.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		f.Fatal(err)
	}
	f.Add("auditd/fuzz\n3\nK0m7V5sZ3mSMBdYr3kF8e2yjJm+rT1hS7EJ3mCi0bIg=\ntime 2026-01-02T03:04:05Z\nchain K0m7V5sZ3mSMBdYr3kF8e2yjJm+rT1hS7EJ3mCi0bIg=\n")
	f.Add("auditd/fuzz\n0\n\n")
	f.Fuzz(func(t *testing.T, text string) {
		msg, err := note.Sign(&note.Note{Text: text}, signer)
		if err != nil {
			return // not a valid note text at all
		}
		tree, err := ledger.OpenCheckpoint(msg, vkey)
		if err != nil {
			if !errors.Is(err, ledger.ErrBadCheckpoint) {
				t.Fatalf("error %v is not ErrBadCheckpoint", err)
			}
			return
		}
		if tree.Origin != "auditd/fuzz" {
			t.Fatalf("accepted origin %q", tree.Origin)
		}
	})
}

// TestCheckpointNoteVerifiesWithStockTools checks the checkpoint is a plain
// sumdb note: anyone with golang.org/x/mod and the public key can open it.
func TestCheckpointNoteVerifiesWithStockTools(t *testing.T) {
	l := MustOpen(t, MustOpenDB(t), ledger.Options{})
	appendN(t, l, "r", 2)
	msg, _ := l.Checkpoint()
	v, err := note.NewVerifier(l.PublicKey())
	if err != nil {
		t.Fatal(err)
	}
	n, err := note.Open(msg, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	if want := v.Name() + "\n2\n"; !bytes.HasPrefix([]byte(n.Text), []byte(want)) {
		t.Fatalf("checkpoint text %q does not start with %q", n.Text, want)
	}
}
