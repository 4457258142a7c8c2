package staging

import (
	"errors"
	"testing"

	"github.com/auditd/auditd"
)

// TestUnspoolForgetsARecordNeverStored: when the transaction that was to
// store a payload's spool entry fails, Unspool drops the entry from the
// index of spooled payloads, which no Compact would otherwise ever clear;
// it leaves alone an entry the payload has since been spooled under again,
// and records of other buckets.
func TestUnspoolForgetsARecordNeverStored(t *testing.T) {
	_, s, _ := openInternal(t)
	spool := func() (Payload, auditd.Put) {
		t.Helper()
		w, err := s.NewWriter()
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(`{"same":"body"}`))
		p, err := w.Finish()
		if err != nil {
			t.Fatal(err)
		}
		rec, ok := p.Record()
		if !ok {
			t.Fatal("a small payload has no record")
		}
		return p, rec
	}
	first, rec1 := spool()
	_, rec2 := spool() // the same bytes, spooled again under a later key

	s.Unspool(auditd.Put{Bucket: []byte("elsewhere"), Key: rec2.Key, Value: rec2.Value})
	s.Unspool(rec1)
	if got, want := s.pending[first.Sum], uint64(2); got != want {
		t.Fatalf("after unspooling the first record, the index points at key %d, want the later %d", got, want)
	}
	s.Unspool(rec2)
	if len(s.pending) != 0 {
		t.Fatalf("index of spooled payloads holds %v after both records were unspooled", s.pending)
	}
	if _, err := s.Open(first.Sum); !errors.Is(err, ErrNotFound) {
		t.Fatalf("open a payload never stored: %v, want ErrNotFound", err)
	}
}
