package pack

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"golang.org/x/mod/sumdb/tlog"
)

// The leaves: events.bin read leaf by leaf, each leaf checked against its
// NDJSON line and its range's proof, and served as events to the
// workbook's check.

// leafScanner reads events.bin leaf by leaf, with each event's chain hash.
type leafScanner struct {
	p      *Pack
	rc     io.ReadCloser
	br     *bufio.Reader
	ranges []Range
	ri     int
	seq    uint64 // the next leaf's seq
	chain  [32]byte
	buf    []byte
	hbuf   []byte
	e      auditd.Event
	leaf   tlog.Hash
	noLeaf bool // the reader needs events and chain hashes, not leaf hashes
}

func (p *Pack) scanLeaves() (*leafScanner, error) {
	rc, err := p.open(FileLeaves)
	if err != nil {
		return nil, err
	}
	s := &leafScanner{p: p, rc: rc, br: bufio.NewReaderSize(rc, 1<<16), ranges: p.Manifest.Ranges}
	s.start()
	return s, nil
}

func (s *leafScanner) start() {
	if s.ri < len(s.ranges) {
		s.seq = s.ranges[s.ri].First
		hex.Decode(s.chain[:], []byte(s.ranges[s.ri].PrevHash))
	}
}

func (s *leafScanner) Close() error { return s.rc.Close() }

// next reads the next leaf: its event (with the chain hashes), its bytes
// and leaf hash. io.EOF after the last range's last leaf; an error naming
// the leaf otherwise.
func (s *leafScanner) next() error {
	if s.ri == len(s.ranges) {
		if _, err := s.br.ReadByte(); err != io.EOF {
			return fmt.Errorf("%s holds more leaves than %s's ranges", FileLeaves, FileManifest)
		}
		return io.EOF
	}
	b, err := readFrame(s.br, s.buf, ledger.MaxEventSize)
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s ends before event %d (leaf %d): leaves missing", FileLeaves, s.seq, s.seq-1)
	}
	if err != nil {
		return fmt.Errorf("%s: event %d (leaf %d): %v", FileLeaves, s.seq, s.seq-1, err)
	}
	s.buf = b
	if err := ledger.UnmarshalCanonical(b, &s.e); err != nil {
		return fmt.Errorf("%s: leaf %d does not decode: %v", FileLeaves, s.seq-1, err)
	}
	if s.e.Seq != s.seq {
		return fmt.Errorf("%s: leaf %d is event %d, want event %d", FileLeaves, s.seq-1, s.e.Seq, s.seq)
	}
	s.hbuf = append(append(s.hbuf[:0], s.chain[:]...), b...)
	s.e.PrevHash, s.e.Hash = s.chain, sha256.Sum256(s.hbuf)
	s.chain = s.e.Hash
	if !s.noLeaf {
		s.hbuf = append(append(s.hbuf[:0], 0), b...)
		s.leaf = sha256.Sum256(s.hbuf)
	}
	if s.seq++; s.seq > s.ranges[s.ri].Last {
		s.ri++
		s.start()
	}
	return nil
}

// verifyLeaves reads every leaf once: each decodes as the event its place
// says, its NDJSON line renders it (ndjsonCheck), each range rebuilds the
// checkpoint's root with its proof (rangeCheck), and each run's range
// starts and ends with one of its events.
func (p *Pack) verifyLeaves(tree ledger.SignedTree, feed *leafFeed, r *Report) error {
	s, err := p.scanLeaves()
	if err != nil {
		return err
	}
	defer s.Close()
	nd, err := p.open(FileNDJSON)
	if err != nil {
		return err
	}
	defer nd.Close()
	lines := &ndjsonCheck{r: bufio.NewReaderSize(nd, 1<<20)} // a line is at most one event's JSON
	ends := map[uint64][]string{}                            // seq -> runs that must own it
	for _, run := range p.Manifest.Runs {
		ends[run.First] = append(ends[run.First], run.ID)
		ends[run.Last] = append(ends[run.Last], run.ID)
	}
	rc := &rangeCheck{proof: p.Proof, tree: tree, report: r, index: -1}
	for {
		ri, seq := s.ri, s.seq
		err := s.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			r.fail("%v", err)
			rc.bad = true
			break
		}
		if feed != nil && !feed.publish(&s.e) {
			feed = nil // the workbook's check wants no more
		}
		if err := rc.push(ri, s.leaf); err != nil {
			return err
		}
		for _, id := range ends[seq] {
			if s.e.RunID != id {
				r.fail("%s: run %s's range is said to start or end at event %d, which is not the run's", FileManifest, id, seq)
			}
		}
		lines.check(&s.e, s.leaf, seq, r)
	}
	rc.finish()
	if !lines.bad && !rc.bad {
		if _, err := lines.r.ReadByte(); err != io.EOF {
			r.fail("%s has lines after the last leaf", FileNDJSON)
		}
	}
	return nil
}

