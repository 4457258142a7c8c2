package ledger

import (
	"bytes"
	"testing"

	"golang.org/x/mod/sumdb/tlog"
)

// leafHasher must hash exactly as tlog.RecordHash: every stored tree hash
// and every proof depends on it. The scratch buffer is reused, so a long
// record followed by a short one must not leak bytes into the second hash.
func TestLeafHasherIsRecordHash(t *testing.T) {
	var h leafHasher
	for _, data := range [][]byte{
		nil,
		{},
		{0x00},
		[]byte("a"),
		bytes.Repeat([]byte{0xab}, 55), // with the prefix: one byte short of a block
		bytes.Repeat([]byte{0xcd}, 64),
		bytes.Repeat([]byte("event"), 200),
		[]byte("b"),
	} {
		if got, want := h.hash(data), tlog.RecordHash(data); got != want {
			t.Errorf("len %d: leafHasher %x, tlog.RecordHash %x", len(data), got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { h.hash([]byte("an event's canonical bytes")) }); n != 0 {
		t.Errorf("leafHasher.hash allocates %v times per call", n)
	}
}

func FuzzLeafHasher(f *testing.F) {
	f.Add([]byte("seed"), []byte("second"))
	f.Fuzz(func(t *testing.T, a, b []byte) {
		var h leafHasher
		for _, data := range [][]byte{a, b} {
			if got, want := h.hash(data), tlog.RecordHash(data); got != want {
				t.Fatalf("leafHasher(%x) = %x, tlog.RecordHash %x", data, got, want)
			}
		}
	})
}
