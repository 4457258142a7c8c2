package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
)

// TestPackDownloadedFromServeVerifies: a pack downloaded from a running
// auditd serve, while another run adds to the ledger, verifies with auditd
// verify --pack against the served public key, and shows its own download
// in its Access log; changing one byte of it fails the check. An award's
// pack verifies too. Each answer is one openapi.yaml declares.
func TestPackDownloadedFromServeVerifies(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd serve")
	}
	dir := t.TempDir()
	const token = "pack-live-test-admin-token-0123456789"
	srv := serveCounty(t, dir, token)
	v := newContractCheck(t)
	submit := func(name, fain string, n int) string {
		var items []map[string]any
		for i := range n {
			items = append(items, map[string]any{"key": fmt.Sprintf("%s-%03d", name, i), "source": "county", "path": fmt.Sprintf("/q?n=%d", i)})
		}
		body, _ := json.Marshal(map[string]any{"name": name, "award": map[string]any{"fain": fain}, "items": items})
		status, got := v.do(t, srv.url, "POST", "/v1/runs", token, string(body))
		var run struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(got, &run); status != http.StatusCreated {
			t.Fatalf("create run %s: %d %s", name, status, got)
		}
		return run.ID
	}
	run1 := submit("first", "F-PACK", 12)
	var done struct{}
	srv.awaitRun(t, run1, token, 60*time.Second, &done)
	submit("second", "F-OTHER", 200) // the ledger grows while the packs are built

	status, key := v.do(t, srv.url, "GET", "/v1/ledger/public-key", token, "")
	if status != http.StatusOK {
		t.Fatalf("public key: %d %s", status, key)
	}
	for _, path := range []string{"/v1/runs/" + run1 + "/evidence-pack.zip", "/v1/evidence-pack.zip?award=F-PACK"} {
		status, body := v.do(t, srv.url, "GET", path, token, "")
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		file := filepath.Join(dir, "pack.zip")
		if err := os.WriteFile(file, body, 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, errOut := runCmd(t, "verify", "--pack", file, "--key", strings.TrimSpace(string(key)))
		if code != 0 || !strings.Contains(out, "pack verified") {
			t.Fatalf("verify --pack of GET %s: exit %d\n%s%s", path, code, out, errOut)
		}
		p, f, err := pack.OpenFile(file)
		if err != nil {
			t.Fatal(err)
		}
		f.Close()
		if len(p.Manifest.Runs) != 1 || p.Manifest.Runs[0].ID != run1 || len(p.Manifest.Access) == 0 {
			t.Errorf("GET %s: runs %+v, access events %v; want run %s and its download", path, p.Manifest.Runs, p.Manifest.Access, run1)
		}

		// A byte of the evidence changed: one in the middle of each entry's
		// stored data, and one in the middle of each of the workbook's
		// sheets. VERIFY.md (instructions for a person) and the workbook's
		// formatting are no evidence: docs/EVIDENCE-PACK.md says so.
		for _, at := range evidenceBytes(t, body) {
			bad := bytes.Clone(body)
			bad[at.offset] ^= 0x01
			if err := os.WriteFile(file, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			if code, out, errOut := runCmd(t, "verify", "--pack", file, "--key", strings.TrimSpace(string(key))); code == 0 {
				t.Errorf("verify --pack of GET %s with byte %d (in %s) changed: exit 0\n%s%s", path, at.offset, at.name, out, errOut)
			}
		}
	}
}

// evidenceBytes are the middle byte of each entry of the pack zip but
// VERIFY.md, and of each worksheet inside evidence.xlsx (stored, so its
// bytes are the workbook's own).
func evidenceBytes(t *testing.T, body []byte) []evidenceByte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(body), int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	var out []evidenceByte
	for _, zf := range zr.File {
		at, err := zf.DataOffset()
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case zf.Name == pack.FileVerify || zf.CompressedSize64 == 0:
		case zf.Name == "evidence.xlsx" && zf.Method == zip.Store:
			book := body[at : at+int64(zf.CompressedSize64)]
			br, err := zip.NewReader(bytes.NewReader(book), int64(len(book)))
			if err != nil {
				t.Fatal(err)
			}
			for _, sf := range br.File {
				if !strings.HasPrefix(sf.Name, "xl/worksheets/") || sf.CompressedSize64 == 0 {
					continue
				}
				in, err := sf.DataOffset()
				if err != nil {
					t.Fatal(err)
				}
				out = append(out, evidenceByte{at + in + int64(sf.CompressedSize64/2), zf.Name + ":" + sf.Name})
			}
		default:
			out = append(out, evidenceByte{at + int64(zf.CompressedSize64/2), zf.Name})
		}
	}
	return out
}

// TestPackLedgerAtHidesLaterEvents: the live pack's view of the ledger
// ends at its checkpoint's size, whichever way it is read, so an event
// appended while a pack is built (another download of the run) never
// reaches a workbook whose proofs cannot cover it.
func TestPackLedgerAtHidesLaterEvents(t *testing.T) {
	dir, _ := mustLedgerDir(t, 10)
	db, err := openDB(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	at := ledgerAt{Reader: ledger.NewReader(db), size: 6}
	var seqs []uint64
	collect := func(e *auditd.Event) error { seqs = append(seqs, e.Seq); return nil }
	if err := at.Scan(1, 0, collect); err != nil || !slices.Equal(seqs, []uint64{1, 2, 3, 4, 5, 6}) {
		t.Errorf("Scan to the head: %v %v", seqs, err)
	}
	seqs = nil
	if err := at.Scan(7, 9, collect); err != nil || len(seqs) != 0 {
		t.Errorf("Scan past the size: %v %v", seqs, err)
	}
	seqs = nil
	if err := at.ScanRun("run", 2, collect); err != nil || !slices.Equal(seqs, []uint64{3, 4, 5, 6}) {
		t.Errorf("ScanRun: %v %v", seqs, err)
	}
	if _, err := at.Event(7); err == nil {
		t.Error("Event 7 of a view of 6 events was found")
	}
	if e, err := at.Event(6); err != nil || e.Seq != 6 {
		t.Errorf("Event 6: %d %v", e.Seq, err)
	}
}
