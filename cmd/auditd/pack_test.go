package main

import (
	"archive/zip"
	"bytes"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	fnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
)

// packUpstream answers every request with a small JSON body, and the first
// request of every fifth path with a 429 (Retry-After: 0), so the run has
// throttles, waits and retries to show.
func packUpstream(t *testing.T) *httptest.Server {
	var mu sync.Mutex
	seen := map[string]bool{}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		mu.Lock()
		first := !seen[r.URL.RequestURI()]
		seen[r.URL.RequestURI()] = true
		mu.Unlock()
		if first && n%5 == 0 {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprintf(w, `{"n":%d}`, n)
	}))
	t.Cleanup(s.Close)
	return s
}

// packRun starts auditd serve on data, runs one run of items against
// upstream to its end, and stops the server gracefully.
func packRun(t *testing.T, data, config, name string, items int) string {
	t.Helper()
	const token = "pack-test-admin-token-0123456789"
	srv := startServe(t, data, config, token)
	var reqItems []map[string]any
	for i := range items {
		// Items carry 1 to 3 records: the source is held to its ceiling
		// in records (R9), and the workbook shows each dispatch's cost.
		reqItems = append(reqItems, map[string]any{"key": fmt.Sprintf("%s-%03d", name, i), "source": "county", "path": fmt.Sprintf("/q?n=%d", i), "cost": 1 + i%3})
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := srv.call(t, "POST", "/v1/runs", token, map[string]any{"name": name, "award": map[string]any{"fain": "F-PACK"}, "items": reqItems}, &created); code != http.StatusCreated {
		t.Fatalf("create run: %d\n%s", code, srv.logs)
	}
	var got struct {
		Status string `json:"status"`
	}
	srv.awaitRun(t, created.ID, token, 60*time.Second, &got)
	if got.Status != string(auditd.RunSucceeded) {
		t.Fatalf("run ended %s\n%s", got.Status, srv.logs)
	}
	srv.cmd.Process.Signal(syscall.SIGTERM)
	if err := srv.cmd.Wait(); err != nil {
		t.Fatalf("graceful shutdown: %v\n%s", err, srv.logs)
	}
	return created.ID
}

// TestEvidencePackFromRealRun builds packs from runs of the real fetch
// loop (auditd serve against an httptest upstream) and verifies them two
// ways: auditd verify --pack, and the outsider's verifier that uses no
// auditd code. Tampering with a row, a leaf, a proof, the checkpoint or
// the key fails both, each naming what is wrong; a second pack is
// consistent with the first; a pack of a forked copy of the ledger is
// not.
func TestEvidencePackFromRealRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd serve")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the long fleet tests
	up := packUpstream(t)
	dir := t.TempDir()
	config := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("sources:\n  - id: county\n    base_url: %s\n    limit: 100\n    window: 1s\n    burst: 3\n    concurrency: 4\n", up.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	run1 := packRun(t, data, config, "first", 30)
	key, err := ledger.ReadPublicKey(data)
	if err != nil {
		t.Fatal(err)
	}
	pack1 := filepath.Join(dir, "pack1.zip")
	// The run's id in lower case, as pasted: a ULID reads the same.
	if code, out, errOut := runCmd(t, "pack", "--data", data, "--run", strings.ToLower(run1), "--out", pack1); code != 0 || !strings.Contains(out, ": 1 run, ") {
		t.Fatalf("pack: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut := runCmd(t, "verify", "--pack", pack1, "--key", key)
	if code != 0 || !strings.Contains(out, "pack verified") || !strings.Contains(out, "Dispatches 36") {
		t.Fatalf("verify --pack: exit %d\n%s%s", code, out, errOut)
	}
	for _, sheet := range []string{"Manifest", "Award context", "Runs", "Dispatches", "Waits and throttles", "Breaker transitions",
		"Registry snapshots", "Control evidence", "Reconciliation", "Served from cache", "Access log", "Retention"} {
		if !regexp.MustCompile(`sheets checked: .*\b` + sheet + `\b`).MatchString(out) {
			t.Errorf("verify --pack does not say it checked sheet %q:\n%s", sheet, out)
		}
	}
	good, err := os.ReadFile(pack1)
	if err != nil {
		t.Fatal(err)
	}
	if err := outsideVerify(good, key); err != nil {
		t.Fatalf("the outsider's verifier rejects a good pack: %v", err)
	}

	// Tampering: each case changes one thing; both verifiers fail, and
	// auditd's names what it is.
	_, otherKey, err := note.GenerateKey(rand.Reader, "auditd/00000000")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		edit  func(t *testing.T, b []byte) []byte
		names string // in auditd verify's output
		// auditdOnly: the outsider's verifier checks the leaves, the
		// proofs and the event sheets, not the sheets derived from them.
		auditdOnly bool
	}{
		{"Row", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Dispatches", func(x []byte) []byte {
				return replaceNth(t, x, `<v>200</v>`, `<v>500</v>`, 3)
			})
		}, `sheet "Dispatches" row`, false},
		{"RowPath", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Dispatches", func(x []byte) []byte {
				return replaceNth(t, x, `/q?n=7<`, `/q?n=8<`, 1)
			})
		}, `column "Path (credentials stripped)"`, false},
		{"RowCost", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Dispatches", func(x []byte) []byte {
				return editCell(t, x, "F3", func(v string) string { n, _ := strconv.Atoi(v); return strconv.Itoa(n + 1) })
			})
		}, `sheet "Dispatches" row 3 (event `, false},
		{"RowDeleted", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Dispatches", func(x []byte) []byte {
				return regexp.MustCompile(`<row r="5">.*?</row>`).ReplaceAll(x, nil)
			})
		}, `Dispatches`, false},
		// The sheets derived from the reconciliation, and the Manifest's
		// hash of each sheet, are checked as well as the event sheets.
		{"ReconciliationActual", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Reconciliation", func(x []byte) []byte {
				return editCell(t, x, "F2", func(v string) string { n, _ := strconv.Atoi(v); return strconv.Itoa(n - 1) })
			})
		}, `sheet "Reconciliation" row 2 (run `, true},
		{"ManifestHashZeroed", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Manifest", func(x []byte) []byte {
				return editRowOf(t, x, ">Reconciliation<", func(row []byte) []byte {
					return regexp.MustCompile(`[0-9a-f]{64}`).ReplaceAll(row, []byte(strings.Repeat("0", 64)))
				})
			})
		}, `sheet "Manifest" row 21 (sheet "Reconciliation"), column "SHA-256 of rows": the sheet has "0000000000000000`, true},
		{"ManifestFilters", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Manifest", func(x []byte) []byte {
				return editRowOf(t, x, ">Filters<", func(row []byte) []byte { return bytes.Replace(row, []byte("run "), []byte("run X"), 1) })
			})
		}, `sheet "Manifest" row 5 (Filters), column "Value"`, true},
		{"ManifestProse", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Manifest", func(x []byte) []byte {
				return editRowOf(t, x, ">Timestamps<", func(row []byte) []byte { return bytes.Replace(row, []byte("UTC, "), []byte("local time, "), 1) })
			})
		}, `sheet "Manifest" row 12 (Timestamps), column "Value"`, true},
		{"RunsSucceeded", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Runs", func(x []byte) []byte {
				return editCell(t, x, "J2", func(v string) string { n, _ := strconv.Atoi(v); return strconv.Itoa(n + 1) })
			})
		}, `sheet "Runs" row 2 (run `, true},
		{"ControlPeak", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Control evidence", func(x []byte) []byte {
				return editCell(t, x, "C2", func(v string) string { n, _ := strconv.Atoi(v); return strconv.Itoa(n + 1) })
			})
		}, `sheet "Control evidence" row 2 (run `, true},
		{"AwardFAIN", func(t *testing.T, b []byte) []byte {
			return editWorkbookSheet(t, b, "Award context", func(x []byte) []byte {
				return editCell(t, x, "B2", func(string) string { return "F-OTHER" })
			})
		}, `sheet "Award context" row 2 (run `, true},
		{"Leaf", func(t *testing.T, b []byte) []byte {
			return editEntry(t, b, "events.bin", func(x []byte) []byte { return replaceNth(t, x, "/q?n=3", "/q?n=9", 1) })
		}, "do not rebuild the checkpoint's root", false},
		{"Proof", func(t *testing.T, b []byte) []byte {
			return editEntry(t, b, "proof.json", func(x []byte) []byte {
				return regexp.MustCompile(`"left": \[\n\s+"[A-Za-z0-9+/]`).ReplaceAllFunc(x, func(m []byte) []byte {
					m = bytes.Clone(m)
					if m[len(m)-1] == 'A' {
						m[len(m)-1] = 'B'
					} else {
						m[len(m)-1] = 'A'
					}
					return m
				})
			})
		}, "proof.json", false},
		{"Checkpoint", func(t *testing.T, b []byte) []byte {
			return editEntry(t, b, "checkpoint.txt", func(x []byte) []byte {
				lines := strings.SplitN(string(x), "\n", 3)
				n, _ := strconv.Atoi(lines[1])
				return []byte(lines[0] + "\n" + strconv.Itoa(n+1) + "\n" + lines[2])
			})
		}, "checkpoint.txt", false},
		{"Key", func(t *testing.T, b []byte) []byte {
			return editEntry(t, b, "public-key.txt", func([]byte) []byte { return []byte(otherKey + "\n") })
		}, "public-key.txt is not the trusted key", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := tc.edit(t, good)
			if bytes.Equal(bad, good) {
				t.Fatal("the edit changed nothing")
			}
			path := filepath.Join(t.TempDir(), "tampered.zip")
			if err := os.WriteFile(path, bad, 0o600); err != nil {
				t.Fatal(err)
			}
			code, out, errOut := runCmd(t, "verify", "--pack", path, "--key", key)
			if code != 1 || !strings.Contains(out, tc.names) {
				t.Errorf("auditd verify --pack: exit %d, want 1 naming %q\n%s%s", code, tc.names, out, errOut)
			}
			if tc.auditdOnly {
				return
			}
			if err := outsideVerify(bad, key); err == nil {
				t.Error("the outsider's verifier accepts the tampered pack")
			} else {
				t.Logf("outsider: %v", err)
			}
		})
	}

	// A fork: a copy of the data directory taken now goes on with other
	// runs than the original.
	fork := filepath.Join(dir, "fork")
	copyDir(t, data, fork)
	run2 := packRun(t, data, config, "second", 12)
	pack2 := filepath.Join(dir, "pack2.zip")
	if code, out, errOut := runCmd(t, "pack", "--data", data, "--run", run2, "--out", pack2, "--previous", pack1); code != 0 {
		t.Fatalf("pack --previous: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "verify", "--pack", pack2, "--key", key, "--previous", pack1)
	if code != 0 || !strings.Contains(out, "consistent: the log at size") {
		t.Fatalf("verify --pack --previous: exit %d\n%s%s", code, out, errOut)
	}
	// A pack proven against a checkpoint a witness cosigned: verify can
	// require that witness, and fails naming it when another is required.
	witnessed := filepath.Join(dir, "witnessed.zip")
	cosigned := filepath.Join(dir, "cosigned.txt")
	wkey, otherWitness := cosignLatest(t, data, cosigned)
	if code, out, errOut := runCmd(t, "pack", "--data", data, "--run", run2, "--out", witnessed, "--checkpoint", cosigned); code != 0 {
		t.Fatalf("pack --checkpoint: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--pack", witnessed, "--key", key, "--require-witness", wkey); code != 0 || !strings.Contains(out, "cosigned by: witness.example/w1") {
		t.Errorf("verify --require-witness: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--pack", witnessed, "--key", key, "--require-witness", otherWitness); code != 1 || !strings.Contains(out, "not cosigned by witness.example/w2") || !strings.Contains(out, "pack NOT verified: 1 problem\n") {
		t.Errorf("verify --require-witness of a witness that did not cosign: exit %d, want 1\n%s%s", code, out, errOut)
	}

	// One pack of the award over the period holds both runs.
	awardPack := filepath.Join(dir, "award.zip")
	if code, out, errOut := runCmd(t, "pack", "--data", data, "--award", "F-PACK", "--from", "2020-01-01", "--out", awardPack); code != 0 || !strings.Contains(out, "2 runs") {
		t.Fatalf("pack --award: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--pack", awardPack, "--key", key); code != 0 || !strings.Contains(out, "pack verified") {
		t.Fatalf("verify the award's pack: exit %d\n%s%s", code, out, errOut)
	}
	runFork := packRun(t, fork, config, "forked", 20)
	forkPack := filepath.Join(dir, "fork.zip")
	if code, out, errOut := runCmd(t, "pack", "--data", fork, "--run", runFork, "--out", forkPack, "--previous", pack2); code != 2 || !strings.Contains(errOut, "not in this ledger's history") {
		t.Errorf("pack of the fork with the original's checkpoint as --previous: exit %d, want 2 refusing\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "pack", "--data", fork, "--run", runFork, "--out", forkPack, "--previous", pack1); code != 0 {
		t.Fatalf("pack of the fork: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = runCmd(t, "verify", "--pack", forkPack, "--key", key, "--previous", pack2)
	if code != 1 {
		t.Errorf("the fork's pack against the original's second pack: exit %d, want 1\n%s%s", code, out, errOut)
	}
	t.Logf("fork: %s", out)

	// Retention: the award's final report was long ago, so its payloads
	// may go, but not while a hold stands; after the purge the ledger and
	// the packs still verify, R6 still balances, and the pack's workbook
	// shows the holds and the purge in its Retention and Access sheets.
	retention := func(args ...string) (int, string) {
		code, out, errOut := runCmd(t, append([]string{"retention", args[0], "--data", data, "--by", "admin:test", "--json"}, args[1:]...)...)
		return code, out + errOut
	}
	if code, out := retention("set", "--award", "F-PACK", "--final-report", "2020-06-30"); code != 0 || !strings.Contains(out, `"retain_until": "2023-06-30T00:00:00Z"`) {
		t.Fatalf("retention set: %d %s", code, out)
	}
	code, holdOut := retention("hold", "--award", "F-PACK", "--reason", "single audit FY2025")
	var hold struct{ ID string }
	if code != 0 || json.Unmarshal([]byte(holdOut), &hold) != nil || hold.ID == "" {
		t.Fatalf("retention hold: %d %s", code, holdOut)
	}
	if code, out := retention("purge", "--award", "F-PACK"); code != 1 || !strings.Contains(out, "legal hold") || !strings.Contains(out, "single audit FY2025") {
		t.Fatalf("purge under a hold: exit %d, want 1 refusing clearly\n%s", code, out)
	}
	if code, out := retention("release", "--award", "F-PACK", "--hold", hold.ID, "--reason", "audit closed"); code != 0 {
		t.Fatalf("release: %d %s", code, out)
	}
	code, purgeOut := retention("purge", "--award", "F-PACK")
	var purged struct{ Payloads int }
	if code != 0 || json.Unmarshal([]byte(purgeOut), &purged) != nil || purged.Payloads == 0 {
		t.Fatalf("purge: %d %s", code, purgeOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--data", data); code != 0 {
		t.Errorf("verify after the purge: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "reconcile", "--data", data, "--run", run1, "--format", "json"); code != 0 || !strings.Contains(out, "purged under retention") {
		t.Errorf("reconcile after the purge: exit %d, want 0 noting the purge\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--pack", pack1, "--key", key); code != 0 {
		t.Errorf("an earlier pack after the purge: exit %d\n%s%s", code, out, errOut)
	}
	pack3 := filepath.Join(dir, "pack3.zip")
	if code, out, errOut := runCmd(t, "pack", "--data", data, "--run", run1, "--out", pack3, "--previous", pack2); code != 0 {
		t.Fatalf("pack after the purge: exit %d\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "verify", "--pack", pack3, "--key", key, "--previous", pack2); code != 0 || !strings.Contains(out, "Retention 4") {
		t.Fatalf("verify the pack after the purge: exit %d, want 0 with 4 Retention rows\n%s%s", code, out, errOut)
	}
	b3, _ := os.ReadFile(pack3)
	book := readEntry(t, b3, "evidence.xlsx")
	sheets, err := outsideSheets(book)
	if err != nil {
		t.Fatal(err)
	}
	var access []string
	for _, row := range sheets["Access log"] {
		access = append(access, strings.Join(row, " | "))
	}
	joined := strings.Join(access, "\n")
	for _, want := range []string{"placed a legal hold on award F-PACK: single audit FY2025", "released legal hold " + hold.ID, "purged", "admin:test"} {
		if !strings.Contains(joined, want) {
			t.Errorf("the Access log lacks %q:\n%s", want, joined)
		}
	}
	if err := outsideVerify(b3, key); err != nil {
		t.Errorf("the outsider's verifier rejects the pack after the purge: %v", err)
	}
}

// cosignLatest cosigns the latest checkpoint of the stopped server's data
// directory as witness w1 (transparency-dev/formats' cosignature/v1),
// writes it to path, and returns w1's key and another witness's.
func cosignLatest(t *testing.T, data, path string) (wkey, other string) {
	t.Helper()
	db, err := openDB(data, true)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := ledger.NewReader(db).Checkpoint()
	db.Close()
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ledger.ReadPublicKey(data)
	v, _ := note.NewVerifier(key)
	n, err := note.Open(cp, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	var signer note.Signer
	for _, name := range []string{"witness.example/w1", "witness.example/w2"} {
		skey, vkey, err := note.GenerateKey(rand.Reader, name)
		if err != nil {
			t.Fatal(err)
		}
		s, err := fnote.NewSignerForCosignatureV1(skey)
		if err != nil {
			t.Fatal(err)
		}
		if signer == nil {
			signer = s
		}
		ck, err := fnote.VKeyToCosignatureV1(vkey)
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, ck)
	}
	out, err := note.Sign(n, signer)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, out, 0o600); err != nil {
		t.Fatal(err)
	}
	return keys[0], keys[1]
}

func readEntry(t *testing.T, b []byte, name string) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range zr.File {
		if f.Name == name {
			rc, _ := f.Open()
			defer rc.Close()
			out, _ := io.ReadAll(rc)
			return out
		}
	}
	t.Fatalf("no %s", name)
	return nil
}

// TestIndependentVerifierImports holds the outsider's verifier to the
// standard library, transparency-dev/merkle and x/mod's note.
func TestIndependentVerifierImports(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "independent_verifier_test.go", nil, parser.ImportsOnly)
	if err != nil {
		t.Fatal(err)
	}
	for _, imp := range f.Imports {
		p, _ := strconv.Unquote(imp.Path.Value)
		if strings.Contains(p, ".") && !strings.HasPrefix(p, "github.com/transparency-dev/merkle") && p != "golang.org/x/mod/sumdb/note" {
			t.Errorf("the independent verifier imports %s", p)
		}
	}
}

// editEntry returns the zip b with entry name changed by fn, every other
// entry copied as it was.
func editEntry(t *testing.T, b []byte, name string, fn func([]byte) []byte) []byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	zw := zip.NewWriter(&out)
	for _, f := range zr.File {
		rc, err := f.Open()
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		if f.Name == name {
			data = fn(data)
		}
		w, err := zw.CreateHeader(&zip.FileHeader{Name: f.Name, Method: f.Method})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(data)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// editWorkbookSheet changes the XML of one sheet of the pack's workbook.
func editWorkbookSheet(t *testing.T, b []byte, sheet string, fn func([]byte) []byte) []byte {
	t.Helper()
	return editEntry(t, b, "evidence.xlsx", func(book []byte) []byte {
		part := sheetPart(t, book, sheet)
		return editEntry(t, book, part, fn)
	})
}

// sheetPart finds the part name of a sheet from workbook.xml and its rels.
func sheetPart(t *testing.T, book []byte, sheet string) string {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(book), int64(len(book)))
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		for _, f := range zr.File {
			if f.Name == name {
				rc, _ := f.Open()
				defer rc.Close()
				b, _ := io.ReadAll(rc)
				return string(b)
			}
		}
		t.Fatalf("no %s", name)
		return ""
	}
	m := regexp.MustCompile(`<sheet name="` + regexp.QuoteMeta(sheet) + `" sheetId="\d+" r:id="(rId\d+)"`).FindStringSubmatch(read("xl/workbook.xml"))
	if m == nil {
		t.Fatalf("no sheet %q", sheet)
	}
	r := regexp.MustCompile(`Id="` + m[1] + `" Target="([^"]+)"|Target="([^"]+)"[^>]*Id="` + m[1] + `"`).FindStringSubmatch(read("xl/_rels/workbook.xml.rels"))
	if r == nil {
		t.Fatalf("no part for %s", m[1])
	}
	target := r[1] + r[2]
	return "xl/" + strings.TrimPrefix(target, "/xl/")
}

// editCell edits the value of the cell at ref (as "F2") of a sheet's XML.
func editCell(t *testing.T, x []byte, ref string, fn func(string) string) []byte {
	t.Helper()
	m := regexp.MustCompile(`<c r="` + ref + `"[^>]*>.*?</c>`).FindIndex(x)
	if m == nil {
		t.Fatalf("no cell %s", ref)
	}
	cell := regexp.MustCompile(`(<v>|<t[^>]*>)([^<]*)(</v>|</t>)`).ReplaceAllFunc(x[m[0]:m[1]], func(v []byte) []byte {
		sub := regexp.MustCompile(`^(<v>|<t[^>]*>)([^<]*)(</v>|</t>)$`).FindSubmatch(v)
		return []byte(string(sub[1]) + fn(string(sub[2])) + string(sub[3]))
	})
	return slices.Concat(x[:m[0]], cell, x[m[1]:])
}

// editRowOf edits the row of a sheet's XML that holds marker.
func editRowOf(t *testing.T, x []byte, marker string, fn func([]byte) []byte) []byte {
	t.Helper()
	for _, m := range regexp.MustCompile(`<row [^>]*>.*?</row>`).FindAllIndex(x, -1) {
		if bytes.Contains(x[m[0]:m[1]], []byte(marker)) {
			return slices.Concat(x[:m[0]], fn(bytes.Clone(x[m[0]:m[1]])), x[m[1]:])
		}
	}
	t.Fatalf("no row holds %q", marker)
	return nil
}

func replaceNth(t *testing.T, b []byte, old, new string, n int) []byte {
	t.Helper()
	i := -1
	for range n {
		j := bytes.Index(b[i+1:], []byte(old))
		if j < 0 {
			t.Fatalf("%q occurs fewer than %d times", old, n)
		}
		i += 1 + j
	}
	return append(append(append([]byte(nil), b[:i]...), new...), b[i+len(old):]...)
}

func copyDir(t *testing.T, from, to string) {
	t.Helper()
	err := filepath.Walk(from, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, p)
		dst := filepath.Join(to, rel)
		if fi.IsDir() {
			return os.MkdirAll(dst, 0o700)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, fi.Mode())
	})
	if err != nil {
		t.Fatal(err)
	}
}

// evidenceByte is a byte of a pack that holds evidence, and where it is.
type evidenceByte struct {
	offset int64
	name   string
}
