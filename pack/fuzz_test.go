package pack

import (
	"archive/zip"
	"bytes"
	"io"
	"testing"
)

// FuzzOpen: a pack is outside input; Open and Verify never panic on one,
// however it is malformed.
func FuzzOpen(f *testing.F) {
	var seed []byte
	seedPack(&seed)
	f.Add(seed)
	f.Add([]byte("PK"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := Open(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		Verify(p, Options{})
	})
}

// seedPack writes a small well-formed pack (of nothing that verifies).
func seedPack(out *[]byte) {
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string]string{
		FileManifest:   `{"format":"auditd-evidence-pack/1","origin":"auditd/x","tree_size":3,"runs":[{"id":"r","first_seq":1,"last_seq":2}],"ranges":[{"first_seq":1,"last_seq":2,"prev_hash":"0000000000000000000000000000000000000000000000000000000000000000"}],"leaves":2}`,
		FileProof:      `{"tree_size":3,"root":"","ranges":[{"first_seq":1,"last_seq":2,"left":[],"right":["AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="]}]}`,
		FileCheckpoint: "auditd/x\n3\nAAAA\n\n— auditd/x AAAA\n",
		FilePublicKey:  "auditd/x+00000000+AQ==\n",
		FileLeaves:     "\x00\x00\x00\x03\x01\x01\x01\x00\x00\x00\x03\x01\x01\x02",
		FileNDJSON:     "{}\n{}\n",
	} {
		w, _ := zw.Create(name)
		io.WriteString(w, body)
	}
	w, _ := zw.CreateHeader(&zip.FileHeader{Name: FileWorkbook, Method: zip.Store})
	w.Write([]byte("PK\x05\x06" + string(make([]byte, 18))))
	zw.Close()
	*out = buf.Bytes()
}

// FuzzSheetRows: the sheet scanner never panics and always ends.
func FuzzSheetRows(f *testing.F) {
	f.Add([]byte(`<worksheet><sheetData><row r="1"><c r="A1"><v>12</v></c><c r="B1" t="inlineStr"><is><t>a&#x9;b&lt;</t></is></c></row><row r="2"/></sheetData></worksheet>`))
	f.Add([]byte(`<row><c r="ZZZZ1" t="s"><v>0</v></c></row>`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rr := &rowReader{r: bufioReader(b), rc: io.NopCloser(nil), strings: []string{"x"}}
		for range 10000 {
			if _, err := rr.next(); err != nil {
				return
			}
		}
	})
}
