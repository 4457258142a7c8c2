package reports

import (
	"archive/zip"
	"bytes"
	"compress/flate"
	"errors"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"runtime"
	"sort"
	"sync"
)

// zipEpochDate is the MS-DOS date of every entry, 1980-01-01, the earliest
// a ZIP can say, so that no clock leaks into the file (time is midnight).
const zipEpochDate = 1<<5 | 1

// flateLevel matches archive/zip's default, so the evidence workbook is
// compressed as hard as a workbook excelize writes itself.
const flateLevel = 5

// chunkSize is the unit of parallel compression. Chunks are cut at fixed
// offsets of an entry, so the output does not depend on how writes arrive.
const chunkSize = 1 << 20

// sortedZip is an excelize.ZipWriter that makes the container deterministic
// and compresses on every core.
//
// excelize writes streamed sheets in map order; sortedZip compresses each
// entry as it comes into a temporary file and, on Close, writes the archive
// with its entries ordered by name, copying compressed bytes only.
//
// An entry is deflated in fixed-size chunks side by side, each ended by a
// sync flush (the last by the final block), which concatenate into one
// valid deflate stream, as pigz does. Compressing is most of an export's
// time once the rows are written, and excelize does it on one core.
type sortedZip struct {
	dst     io.Writer
	tmp     *os.File
	off     int64
	cur     *zipEntry
	chunk   []byte
	pending []*zipChunk // compressing, in entry order
	workers int
	writers sync.Pool // *flate.Writer: hundreds of KiB each, one per chunk otherwise (BenchmarkEvidence1M)
	entries []*zipEntry
}

type zipEntry struct {
	name      string
	off, size int64 // compressed bytes in tmp
	rawSize   int64
	crc       uint32
}

// zipChunk is one chunk being compressed.
type zipChunk struct {
	out  bytes.Buffer
	err  error
	done chan struct{}
}

func newSortedZip(dst io.Writer, tmpDir string) (*sortedZip, error) {
	tmp, err := os.CreateTemp(tmpDir, "auditd-evidence-*.zip.part")
	if err != nil {
		return nil, err
	}
	return &sortedZip{dst: dst, tmp: tmp, workers: runtime.GOMAXPROCS(0)}, nil
}

// Create starts a new entry, finishing the one before.
func (z *sortedZip) Create(name string) (io.Writer, error) {
	if err := z.finish(); err != nil {
		return nil, err
	}
	z.cur = &zipEntry{name: name, off: z.off}
	z.chunk = make([]byte, 0, chunkSize)
	return entryWriter{z}, nil
}

type entryWriter struct{ z *sortedZip }

func (w entryWriter) Write(p []byte) (int, error) {
	z := w.z
	n := len(p)
	z.cur.crc = crc32.Update(z.cur.crc, crc32.IEEETable, p)
	z.cur.rawSize += int64(n)
	for len(p) > 0 {
		m := copy(z.chunk[len(z.chunk):cap(z.chunk)], p)
		z.chunk, p = z.chunk[:len(z.chunk)+m], p[m:]
		if len(z.chunk) == cap(z.chunk) {
			if err := z.submit(false); err != nil {
				return n - len(p), err
			}
		}
	}
	return n, nil
}

// submit starts compressing the current chunk, first writing out finished
// chunks so that no more than workers compress at once.
func (z *sortedZip) submit(final bool) error {
	for len(z.pending) >= z.workers {
		if err := z.collect(); err != nil {
			return err
		}
	}
	c := &zipChunk{done: make(chan struct{})}
	data := z.chunk
	z.chunk = make([]byte, 0, chunkSize)
	z.pending = append(z.pending, c)
	go func() {
		defer close(c.done)
		fw, _ := z.writers.Get().(*flate.Writer)
		if fw == nil {
			fw, _ = flate.NewWriter(&c.out, flateLevel)
		} else {
			fw.Reset(&c.out)
		}
		defer z.writers.Put(fw)
		if _, c.err = fw.Write(data); c.err != nil {
			return
		}
		if final {
			c.err = fw.Close()
		} else {
			c.err = fw.Flush()
		}
	}()
	return nil
}

// collect waits for the oldest chunk and appends it to the temporary file.
func (z *sortedZip) collect() error {
	c := z.pending[0]
	z.pending = z.pending[1:]
	<-c.done
	if c.err != nil {
		return c.err
	}
	n, err := z.tmp.Write(c.out.Bytes())
	z.off += int64(n)
	return err
}

func (z *sortedZip) finish() error {
	if z.cur == nil {
		return nil
	}
	err := z.submit(true)
	for len(z.pending) > 0 {
		if cerr := z.collect(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		return err
	}
	z.cur.size = z.off - z.cur.off
	z.entries = append(z.entries, z.cur)
	z.cur, z.chunk = nil, nil
	return nil
}

// AddFS is not needed by excelize's writer and not supported.
func (z *sortedZip) AddFS(fs.FS) error { return errors.New("sorted zip: AddFS not supported") }

// Close writes the archive to dst, entries ordered by name, and removes the
// temporary file.
func (z *sortedZip) Close() error {
	defer z.discard()
	if err := z.finish(); err != nil {
		return err
	}
	sort.Slice(z.entries, func(i, j int) bool { return z.entries[i].name < z.entries[j].name })
	zw := zip.NewWriter(z.dst)
	for _, e := range z.entries {
		h := &zip.FileHeader{Name: e.name, Method: zip.Deflate,
			CRC32: e.crc, CompressedSize64: uint64(e.size), UncompressedSize64: uint64(e.rawSize)}
		//lint:ignore SA1019 the MS-DOS date alone: Modified would add an extended timestamp to every entry and change the workbook's bytes
		h.ModifiedDate = zipEpochDate
		w, err := zw.CreateRaw(h)
		if err != nil {
			return err
		}
		if _, err := io.Copy(w, io.NewSectionReader(z.tmp, e.off, e.size)); err != nil {
			return err
		}
	}
	return zw.Close()
}

// discard waits for chunks in flight and removes the temporary file; safe
// to call more than once.
func (z *sortedZip) discard() {
	for _, c := range z.pending {
		<-c.done
	}
	z.pending = nil
	if z.tmp == nil {
		return
	}
	z.tmp.Close()
	os.Remove(z.tmp.Name())
	z.tmp = nil
}
