package ledger

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// ErrDamaged means the bbolt file is not the structure bbolt wrote: a page
// is cut off, points outside the file, or does not hold what its parent
// says. bbolt maps the file and trusts it, so a damaged file can crash the
// process that opens it (a page past the end of a truncated file is a
// SIGBUS); CheckFile finds it first.
var ErrDamaged = errors.New("data file damaged")

// The parts of bbolt's file format (go.etcd.io/bbolt, internal/common)
// that CheckFile reads. The file is in the machine's byte order; auditd
// runs on little-endian machines.
const (
	boltMagic        = 0xED0CDAED
	boltVersion      = 2
	pageHeaderSize   = 16 // id u64, flags u16, count u16, overflow u32
	elementSize      = 16 // branch: pos u32, ksize u32, pgid u64; leaf: flags u32, pos u32, ksize u32, vsize u32
	bucketHeaderSize = 16 // root pgid u64, sequence u64
	metaChecksumAt   = 56 // the meta's bytes hashed by its checksum (FNV-1a 64)

	branchPage   = 0x01
	leafPage     = 0x02
	freelistPage = 0x10
	bucketLeaf   = 0x01
	noFreelist   = ^uint64(0)

	// maxTreeDepth bounds the descent from a bucket's root: a B+tree of
	// 4 KiB pages holds more than any disk at a depth far below it.
	maxTreeDepth = 64
)

// CheckFile checks, before anything maps it, that the bbolt file at path
// is the structure bbolt would read without faulting: a valid meta page,
// a file as long as its high-water mark, and a tree of pages, every bucket
// nested in it included, in which each page lies inside that mark, is
// reached once, says it is the page its parent names, has the type bbolt
// expects there, and holds its elements and their keys and values within
// its own bytes; the freelist page too. It reads the file with plain reads
// and returns an error wrapping ErrDamaged naming what is wrong, or
// another error when it cannot read the file.
//
// It is not bbolt's consistency check (tx.Check, which Verify runs): key
// order and pages neither reachable nor free are that check's. It makes
// running that check, and reading the file, safe: what bbolt then follows
// is inside the file.
func CheckFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	c := &fileChecker{f: f, size: fi.Size()}
	return c.check()
}

type fileChecker struct {
	f        *os.File
	size     int64
	pageSize int64
	hwm      uint64  // pages below it are the file's (meta.pgid)
	seen     []uint8 // a bit per page reached
	buf      []byte
}

func damaged(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrDamaged, fmt.Sprintf(format, args...))
}

// meta is what CheckFile reads of a meta page.
type meta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// readMeta reads the meta page at off; ok is false when it does not
// validate (magic, version, checksum), as bbolt would refuse it.
func (c *fileChecker) readMeta(off int64) (meta, bool) {
	var b [pageHeaderSize + 64]byte
	if n, _ := c.f.ReadAt(b[:], off); n < len(b) {
		return meta{}, false
	}
	m := b[pageHeaderSize:]
	h := fnv.New64a()
	h.Write(m[:metaChecksumAt])
	le := binary.LittleEndian
	if le.Uint32(m[0:]) != boltMagic || le.Uint32(m[4:]) != boltVersion || le.Uint64(m[56:]) != h.Sum64() {
		return meta{}, false
	}
	return meta{pageSize: le.Uint32(m[8:]), root: le.Uint64(m[16:]), freelist: le.Uint64(m[32:]),
		pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}, true
}

func (c *fileChecker) check() error {
	// bbolt takes the page size from the first meta page, or, when that
	// one does not validate, from the second, wherever a page size puts
	// it; then it uses the valid meta with the higher transaction id.
	m0, ok0 := c.readMeta(0)
	if ok0 {
		c.pageSize = int64(m0.pageSize)
	} else {
		for i := range 15 {
			pos := int64(1024) << i
			if pos >= c.size-1024 {
				break
			}
			if m, ok := c.readMeta(pos); ok {
				c.pageSize = int64(m.pageSize)
				break
			}
		}
	}
	if c.pageSize < 1024 || c.pageSize > 1<<24 || c.pageSize&(c.pageSize-1) != 0 {
		return damaged("no valid meta page: not a bbolt file, or both of its meta pages are damaged")
	}
	if c.size < 2*c.pageSize {
		return damaged("the file is %d bytes, shorter than its two meta pages of %d: truncated", c.size, c.pageSize)
	}
	m0, ok0 = c.readMeta(0)
	m1, ok1 := c.readMeta(c.pageSize)
	var m meta
	switch {
	case ok0 && (!ok1 || m0.txid >= m1.txid):
		m = m0
	case ok1:
		m = m1
	default:
		return damaged("both meta pages are damaged")
	}
	if int64(m.pageSize) != c.pageSize {
		return damaged("the meta pages disagree on the page size (%d, %d)", c.pageSize, m.pageSize)
	}
	if m.pgid < 2 || m.pgid > uint64(c.size/c.pageSize) {
		return damaged("the file is %d bytes but its meta page says it holds %d pages of %d bytes: truncated below its high-water mark", c.size, m.pgid, c.pageSize)
	}
	c.hwm = m.pgid
	c.seen = make([]uint8, (m.pgid+7)/8)
	c.mark(0, 0)
	c.mark(1, 0)
	if m.freelist != noFreelist {
		if err := c.checkFreelist(m.freelist); err != nil {
			return err
		}
	}
	if err := c.checkPage(m.root, 0, "the root bucket"); err != nil {
		return err
	}
	return nil
}

