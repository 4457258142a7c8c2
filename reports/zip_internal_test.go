package reports

import (
	"archive/zip"
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"testing"
)

// TestSortedZip writes entries out of order, one spanning several chunks,
// and reads them back with archive/zip: names sorted, contents intact, and
// the same bytes whatever the number of cores.
func TestSortedZip(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	big := make([]byte, 2*chunkSize+12345)
	for i := range big {
		big[i] = "<row r=\"1\"><c>abcdefgh</c></row>"[rng.IntN(32)] // compressible, not trivial
	}
	entries := []struct {
		name string
		data []byte
	}{
		{"xl/worksheets/sheet2.xml", big},
		{"[Content_Types].xml", []byte("<Types/>")},
		{"xl/empty.xml", nil},
		{"docProps/app.xml", bytes.Repeat([]byte("x"), chunkSize)}, // exactly one chunk
	}
	write := func(procs int) []byte {
		defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(procs))
		var out bytes.Buffer
		z, err := newSortedZip(&out, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			w, err := z.Create(e.name)
			if err != nil {
				t.Fatal(err)
			}
			for p := e.data; len(p) > 0; { // uneven writes, as io.Copy makes them
				n := min(len(p), 1+rng.IntN(100_000))
				if _, err := w.Write(p[:n]); err != nil {
					t.Fatal(err)
				}
				p = p[n:]
			}
		}
		if err := z.Close(); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	one, many := write(1), write(4)
	if !bytes.Equal(one, many) {
		t.Error("archive depends on the number of cores")
	}
	r, err := zip.NewReader(bytes.NewReader(many), int64(len(many)))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]byte{}
	for _, e := range entries {
		want[e.name] = e.data
	}
	var names []string
	for _, f := range r.File {
		names = append(names, f.Name)
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc) // checks the CRC too
		rc.Close()
		if err != nil {
			t.Fatalf("%s: %v", f.Name, err)
		}
		if !bytes.Equal(got, want[f.Name]) {
			t.Errorf("%s: %d bytes back, wrote %d", f.Name, len(got), len(want[f.Name]))
		}
	}
	if fmt.Sprint(names) != "[[Content_Types].xml docProps/app.xml xl/empty.xml xl/worksheets/sheet2.xml]" {
		t.Errorf("entries in order %v", names)
	}
}
