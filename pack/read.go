package pack

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/auditd/auditd"
)

// Pack is an opened evidence pack: its small entries read and checked for
// form, the large ones (leaves, NDJSON, workbook) left to stream.
type Pack struct {
	ra    io.ReaderAt
	files map[string]*zip.File

	Manifest    Manifest
	Checkpoint  []byte // checkpoint.txt, verbatim
	PublicKey   string // public-key.txt, trimmed
	Proof       Proof
	Previous    []byte       // previous-checkpoint.txt; nil when the pack has none
	Consistency *Consistency // consistency.json; nil when the pack has none

	retention []auditd.Event // the retention events, read by Verify from the leaves
	access    []auditd.Event // the access events after the runs' ranges, likewise
}

// OpenFile opens the pack in the file at path; close it when done.
func OpenFile(path string) (*Pack, io.Closer, error) {
	return openFile(path, Open)
}

// openFile opens the file at path and reads it with open; the file stays
// open for the result, until the caller closes it.
func openFile[T any](path string, open func(io.ReaderAt, int64) (T, error)) (T, io.Closer, error) {
	var zero T
	f, err := os.Open(path)
	if err != nil {
		return zero, nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return zero, nil, err
	}
	p, err := open(f, fi.Size())
	if err != nil {
		f.Close()
		return zero, nil, err
	}
	return p, f, nil
}

// readEntries indexes the entries of the ZIP in ra by name, refusing a
// name that appears twice.
func readEntries(ra io.ReaderAt, size int64) (*Pack, error) {
	zr, err := zip.NewReader(ra, size)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPack, err)
	}
	p := &Pack{ra: ra, files: map[string]*zip.File{}}
	for _, f := range zr.File {
		if _, dup := p.files[f.Name]; dup {
			return nil, fmt.Errorf("%w: entry %s appears twice", ErrBadPack, f.Name)
		}
		p.files[f.Name] = f
	}
	return p, nil
}

// Open reads the pack in ra (size bytes long). It fails with ErrBadPack,
// saying which entry, when the pack is not well formed; it checks no
// signature or proof (Verify does).
func Open(ra io.ReaderAt, size int64) (*Pack, error) {
	p, err := readEntries(ra, size)
	if err != nil {
		return nil, err
	}
	for _, name := range []string{FileManifest, FileCheckpoint, FilePublicKey, FileProof, FileLeaves, FileNDJSON, FileWorkbook} {
		if p.files[name] == nil {
			return nil, fmt.Errorf("%w: no %s", ErrBadPack, name)
		}
	}
	if err := p.readJSON(FileManifest, &p.Manifest); err != nil {
		return nil, err
	}
	if p.Checkpoint, err = p.small(FileCheckpoint); err != nil {
		return nil, err
	}
	key, err := p.small(FilePublicKey)
	if err != nil {
		return nil, err
	}
	p.PublicKey = strings.TrimSpace(string(key))
	if err := p.readJSON(FileProof, &p.Proof); err != nil {
		return nil, err
	}
	if p.files[FilePreviousCheckpoint] != nil || p.files[FileConsistency] != nil {
		if p.Previous, err = p.small(FilePreviousCheckpoint); err != nil {
			return nil, err
		}
		p.Consistency = new(Consistency)
		if err := p.readJSON(FileConsistency, p.Consistency); err != nil {
			return nil, err
		}
	}
	if err := p.checkForm(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadPack, err)
	}
	return p, nil
}

