package pack

import (
	"archive/zip"
	"compress/flate"
	"hash/crc32"
	"io"
	"os"
)

// deflated compresses one entry in a goroutine of its own into a
// temporary file, for zip.Writer.CreateRaw: the builder renders the leaves
// on one core while their two entries compress on the other (a pack's
// leaves are most of its bytes).
type deflated struct {
	tmp    *os.File
	in     chan []byte
	free   chan []byte
	cur    []byte
	done   chan error
	crc    uint32
	raw    int64
	closed bool
}

const deflateChunk = 1 << 20

func newDeflated(dir string) (*deflated, error) {
	tmp, err := os.CreateTemp(dir, "auditd-pack-*.deflate")
	if err != nil {
		return nil, err
	}
	d := &deflated{tmp: tmp, in: make(chan []byte, 4), free: make(chan []byte, 6), done: make(chan error, 1)}
	for range 6 {
		d.free <- make([]byte, 0, deflateChunk)
	}
	d.cur = <-d.free
	go d.run()
	return d, nil
}

func (d *deflated) run() {
	fw, err := flate.NewWriter(d.tmp, flate.BestSpeed)
	for b := range d.in {
		if err == nil {
			_, err = fw.Write(b)
		}
		d.free <- b[:0]
	}
	if err == nil {
		err = fw.Close()
	}
	d.done <- err
}

// Write implements io.Writer.
func (d *deflated) Write(p []byte) (int, error) {
	d.crc = crc32.Update(d.crc, crc32.IEEETable, p)
	d.raw += int64(len(p))
	n := len(p)
	for len(p) > 0 {
		m := copy(d.cur[len(d.cur):cap(d.cur)], p)
		d.cur, p = d.cur[:len(d.cur)+m], p[m:]
		if len(d.cur) == cap(d.cur) {
			d.in <- d.cur
			d.cur = <-d.free
		}
	}
	return n, nil
}

// finish waits for the compressor; then the entry can be copied.
func (d *deflated) finish() error {
	if d.closed {
		return nil
	}
	d.closed = true
	if len(d.cur) > 0 {
		d.in <- d.cur
	}
	close(d.in)
	return <-d.done
}

// copyTo writes the entry to zw as name.
func (d *deflated) copyTo(zw *zip.Writer, name string) error {
	if err := d.finish(); err != nil {
		return err
	}
	size, err := d.tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return err
	}
	//lint:ignore SA1019 ModifiedDate fixes the DOS date (1980-01-01) with no extra field, so packs are byte-for-byte reproducible
	w, err := zw.CreateRaw(&zip.FileHeader{Name: name, Method: zip.Deflate, ModifiedDate: 1<<5 | 1,
		CRC32: d.crc, CompressedSize64: uint64(size), UncompressedSize64: uint64(d.raw)})
	if err != nil {
		return err
	}
	_, err = io.Copy(w, io.NewSectionReader(d.tmp, 0, size))
	return err
}

// discard removes the temporary file, waiting for the compressor first.
func (d *deflated) discard() {
	d.finish()
	d.tmp.Close()
	os.Remove(d.tmp.Name())
}
