package pack

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/auditd/auditd/reports"
)

// TestSheetHasherCanonical holds the fleet sheet hash to the rule of
// docs/EVIDENCE-PACK.md (fleet step 5): a number as the shortest decimal
// that reads back as it however stored, a date-styled number as its time
// to the millisecond, booleans as TRUE/FALSE, strings escaped, empty
// cells up to the header's last column.
func TestSheetHasherCanonical(t *testing.T) {
	h := &sheetHasher{dates: map[int]bool{3: true}}
	h.sum.Reset()
	text := func(s string) []byte { return []byte(s) }
	row := func(cells []cell) bool { return h.row(cells, texts(cells, 0)) }
	h.header([]cell{{col: 0, typ: "inlineStr", text: text("Node")}, {col: 1, typ: "inlineStr", text: text("A\tB")},
		{col: 2, typ: "inlineStr", text: text("C")}, {col: 3, typ: "inlineStr", text: text("D")}, {col: 4, typ: "inlineStr", text: text("E")},
		{col: 5, typ: "inlineStr", text: text("F")}}, []string{"Node", "A\tB", "C", "D", "E", "F"})
	// 46083.4984567 is 2026-03-02T11:57:46.65888Z: .658, the digits past
	// the millisecond dropped, not rounded.
	if !row([]cell{{col: 0, typ: "inlineStr", text: text("a")}, {col: 1, text: text("1.50000000000000")},
		{col: 2, style: 3, text: text("46083.4984567")}, {col: 3, typ: "b", text: text("1")}, {col: 4, typ: "n", text: text("1E3")}}) {
		t.Fatal("cells in order reported out of order")
	}
	if !row([]cell{{col: 0, typ: "inlineStr", text: text(`x\y` + "\n")}, {col: 3, typ: "b", text: text("0")}}) {
		t.Fatal("cells in order reported out of order")
	}
	want := sha256.Sum256([]byte("Node\tA\\tB\tC\tD\tE\tF\n" +
		"a\t1.5\t2026-03-02T11:57:46.658Z\tTRUE\t1000\t\n" +
		"x\\\\y\\n\t\t\tFALSE\t\t\n"))
	if got := h.sum.hex(); got != hex.EncodeToString(want[:]) {
		t.Errorf("hash %s, want %x", got, want)
	}
	if row([]cell{{col: 2, text: text("1")}, {col: 1, text: text("2")}}) {
		t.Error("cells out of column order hashed")
	}
}

// TestAppendUnescapedLineEnds: a cell's text is read as XML reads it, a
// literal CR or CRLF a newline, a CR written &#xD; a CR, as the fleet
// merge's own reader and an XML decoder take it.
func TestAppendUnescapedLineEnds(t *testing.T) {
	got, err := appendUnescaped(nil, []byte("a\r\nb\rc&#xD;d&amp;"))
	if err != nil || string(got) != "a\nb\nc\rd&" {
		t.Errorf("got %q, %v", got, err)
	}
}

// TestSheetHasherMatchesCellText: a cell's text in the hash is what
// reports.AppendCellText, which the merge hashes with, renders for the
// value the merge reads: random numbers, dates over two centuries (as the
// merge turns a date serial to a time) and strings with escapes.
func TestSheetHasherMatchesCellText(t *testing.T) {
	h := &sheetHasher{dates: map[int]bool{1: true}}
	rng := rand.New(rand.NewPCG(30, 5))
	for range 20_000 {
		x := math.Float64frombits(rng.Uint64())
		if math.IsNaN(x) || math.IsInf(x, 0) {
			continue
		}
		stored := strconv.FormatFloat(x, 'E', -1, 64)
		if got, want := h.appendCell(nil, cell{text: []byte(stored)}, stored), reports.AppendCellText(nil, x); string(got) != string(want) {
			t.Fatalf("number %s: %q, want %q", stored, got, want)
		}
		serial := rng.Float64() * 73_000 // 1899 to 2099
		stored = strconv.FormatFloat(serial, 'f', -1, 64)
		days, frac := math.Modf(serial)
		at := time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC).Add(time.Duration(days)*24*time.Hour + time.Duration(math.Round(frac*86400e9))).Round(time.Microsecond)
		if got, want := h.appendCell(nil, cell{style: 1, text: []byte(stored)}, stored), reports.AppendCellText(nil, at); string(got) != string(want) {
			t.Fatalf("date %s: %q, want %q", stored, got, want)
		}
	}
	for _, s := range []string{"", "plain", "a\tb\nc\\d", "\\\\", "é\u2014"} {
		if got, want := h.appendCell(nil, cell{typ: "inlineStr", text: []byte(s)}, s), reports.AppendCellText(nil, s); string(got) != string(want) {
			t.Errorf("string %q: %q, want %q", s, got, want)
		}
	}
}
