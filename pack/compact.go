package pack

import (
	"fmt"
	"math/bits"

	"golang.org/x/mod/sumdb/tlog"
)

// compactRange is the right edge of an RFC 6962 tree being rebuilt from
// the left: the roots of its perfect subtrees, largest first. A range
// proof's left side starts it, the range's leaves and the proof's right
// side are pushed onto it, and its root is then the tree's.
type compactRange struct {
	end    uint64 // leaves covered: [0, end)
	levels []int
	hashes []tlog.Hash
}

// newCompactRange starts a range of [0, end) from the roots of its perfect
// subtrees, largest first (one per bit of end).
func newCompactRange(end uint64, hashes []tlog.Hash) (*compactRange, error) {
	if bits.OnesCount64(end) != len(hashes) {
		return nil, fmt.Errorf("%d hashes for the %d leaves before the range, want %d", len(hashes), end, bits.OnesCount64(end))
	}
	c := &compactRange{end: end}
	i := 0
	for level := 63; level >= 0; level-- {
		if end&(1<<level) != 0 {
			c.levels = append(c.levels, level)
			c.hashes = append(c.hashes, hashes[i])
			i++
		}
	}
	return c, nil
}

// push appends the root of a perfect subtree of 2^level leaves starting
// at c.end, which it must be aligned to.
func (c *compactRange) push(level int, h tlog.Hash) error {
	if level > 62 || c.end&(1<<level-1) != 0 {
		return fmt.Errorf("a subtree of level %d cannot start at leaf %d", level, c.end)
	}
	for n := len(c.levels); n > 0 && c.levels[n-1] == level; n-- {
		h = tlog.NodeHash(c.hashes[n-1], h)
		level++
		c.levels, c.hashes = c.levels[:n-1], c.hashes[:n-1]
	}
	if n := len(c.levels); n > 0 && c.levels[n-1] < level {
		return fmt.Errorf("a subtree of level %d cannot follow one of level %d", level, c.levels[n-1])
	}
	c.levels = append(c.levels, level)
	c.hashes = append(c.hashes, h)
	c.end = c.size()
	return nil
}

// size recomputes end from the subtrees.
func (c *compactRange) size() uint64 {
	var n uint64
	for _, l := range c.levels {
		n += 1 << l
	}
	return n
}

// appendRight pushes the roots of the perfect subtrees covering
// [c.end, size), left to right, each as large as its start allows.
func (c *compactRange) appendRight(size uint64, hashes []tlog.Hash) error {
	i := 0
	for c.end < size {
		level := 62
		if c.end > 0 {
			level = bits.TrailingZeros64(c.end)
		}
		for level > 0 && c.end+1<<level > size {
			level--
		}
		if i == len(hashes) {
			return fmt.Errorf("too few hashes for the leaves after the range")
		}
		if err := c.push(level, hashes[i]); err != nil {
			return err
		}
		i++
	}
	if i != len(hashes) {
		return fmt.Errorf("%d hashes for the leaves after the range, want %d", len(hashes), i)
	}
	return nil
}

// root returns the tree hash of the leaves covered.
func (c *compactRange) root() tlog.Hash {
	if len(c.hashes) == 0 {
		return tlog.Hash(sha256Empty)
	}
	h := c.hashes[len(c.hashes)-1]
	for i := len(c.hashes) - 2; i >= 0; i-- {
		h = tlog.NodeHash(c.hashes[i], h)
	}
	return h
}

// sha256Empty is SHA-256 of the empty string, RFC 6962's empty tree.
var sha256Empty = [32]byte{0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14, 0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
	0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c, 0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55}