// rangeCheck rebuilds, range by range, the checkpoint's root from the
// leaves and each range's proof.
type rangeCheck struct {
	proof  Proof
	tree   ledger.SignedTree
	report *Report
	index  int // the range being read; -1 before the first
	cr     *compactRange
	bad    bool // a leaf or a proof failed: no root is checked any more
}

// push adds the leaf of range ri, checking the range before it once ri
// moves on.
func (c *rangeCheck) push(ri int, leaf tlog.Hash) error {
	if ri != c.index {
		c.finish()
		c.index = ri
		rp := c.proof.Ranges[ri]
		left, err := unb64(rp.Left)
		if err == nil {
			c.cr, err = newCompactRange(rp.First-1, left)
		}
		if err != nil {
			c.report.fail("%s: range %d to %d: left side: %v", FileProof, rp.First, rp.Last, err)
			c.bad = true
		}
	}
	if c.bad {
		return nil
	}
	return c.cr.push(0, leaf)
}

// finish checks that the range being read rebuilds the root.
func (c *rangeCheck) finish() {
	if c.bad || c.index < 0 || c.tree.Size == 0 {
		return
	}
	rp := c.proof.Ranges[c.index]
	right, err := unb64(rp.Right)
	if err == nil {
		err = c.cr.appendRight(c.tree.Size, right)
	}
	switch {
	case err != nil:
		c.report.fail("%s: range %d to %d: right side: %v", FileProof, rp.First, rp.Last, err)
	case c.cr.root() != c.tree.Root:
		c.report.fail("%s: events %d to %d do not rebuild the checkpoint's root: a leaf or the proof was altered", FileProof, rp.First, rp.Last)
	}
}

// ndjsonCheck reads events.ndjson beside the leaves: each line must be the
// rendering of its leaf's event. It stops at the first that is not.
type ndjsonCheck struct {
	r    *bufio.Reader
	n    int // lines read
	line []byte
	bad  bool
}

func (c *ndjsonCheck) check(e *auditd.Event, leaf tlog.Hash, seq uint64, r *Report) {
	if c.bad {
		return
	}
	c.n++
	got, err := c.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull { // a line longer than the buffer
		rest, rerr := c.r.ReadBytes('\n')
		got, err = append(bytes.Clone(got), rest...), rerr
	}
	want, _ := appendLeafLine(c.line[:0], e, leaf)
	c.line = want
	if err != nil || !bytes.Equal(got, want) {
		r.fail("%s: line %d is not event %d as its leaf says", FileNDJSON, c.n, seq)
		c.bad = true
	}
}

// packEvents serves the pack's leaves as an auditd.EventReader, for
// reports.EventRows.
type packEvents struct {
	p    *Pack
	feed *leafFeed // the leaves verifyLeaves reads, when there is one
}

func (pe packEvents) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	if pe.feed != nil {
		if ok, err := pe.feed.scan(from, to, fn); ok {
			return err
		}
	}
	s, err := pe.p.scanLeaves()
	if err != nil {
		return err
	}
	s.noLeaf = true
	defer s.Close()
	for {
		err := s.next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if s.e.Seq < from {
			continue
		}
		if to != 0 && s.e.Seq > to {
			return nil
		}
		if err := fn(&s.e); err != nil {
			return err
		}
	}
}

func (pe packEvents) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	return packEvents{p: pe.p}.Scan(after+1, 0, func(e *auditd.Event) error {
		if e.RunID != runID {
			return nil
		}
		return fn(e)
	})
}
