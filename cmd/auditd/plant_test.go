package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// plant is a secret no test output holds by chance.
func plant(n int) string { return fmt.Sprintf("PLANTED%02dzq9x", n) }

// TestPlantedSecretsNeverLeave plants credentials in sources (declared
// secret_query names, built-in names, headers, userinfo) and items, drives
// runs into errors of every kind (a bad path, a refused connection, a
// denied address, redirects, a 5xx, a body cut short), then searches every
// API response, every export (XLSX unzipped, CSV, JSON), /metrics, the logs
// and every byte of the data directory, bbolt file included: none holds a
// planted secret. The upstream saw the credentials, and exactly the
// requests the ledger dispatched.
func TestPlantedSecretsNeverLeave(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd")
	}
	secrets := map[string]string{}
	for i := 1; i <= 16; i++ {
		secrets[plant(i)] = ""
	}

	var mu sync.Mutex
	var seen []string // what the upstream received: path and headers
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI()+" "+r.Header.Get("X-Api-Key")+" "+r.Header.Get("Authorization")+" "+r.Header.Get("X-Token"))
		mu.Unlock()
		switch {
		case strings.HasPrefix(r.URL.Path, "/ok"):
			io.WriteString(w, `{"features":[]}`)
		case r.URL.Path == "/redirect":
			w.Header().Set("Location", "http://user:"+plant(13)+"@other.example/x?sig="+plant(14)+"&f=json")
			w.WriteHeader(http.StatusFound)
		case r.URL.Path == "/fail":
			w.WriteHeader(http.StatusInternalServerError)
		case r.URL.Path == "/cut":
			// A body cut short: the length promises more than arrives.
			w.Header().Set("Content-Length", "1000")
			w.WriteHeader(http.StatusOK)
			io.WriteString(w, `{"partial":`)
			if hj, ok := w.(http.Hijacker); ok {
				conn, _, _ := hj.Hijack()
				conn.Close()
			}
		default:
			http.NotFound(w, r)
		}
	}))
	defer up.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there: connection refused

	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	config := filepath.Join(dir, "sources.yaml")
	cfg := fmt.Sprintf(`sources:
  - id: up
    base_url: %s
    max_attempts: 2
    breaker: {threshold: 100}
    headers: {X-Api-Key: %s, Authorization: "Bearer %s"}
    secret_query: [sq, My_Param]
  - id: refused
    base_url: %s
    max_attempts: 2
    secret_query: [sq]
  - id: meta
    base_url: http://169.254.169.254
    max_attempts: 2
`, up.URL, plant(1), plant(2), refused)
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "plant-test-admin-token-0123456789abcdef"
	c := startServe(t, data, config, token)

	var responses [][]byte // every API response body
	get := func(path string) []byte {
		t.Helper()
		req, _ := http.NewRequest("GET", c.url+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		responses = append(responses, b)
		return b
	}
	send := func(method, path, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, c.url+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		responses = append(responses, b)
		return resp.StatusCode, b
	}

	// Credentials in a base URL are refused, pointing to headers and
	// secret_query; a header set through the API is shown by name only.
	for _, bad := range []string{"http://user:" + plant(3) + "@x.example", "https://x.example/?api_key=" + plant(3)} {
		code, b := send("PUT", "/v1/sources/leaky", `{"base_url":"`+bad+`"}`)
		if code != http.StatusBadRequest || !bytes.Contains(b, []byte("headers")) || !bytes.Contains(b, []byte("secret_query")) {
			t.Errorf("base_url %s: %d %s, want 400 pointing to headers and secret_query", bad, code, b)
		}
	}
	if code, b := send("PUT", "/v1/sources/api", `{"base_url":"`+up.URL+`","headers":{"X-Token":"`+plant(4)+`"},"secret_query":["sq"]}`); code != http.StatusCreated {
		t.Fatalf("PUT source: %d %s", code, b)
	}
	if b := get("/v1/sources/api"); !bytes.Contains(b, []byte(`"X-Token":"[redacted]"`)) {
		t.Errorf("GET /v1/sources/api shows no redacted header names: %s", b)
	}
	if b := get("/v1/sources/up"); !bytes.Contains(b, []byte(`"X-Api-Key":"[redacted]"`)) || !bytes.Contains(b, []byte(`"Authorization":"[redacted]"`)) {
		t.Errorf("GET /v1/sources/up shows no redacted header names: %s", b)
	}

	items := []map[string]any{
		{"key": "ok/declared", "source": "up", "path": "/ok?sq=" + plant(5) + "&f=json"},
		{"key": "ok/declared-case", "source": "up", "path": "/ok?MY-PARAM=" + plant(6)},
		{"key": "ok/builtin", "source": "up", "path": "/ok?accessKey=" + plant(7) + "&X-Amz-Credential=" + plant(8) + "&session_id=" + plant(9)},
		{"key": "nonascii", "source": "up", "path": "/ok/caf\u00e9?auth=" + plant(10)},
		{"key": "bad/path", "source": "up", "path": "/nowhere%20here?api-key=" + plant(11)},
		{"key": "redirect", "source": "up", "path": "/redirect?token=" + plant(12)},
		{"key": "5xx", "source": "up", "path": "/fail?sq=" + plant(15)},
		{"key": "cut", "source": "up", "path": "/cut?password=" + plant(16)},
		{"key": "refused", "source": "refused", "path": "/p?sq=" + plant(5)},
		{"key": "meta", "source": "meta", "path": "/latest/meta-data?X-Amz-Signature=" + plant(7)},
		{"key": "api", "source": "api", "path": "/ok?sq=" + plant(6)},
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := c.call(t, "POST", "/v1/runs", token, map[string]any{"name": "plant", "award": map[string]any{"fain": "PLANT-AWARD"}, "items": items}, &created); code != http.StatusCreated {
		t.Fatalf("create run: %d\n%s", code, c.logs)
	}
	var done struct {
		Status string         `json:"status"`
		Counts map[string]int `json:"counts"`
	}
	c.awaitRun(t, created.ID, token, 2*time.Minute, &done)
	if done.Counts["succeeded"] != 5 || done.Counts["failed"] != len(items)-5 {
		t.Errorf("counts %v, want 5 succeeded and %d failed", done.Counts, len(items)-5)
	}

	run := "/v1/runs/" + created.ID
	get(run)
	get("/v1/runs")
	get("/v1/sources")
	get(run + "/items")
	for _, it := range items {
		get(run + "/items/" + url.PathEscape(it["key"].(string)))
	}
	events := get(run + "/events?limit=1000")
	get(run + "/reconciliation")
	get(run + "/reconciliation?format=csv")
	xlsx := [][]byte{get(run + "/reconciliation?format=xlsx"), get(run + "/evidence.xlsx"), get("/v1/evidence.xlsx?award=PLANT-AWARD")}
	get("/metrics")
	for _, b := range xlsx {
		responses = append(responses, unzipAll(t, b)...)
	}
	// The records say what happened, redacted.
	for _, want := range []string{"REDACTED", "redirect (302) not followed", "upstream address policy", "connection refused"} {
		if !bytes.Contains(events, []byte(want)) && !bytes.Contains(bytes.Join(responses, nil), []byte(want)) {
			t.Errorf("no record says %q", want)
		}
	}

	c.cmd.Process.Signal(syscall.SIGTERM)
	c.cmd.Wait()
	logs := c.logs.Bytes()

	// The upstream received the credentials (they are sent), and exactly
	// the requests the ledger dispatched to it.
	mu.Lock()
	wire := strings.Join(seen, "\n")
	nUp := len(seen)
	mu.Unlock()
	for _, s := range []string{plant(1), plant(2), plant(4), plant(5), plant(7), plant(12)} {
		if !strings.Contains(wire, s) {
			t.Errorf("the upstream never received %s: the credential was not sent", s)
		}
	}
	var page struct {
		Events []struct {
			Type   string `json:"type"`
			Source string `json:"source_id"`
		} `json:"events"`
	}
	if err := json.Unmarshal(events, &page); err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range page.Events {
		if e.Type == "dispatch" && (e.Source == "up" || e.Source == "api") {
			n++
		}
	}
	if n != nUp || n == 0 {
		t.Errorf("the ledger dispatched %d requests to the upstream, which received %d", n, nUp)
	}

	// Offline: the exports and the reconciliation read from the data
	// directory.
	out := filepath.Join(dir, "offline.xlsx")
	if code, _, errOut := runCmd(t, "export", "--data", data, "--run", created.ID, "--out", out); code != 0 {
		t.Fatalf("export: %d %s", code, errOut)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	responses = append(responses, unzipAll(t, b)...)
	os.Remove(out)

	where := map[string][]byte{"logs": logs}
	for i, r := range responses {
		where[fmt.Sprintf("response %d", i)] = r
	}
	err = filepath.WalkDir(data, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		where[path] = b
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := where[filepath.Join(data, dbFile)]; !ok {
		t.Fatalf("no bbolt file in %s", data)
	}
	for name, b := range where {
		for s := range secrets {
			if bytes.Contains(b, []byte(s)) {
				i := bytes.Index(b, []byte(s))
				t.Errorf("%s holds %s: ...%q...", name, s, b[max(0, i-120):min(len(b), i+40)])
			}
		}
	}
}

// unzipAll returns the uncompressed bytes of every entry of a zip (an
// XLSX: its sheets and shared strings).
func unzipAll(t *testing.T, b []byte) [][]byte {
	t.Helper()
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatalf("not a zip: %v (%.200s)", err, b)
	}
	var out [][]byte
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
		out = append(out, data)
	}
	return out
}
