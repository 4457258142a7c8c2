package reports

import "hash/maphash"

// The recount keeps a record of every item of the run until the end (R1,
// R6 and R10 look at each item once more then), so its size is the
// recount's at a million items. A record is 24 bytes in a chunk of
// records, its key bytes in a chunk of keys, and an open-addressing table
// of indexes finds it by key: no pointer, string or map entry per item
// (BenchmarkRecountHeap: 54 MB at 1,000,000 items, 217 MB with a map of
// keys to records).

// item is what the recount remembers of one item of the run.
type item struct {
	// seq is that of the item's payload.staged until the item finished,
	// then that of its item.finished.
	seq     uint64
	keyEnd  uint32 // where the item's key ends in its chunk of keys
	maxPage uint32 // highest page dispatched since it was queued
	src     uint32 // its scope, an index in recount.scopes
	flags   itemFlags
}

type itemFlags uint8

const (
	// queued: an item.queued named it. An item only dispatched is a key
	// for its requests' state (R2, R3), no item of the run.
	itemQueued itemFlags = 1 << iota
	itemFinished
	itemSucceeded
	itemDelivered // succeeded or served from cache
	itemStaged
	itemRestage // staged before a restart and not finished: may be staged again
	itemAcked
)

func (it *item) has(f itemFlags) bool { return it.flags&f != 0 }

// chunkBits sets how many items a chunk holds: growing the run copies no
// more than a chunk's keys at a time.
const chunkBits = 12

// itemTable holds the run's items in the order their keys were first
// named, each found by its index or its key.
type itemTable struct {
	seed  maphash.Seed
	recs  [][]item // chunk c holds items c<<chunkBits onwards
	keys  [][]byte // their keys end to end, keys[c] beside recs[c]
	slots []uint32 // linear probing; an item's index + 1, 0 when free
	n     uint32
}

func newItemTable() *itemTable {
	return &itemTable{seed: maphash.MakeSeed()}
}

// at returns item i's record; it stays where it is as the table grows.
func (t *itemTable) at(i uint32) *item {
	return &t.recs[i>>chunkBits][i&(1<<chunkBits-1)]
}

// key returns item i's key, in the table's memory.
func (t *itemTable) key(i uint32) []byte {
	c, j := i>>chunkBits, i&(1<<chunkBits-1)
	start := uint32(0)
	if j > 0 {
		start = t.recs[c][j-1].keyEnd
	}
	return t.keys[c][start:t.recs[c][j].keyEnd]
}

// find returns the index of the item of key.
func (t *itemTable) find(key string) (uint32, bool) {
	if t.n == 0 {
		return 0, false
	}
	mask := uint64(len(t.slots) - 1)
	for h := maphash.String(t.seed, key) & mask; ; h = (h + 1) & mask {
		s := t.slots[h]
		if s == 0 {
			return 0, false
		}
		if string(t.key(s-1)) == key {
			return s - 1, true
		}
	}
}

// add adds an item of key, which the table does not hold, and returns its
// index.
func (t *itemTable) add(key string) uint32 {
	i := t.n
	c := i >> chunkBits
	if i&(1<<chunkBits-1) == 0 {
		t.recs = append(t.recs, make([]item, 0, 1<<chunkBits))
		t.keys = append(t.keys, make([]byte, 0, min(len(key), 64)<<chunkBits))
	}
	t.keys[c] = append(t.keys[c], key...)
	t.recs[c] = append(t.recs[c], item{keyEnd: uint32(len(t.keys[c]))})
	t.n++
	if 4*t.n > 3*uint32(len(t.slots)) {
		t.rehash(max(2*len(t.slots), 1<<chunkBits))
	} else {
		t.slot(i)
	}
	return i
}

// slot puts item i in the first free slot from its key's hash.
func (t *itemTable) slot(i uint32) {
	mask := uint64(len(t.slots) - 1)
	h := maphash.Bytes(t.seed, t.key(i)) & mask
	for t.slots[h] != 0 {
		h = (h + 1) & mask
	}
	t.slots[h] = i + 1
}

// rehash spreads every item over n slots (a power of 2).
func (t *itemTable) rehash(n int) {
	t.slots = make([]uint32, n)
	for i := range t.n {
		t.slot(i)
	}
}