// mark notes that pages id to id+overflow are reached, and reports
// whether one of them was before.
func (c *fileChecker) mark(id uint64, overflow uint32) (again bool) {
	for p := id; p <= id+uint64(overflow); p++ {
		if c.seen[p/8]&(1<<(p%8)) != 0 {
			again = true
		}
		c.seen[p/8] |= 1 << (p % 8)
	}
	return again
}

// readPage reads page id, its overflow pages too, checking that it lies
// inside the file and is the page it says it is. The bytes are valid
// until the next call.
func (c *fileChecker) readPage(id uint64, what string) ([]byte, error) {
	if id < 2 || id >= c.hwm {
		return nil, damaged("%s points at page %d, outside pages 2 to %d", what, id, c.hwm-1)
	}
	// One read of the page, then of its overflow pages if it has any.
	off := int64(id) * c.pageSize
	if int64(cap(c.buf)) < c.pageSize {
		c.buf = make([]byte, c.pageSize)
	}
	c.buf = c.buf[:c.pageSize]
	if got, err := c.f.ReadAt(c.buf, off); got < pageHeaderSize {
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("read page %d: %w", id, err)
	} else if err != nil && err != io.EOF {
		return nil, fmt.Errorf("read page %d: %w", id, err)
	}
	le := binary.LittleEndian
	if got := le.Uint64(c.buf[0:]); got != id {
		return nil, damaged("page %d (%s) says it is page %d", id, what, got)
	}
	overflow := le.Uint32(c.buf[12:])
	if uint64(overflow) >= c.hwm-id {
		return nil, damaged("page %d (%s) runs %d pages past the high-water mark", id, what, uint64(overflow)-(c.hwm-id)+1)
	}
	if c.mark(id, overflow) {
		return nil, damaged("page %d (%s) is reached twice: the tree loops or two parents share it", id, what)
	}
	if overflow > 0 {
		n := (int64(overflow) + 1) * c.pageSize
		if int64(cap(c.buf)) < n {
			c.buf = append(make([]byte, 0, n), c.buf...)
		}
		c.buf = c.buf[:n]
		if _, err := c.f.ReadAt(c.buf[c.pageSize:], off+c.pageSize); err != nil && err != io.EOF {
			return nil, fmt.Errorf("read page %d: %w", id, err)
		}
	}
	return c.buf, nil
}

func (c *fileChecker) checkFreelist(id uint64) error {
	p, err := c.readPage(id, "the freelist")
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	if le.Uint16(p[8:]) != freelistPage {
		return damaged("page %d is the freelist but has flags %#x", id, le.Uint16(p[8:]))
	}
	first, count := uint64(0), uint64(le.Uint16(p[10:]))
	if count == 0xFFFF {
		if len(p) < pageHeaderSize+8 {
			return damaged("freelist page %d is cut short", id)
		}
		first, count = 1, le.Uint64(p[pageHeaderSize:])
	}
	if room := uint64(len(p)-pageHeaderSize) / 8; count > room || first+count > room {
		return damaged("freelist page %d lists %d pages, more than it holds", id, count)
	}
	return nil
}

