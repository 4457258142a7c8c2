package reports

import (
	"fmt"
	"strings"
	"testing"
)

// The item table finds every key it was given, by index and by key, across
// chunks and as its slots grow, and no key it was not given.
func TestItemTable(t *testing.T) {
	key := func(i int) string {
		switch i % 4 {
		case 0:
			return fmt.Sprint(i)
		case 1:
			return "item-" + strings.Repeat("x", i%300) + fmt.Sprint(i) // up to 300 bytes
		case 2:
			return fmt.Sprintf("%07d", i)
		}
		return fmt.Sprintf("https://example.org/q?id=%d&f=json", i)
	}
	tab := newItemTable()
	if _, ok := tab.find(""); ok {
		t.Fatal("an empty table finds a key")
	}
	const n = 3<<chunkBits + 17 // four chunks, the last partly filled
	for i := range n {
		if got := tab.add(key(i)); got != uint32(i) {
			t.Fatalf("key %d added as %d", i, got)
		}
		tab.at(uint32(i)).seq = uint64(i) // records stay put as the table grows
	}
	if _, ok := tab.find(""); ok {
		t.Error("finds the empty key, never added")
	}
	tab.add("")
	for i := range n {
		got, ok := tab.find(key(i))
		if !ok || got != uint32(i) {
			t.Fatalf("key %d found as %d, %v", i, got, ok)
		}
		if k := string(tab.key(uint32(i))); k != key(i) {
			t.Fatalf("key %d reads %q, want %q", i, k, key(i))
		}
		if s := tab.at(uint32(i)).seq; s != uint64(i) {
			t.Fatalf("record %d holds seq %d", i, s)
		}
		if _, ok := tab.find(key(i) + "#"); ok {
			t.Fatalf("finds %q, never added", key(i)+"#")
		}
	}
	if got, ok := tab.find(""); !ok || got != n {
		t.Errorf("the empty key found as %d, %v; want %d", got, ok, n)
	}
}
