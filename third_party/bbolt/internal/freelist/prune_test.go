package freelist

// auditd's fork: tests of pruneAllocs (third_party/bbolt/PATCHES.md).

import (
	"math"
	"math/rand"
	"reflect"
	"testing"

	"go.etcd.io/bbolt/internal/common"
)

// sim drives a freelist as bbolt's transactions do: each read-write
// transaction releases pending pages as it begins, allocates pages (from
// the freelist, else from the end of the file), and frees live pages it
// rewrote; read transactions open at the last committed txid and close
// later.
type sim struct {
	f       Interface
	txid    common.Txid
	hwm     common.Pgid // the next page past the end of the file
	live    []common.Pgid
	readers []common.Txid
}

func newSim(f Interface) *sim {
	f.Init(nil)
	return &sim{f: f, txid: 1, hwm: 2}
}

// step runs one read-write transaction allocating alloc pages and freeing
// free of the live ones, after opening or closing a reader as r says.
func (s *sim) step(r *rand.Rand, alloc, free int, readers bool) {
	if readers {
		switch {
		case r.Intn(4) == 0:
			s.f.AddReadonlyTXID(s.txid)
			s.readers = append(s.readers, s.txid)
		case len(s.readers) > 0 && r.Intn(3) == 0:
			i := r.Intn(len(s.readers))
			s.f.RemoveReadonlyTXID(s.readers[i])
			s.readers = append(s.readers[:i], s.readers[i+1:]...)
		}
	}
	s.txid++
	s.f.ReleasePendingPages()
	for range free {
		if len(s.live) == 0 {
			break
		}
		i := r.Intn(len(s.live))
		s.f.Free(s.txid, common.NewPage(s.live[i], common.LeafPageFlag, 0, 0))
		s.live[i] = s.live[len(s.live)-1]
		s.live = s.live[:len(s.live)-1]
	}
	for range alloc {
		id := s.f.Allocate(s.txid, 1)
		if id == 0 {
			id = s.hwm
			s.hwm++
		}
		s.live = append(s.live, id)
	}
}

// TestPruneAllocsReleasesTheSame runs the same random transactions, with
// readers opening and closing, on a freelist that prunes allocs and one
// that never does: after every release both hold the same free pages and
// the same pending ones. (The array freelist: the hashmap's allocation
// order follows Go's map iteration, so two of them diverge on their own.)
func TestPruneAllocsReleasesTheSame(t *testing.T) {
	for seed := int64(1); seed <= 6; seed++ {
		r := rand.New(rand.NewSource(seed))
		pruned, whole := newSim(NewArrayFreelist()), newSim(NewArrayFreelist())
		pruned.f.(*array).pruneFloor = 16
		whole.f.(*array).pruneFloor = math.MaxInt
		prunes := 0
		for i := range 1500 {
			alloc, free := 1+r.Intn(6), r.Intn(6)
			state := r.Int63()
			pruned.step(rand.New(rand.NewSource(state)), alloc, free, true)
			whole.step(rand.New(rand.NewSource(state)), alloc, free, true)
			a, b := pruned.f.(*array), whole.f.(*array)
			if a.allocsKept != 0 || len(a.allocs) < len(b.allocs) {
				prunes++
			}
			if !reflect.DeepEqual(a.freePageIds(), b.freePageIds()) {
				t.Fatalf("seed %d, tx %d: free pages %v pruned, %v whole", seed, i, a.freePageIds(), b.freePageIds())
			}
			if !reflect.DeepEqual(allPendingPages(a.pendingPageIds()), allPendingPages(b.pendingPageIds())) {
				t.Fatalf("seed %d, tx %d: pending pages differ", seed, i)
			}
		}
		if prunes == 0 {
			t.Fatalf("seed %d: allocs was never pruned", seed)
		}
	}
}

// TestPruneAllocsBounded: pages reused from the freelist and kept, as a
// log's pages are, with no reader open: allocs stays under twice its
// floor, where unpruned it holds an entry for every such page.
func TestPruneAllocsBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		new  func() Interface
		get  func(Interface) *shared
	}{
		{"array", NewArrayFreelist, func(f Interface) *shared { return f.(*array).shared }},
		{"hashmap", NewHashMapFreelist, func(f Interface) *shared { return f.(*hashMap).shared }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewSource(1))
			pruned, whole := newSim(tc.new()), newSim(tc.new())
			tc.get(whole.f).pruneFloor = math.MaxInt
			most := 0
			for range 20000 {
				state := r.Int63()
				// Three pages written, two rewritten: the file grows by a
				// page a transaction, from pages the freelist hands out.
				pruned.step(rand.New(rand.NewSource(state)), 3, 2, false)
				whole.step(rand.New(rand.NewSource(state)), 3, 2, false)
				most = max(most, len(tc.get(pruned.f).allocs))
			}
			if most >= 2*allocsFloor {
				t.Fatalf("allocs held %d entries, want fewer than %d", most, 2*allocsFloor)
			}
			if n := len(tc.get(whole.f).allocs); n < 10000 {
				t.Fatalf("unpruned allocs holds %d entries: the test reuses too few pages to show the growth", n)
			}
			t.Logf("allocs: at most %d pruned, %d unpruned", most, len(tc.get(whole.f).allocs))
		})
	}
}
