package staging

import (
	"encoding/binary"
	"testing"
	"time"
)

// Entries written before the index recorded runs (fetched at, then the
// hash alone) still read back, with no run; new entries keep theirs.
func TestDecodeLastGoodBothFormats(t *testing.T) {
	at := time.Date(2026, 11, 2, 8, 0, 0, 0, time.UTC)
	sum := "7d865e959b2466918c9863afca942d0fb89d7c9ac0c99bafc3749504ded97730"
	old := append(binary.BigEndian.AppendUint64(nil, uint64(at.UnixNano())), sum...)
	if c, ok := decodeLastGood(old); !ok || c != (Copy{Sum: sum, FetchedAt: at}) {
		t.Errorf("old entry: %+v %v", c, ok)
	}
	want := Copy{Sum: sum, FetchedAt: at, Run: "01JRUN"}
	if c, ok := decodeLastGood((&Store{}).LastGoodRecord("k", want).Value); !ok || c != want {
		t.Errorf("new entry: %+v %v, want %+v", c, ok, want)
	}
	if _, ok := decodeLastGood(old[:8]); ok {
		t.Error("an entry with no hash decodes")
	}
}
