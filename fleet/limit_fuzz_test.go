package fleet

import (
	"fmt"
	"testing"

	"go.etcd.io/etcd/api/v3/mvccpb"
)

// FuzzLimitOf feeds learn/<key>/limit values, written by other nodes, to
// the parser: it never panics, and a value it accepts has a positive rate
// and writes back (as swapLimit formats it) to itself.
func FuzzLimitOf(f *testing.F) {
	for _, seed := range []string{
		"75 10000000000 100 1000000000 1733356800000000000 node1",
		"75 10000000000 100 1000000000 1733356800000000000 window_spent node1",
		"10 1000000000 0 0 0 raise node 2",
		"10 1000000000 0 0 0 node2",
		"10 1000000000 node2",
		"-1 1000000000 0 0 0 n",
		"1 1 1 1 1 a b c",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		l, err := limitOf("geo", []*mvccpb.KeyValue{{Value: []byte(v), ModRevision: 7}})
		if err != nil {
			return
		}
		if l.Rate.Limit <= 0 || l.Rate.Window <= 0 || l.Revision != 7 {
			t.Fatalf("%q parsed to %+v", v, l)
		}
		if l.Cause != "" && !knownCause(l.Cause) {
			t.Fatalf("%q parsed to the cause %q", v, l.Cause)
		}
		again := limitValue(l, l.By)
		l2, err := limitOf("geo", []*mvccpb.KeyValue{{Value: []byte(again), ModRevision: 7}})
		if err != nil || l2.Rate != l.Rate || l2.Refused != l.Refused || !l2.RefusedAt.Equal(l.RefusedAt) || l2.By != l.By || l2.Cause != l.Cause {
			t.Fatalf("%q parsed to %+v, written as %q, read back as %+v (%v)", v, l, again, l2, err)
		}
	})
}

// FuzzDecodeTat feeds budget/<key>/tat values, written by other nodes, to
// the parser: it never panics, and a state it accepts writes back
// (encodeTat) to the same state.
func FuzzDecodeTat(f *testing.F) {
	for _, seed := range []string{
		"1733356800000000000",
		"1733356800000000000 1733356801000000000:20:node1 1733356802000000000:5:node%202",
		"1 2:3",
		"x",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		st, err := decodeTat([]*mvccpb.KeyValue{{Key: []byte("k"), Value: []byte(v), ModRevision: 3}})
		if err != nil {
			return
		}
		again, err := decodeTat([]*mvccpb.KeyValue{{Key: []byte("k"), Value: []byte(encodeTat(st)), ModRevision: 3}})
		if err != nil || again.tat != st.tat || fmt.Sprint(again.sharers) != fmt.Sprint(st.sharers) {
			t.Fatalf("%q decoded to %+v, written as %q, read back as %+v (%v)", v, st, encodeTat(st), again, err)
		}
	})
}

// FuzzParseSpent feeds learn/<key>/spent values, written by other nodes,
// to the parser: it never panics, a mark it accepts has no negative count
// or window, and it writes back (String) to itself.
func FuzzParseSpent(f *testing.F) {
	for _, seed := range []string{
		"1733356800000000000 120 5000000000",
		"1733356800000000000 0 0",
		"1 -2 3",
		"1 2",
		"1 2 3 4",
		"x y z",
		"",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, v string) {
		m, err := parseSpent(v)
		if err != nil {
			return
		}
		if m.Answered < 0 || m.Window < 0 {
			t.Fatalf("%q parsed to %+v", v, m)
		}
		if again, err := parseSpent(m.String()); err != nil || again != m {
			t.Fatalf("%q parsed to %+v, written as %q, read back as %+v (%v)", v, m, m.String(), again, err)
		}
	})
}
