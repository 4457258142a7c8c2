package pack

import (
	"archive/zip"
	"bytes"
	"io"
	"testing"
)

// FuzzOpenFleet: a fleet pack is outside input; OpenFleet and VerifyFleet
// never panic on one, however it is malformed.
func FuzzOpenFleet(f *testing.F) {
	var node []byte
	seedPack(&node)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for name, body := range map[string]string{
		FileFleetManifest: `{"format":"auditd-fleet-pack/1","origin":"auditd-fleet","tree_size":2,"runs":["r"],` +
			`"nodes":[{"name":"a","key":"auditd/x+00000000+AQ==","leaf_index":1,"leaf":"YXVkaXRkLWZsZWV0LWxlYWYvMQpub2RlIGEKcmV2aXNpb24gMQp4Cg==","inclusion":[],` +
			`"blocks":[{"source":"s","first_unix_nano":1,"interval_nanos":1,"count":2,"revision":1}]}],` +
			`"limits":[{"source":"s","limit":1,"window_nanos":10}]}`,
		FileFleetCheckpoint: "auditd-fleet\n2\nAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n\n\u2014 auditd/x AAAA\n",
	} {
		w, _ := zw.Create(name)
		io.WriteString(w, body)
	}
	w, _ := zw.CreateHeader(&zip.FileHeader{Name: FleetNodePack("a"), Method: zip.Store})
	w.Write(node)
	zw.Close()
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, b []byte) {
		fp, err := OpenFleet(bytes.NewReader(b), int64(len(b)))
		if err != nil {
			return
		}
		VerifyFleet(fp, FleetOptions{})
	})
}