// checkPage checks the tree below page id, the root of a bucket or a node
// under one, depth levels down.
func (c *fileChecker) checkPage(id uint64, depth int, what string) error {
	if depth > maxTreeDepth {
		return damaged("%s: the tree is deeper than %d pages", what, maxTreeDepth)
	}
	p, err := c.readPage(id, what)
	if err != nil {
		return err
	}
	le := binary.LittleEndian
	switch flags := le.Uint16(p[8:]); flags {
	case branchPage:
		// Collect the children before descending: readPage reuses p.
		kids, err := branchChildren(p, id)
		if err != nil {
			return err
		}
		for _, kid := range kids {
			if err := c.checkPage(kid, depth+1, fmt.Sprintf("branch page %d", id)); err != nil {
				return err
			}
		}
		return nil
	case leafPage:
		buckets, err := leafBuckets(p, fmt.Sprintf("leaf page %d", id))
		if err != nil {
			return err
		}
		return c.checkBuckets(buckets, depth)
	default:
		return damaged("page %d (%s) has flags %#x, not a branch or leaf page", id, what, flags)
	}
}

// branchChildren returns the pages a branch page points at, checking
// that its elements and keys lie inside it.
func branchChildren(p []byte, id uint64) ([]uint64, error) {
	le := binary.LittleEndian
	count := int(le.Uint16(p[10:]))
	if count == 0 || pageHeaderSize+count*elementSize > len(p) {
		return nil, damaged("branch page %d holds %d elements, which do not fit it", id, count)
	}
	kids := make([]uint64, count)
	for i := range count {
		at := pageHeaderSize + i*elementSize
		e := p[at : at+elementSize]
		if _, err := span(p, at, le.Uint32(e[0:]), le.Uint32(e[4:]), 0); err != nil {
			return nil, damaged("branch page %d, element %d: %v", id, i, err)
		}
		kids[i] = le.Uint64(e[8:])
	}
	return kids, nil
}

// nested is a bucket found in a leaf: its root page, or its inline page.
type nested struct {
	root   uint64
	inline []byte
	what   string
}

// leafBuckets checks a leaf page's elements (p is the page, or an inline
// bucket's page) and returns the buckets nested in it.
func leafBuckets(p []byte, what string) ([]nested, error) {
	le := binary.LittleEndian
	if len(p) < pageHeaderSize {
		return nil, damaged("%s is cut short", what)
	}
	count := int(le.Uint16(p[10:]))
	if pageHeaderSize+count*elementSize > len(p) {
		return nil, damaged("%s holds %d elements, which do not fit it", what, count)
	}
	var out []nested
	for i := range count {
		at := pageHeaderSize + i*elementSize
		e := p[at : at+elementSize]
		v, err := span(p, at, le.Uint32(e[4:]), le.Uint32(e[8:]), le.Uint32(e[12:]))
		if err != nil {
			return nil, damaged("%s, element %d: %v", what, i, err)
		}
		if le.Uint32(e[0:])&bucketLeaf == 0 {
			continue
		}
		if len(v) < bucketHeaderSize {
			return nil, damaged("%s, element %d: a bucket of %d bytes", what, i, len(v))
		}
		b := nested{root: le.Uint64(v), what: fmt.Sprintf("a bucket in %s", what)}
		if b.root == 0 {
			b.inline = v[bucketHeaderSize:]
		}
		out = append(out, b)
	}
	return out, nil
}

// checkBuckets checks the buckets a leaf holds. Inline pages are copied
// out first: the leaf's bytes are reused by the next read.
func (c *fileChecker) checkBuckets(buckets []nested, depth int) error {
	for i := range buckets {
		if buckets[i].inline != nil {
			buckets[i].inline = append([]byte(nil), buckets[i].inline...)
		}
	}
	for _, b := range buckets {
		if b.inline == nil {
			if err := c.checkPage(b.root, depth+1, b.what); err != nil {
				return err
			}
			continue
		}
		if depth > maxTreeDepth {
			return damaged("%s: buckets nested deeper than %d", b.what, maxTreeDepth)
		}
		if len(b.inline) < pageHeaderSize || binary.LittleEndian.Uint16(b.inline[8:]) != leafPage {
			return damaged("%s: its inline page is not a leaf page", b.what)
		}
		inner, err := leafBuckets(b.inline, "the inline page of "+b.what)
		if err != nil {
			return err
		}
		if err := c.checkBuckets(inner, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// span checks that the key of ksize bytes, and the value of vsize bytes
// after it, that the element at offset at places pos bytes after itself,
// lie inside p, and returns the value.
func span(p []byte, at int, pos, ksize, vsize uint32) ([]byte, error) {
	start := uint64(at) + uint64(pos)
	end := start + uint64(ksize) + uint64(vsize)
	if end > uint64(len(p)) {
		return nil, fmt.Errorf("its key and value (%d and %d bytes at offset %d) run past the page's %d bytes", ksize, vsize, start, len(p))
	}
	return p[start+uint64(ksize) : end], nil
}