// checkForm checks that the manifest and the proof describe one set of
// ranges that a tree of the stated size can hold.
func (p *Pack) checkForm() error {
	m := &p.Manifest
	if m.Format != Format {
		return fmt.Errorf("%s: format %q, want %q", FileManifest, m.Format, Format)
	}
	if len(m.Ranges) == 0 || len(m.Ranges) > maxRanges || len(m.Runs) == 0 || len(m.Runs) > maxRuns {
		return fmt.Errorf("%s: %d ranges and %d runs", FileManifest, len(m.Ranges), len(m.Runs))
	}
	var total, prev uint64
	for i, r := range m.Ranges {
		if r.First == 0 || r.First > r.Last || r.Last > m.TreeSize || (i > 0 && r.First <= prev+1) {
			return fmt.Errorf("%s: range %d (%d to %d) is not an ordered range of a tree of %d", FileManifest, i, r.First, r.Last, m.TreeSize)
		}
		if len(r.PrevHash) != 64 {
			return fmt.Errorf("%s: range %d has no prev_hash", FileManifest, i)
		}
		total += r.Last - r.First + 1
		prev = r.Last
	}
	if total != m.Leaves {
		return fmt.Errorf("%s: the ranges hold %d leaves, leaves says %d", FileManifest, total, m.Leaves)
	}
	for _, r := range m.Runs {
		if r.ID == "" || !p.covers(r.First, r.Last) {
			return fmt.Errorf("%s: run %q (%d to %d) lies outside the ranges", FileManifest, r.ID, r.First, r.Last)
		}
	}
	for _, single := range []struct {
		what string
		seqs []uint64
	}{{"retention", m.Retention}, {"access", m.Access}} {
		if len(single.seqs) > maxRuns {
			return fmt.Errorf("%s: %d %s events", FileManifest, len(single.seqs), single.what)
		}
		for _, seq := range single.seqs {
			if !p.covers(seq, seq) {
				return fmt.Errorf("%s: %s event %d lies outside the ranges", FileManifest, single.what, seq)
			}
		}
	}
	if p.Proof.TreeSize != m.TreeSize || len(p.Proof.Ranges) != len(m.Ranges) {
		return fmt.Errorf("%s does not prove %s's ranges", FileProof, FileManifest)
	}
	for i, rp := range p.Proof.Ranges {
		if rp.First != m.Ranges[i].First || rp.Last != m.Ranges[i].Last || len(rp.Left) > 64 || len(rp.Right) > 128 {
			return fmt.Errorf("%s: range %d is not %s's", FileProof, i, FileManifest)
		}
	}
	if c := p.Consistency; c != nil && len(c.Hashes) > 128 {
		return fmt.Errorf("%s: %d hashes", FileConsistency, len(c.Hashes))
	}
	return nil
}

func (p *Pack) covers(first, last uint64) bool {
	for _, r := range p.Manifest.Ranges {
		if first >= r.First && last <= r.Last {
			return true
		}
	}
	return false
}

func (p *Pack) small(name string) ([]byte, error) {
	f := p.files[name]
	if f == nil {
		return nil, fmt.Errorf("%w: no %s", ErrBadPack, name)
	}
	if f.UncompressedSize64 > maxSmallEntry {
		return nil, fmt.Errorf("%w: %s is %d bytes", ErrBadPack, name, f.UncompressedSize64)
	}
	rc, err := f.Open()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadPack, name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, maxSmallEntry+1))
	if err != nil || len(b) > maxSmallEntry {
		return nil, fmt.Errorf("%w: %s: unreadable or too large", ErrBadPack, name)
	}
	return b, nil
}

func (p *Pack) readJSON(name string, v any) error {
	b, err := p.small(name)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrBadPack, name, err)
	}
	return nil
}

// open streams a large entry.
func (p *Pack) open(name string) (io.ReadCloser, error) {
	f := p.files[name]
	if f == nil {
		return nil, fmt.Errorf("%w: no %s", ErrBadPack, name)
	}
	return f.Open()
}

// workbook opens the stored workbook in place.
func (p *Pack) workbook() (*zip.Reader, error) {
	f := p.files[FileWorkbook]
	if f.Method != zip.Store {
		return nil, fmt.Errorf("%w: %s is compressed; a pack stores it", ErrBadPack, FileWorkbook)
	}
	off, err := f.DataOffset()
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadPack, FileWorkbook, err)
	}
	zr, err := zip.NewReader(io.NewSectionReader(p.ra, off, int64(f.CompressedSize64)), int64(f.CompressedSize64))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadPack, FileWorkbook, err)
	}
	return zr, nil
}
