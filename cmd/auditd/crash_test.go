package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/sim"
)

// TestMain lets a test start this binary as auditd itself: with
// AUDITD_MAIN_ARGS set (a JSON list), the process is `auditd ARGS...`.
func TestMain(m *testing.M) {
	if raw := os.Getenv("AUDITD_MAIN_ARGS"); raw != "" {
		var args []string
		if err := json.Unmarshal([]byte(raw), &args); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		main2(args)
	}
	os.Exit(m.Run())
}

// main2 is main with explicit arguments.
func main2(args []string) {
	os.Args = append([]string{"auditd"}, args...)
	main()
}

// startSim serves a simulator scenario on loopback on the real clock, for
// auditd serve in a child process to fetch from.
func startSim(tb testing.TB, scenario string) (*sim.Sim, map[string]string) {
	tb.Helper()
	sc, err := sim.ParseScenario([]byte(scenario))
	if err != nil {
		tb.Fatal(err)
	}
	s, err := sim.New(sc, clock.Real{})
	if err != nil {
		tb.Fatal(err)
	}
	urls, err := s.Start(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close(context.Background()) })
	return s, urls
}

// child is auditd serve running in a process of its own.
type child struct {
	cmd  *exec.Cmd
	url  string
	logs *bytes.Buffer
}

// startServe starts auditd serve on dataDir, declaring config's sources,
// with extra flags after the others.
func startServe(tb testing.TB, dataDir, config, token string, extra ...string) *child {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return serveAt(tb, addr, dataDir, config, token, extra...)
}

// serveAt starts auditd serve on addr and waits for it to answer.
func serveAt(tb testing.TB, addr, dataDir, config, token string, extra ...string) *child {
	tb.Helper()
	args, _ := json.Marshal(append([]string{"serve", "--data", dataDir, "--addr", addr, "--config", config,
		"--start-limit", "40", "--start-window", "1s"}, extra...))
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "AUDITD_MAIN_ARGS="+string(args), "AUDITD_BOOTSTRAP_TOKEN="+token)
	logs := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	c := &child{cmd: cmd, url: "http://" + addr, logs: logs}
	tb.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for i := 0; ; i++ {
		resp, err := http.Get(c.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			return c
		}
		if i == 200 {
			tb.Fatalf("auditd serve on %s did not come up: %v\n%s", addr, err, logs)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// awaitRun polls run id until its status is terminal, then decodes the run
// into out; it fails tb if the run is not done within the given time.
func (c *child) awaitRun(tb testing.TB, id, token string, within time.Duration, out any) {
	tb.Helper()
	var run struct {
		Status string `json:"status"`
	}
	for deadline := time.Now().Add(within); ; {
		c.call(tb, "GET", "/v1/runs/"+id, token, nil, &run)
		if auditd.RunStatus(run.Status).Terminal() {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("run %s did not finish within %v (status %q)\n%s", id, within, run.Status, c.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.call(tb, "GET", "/v1/runs/"+id, token, nil, out)
}

func (c *child) call(tb testing.TB, method, path, token string, body any, out any) int {
	tb.Helper()
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, _ := http.NewRequest(method, c.url+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if out != nil {
		json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode
}

// After a SIGKILL in the middle of a run and a restart, the run completes,
// and the ledger never shows fewer dispatches than the upstream received.
func TestSIGKILLMidRunResumes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd twice")
	}
	s, urls := startSim(t, `
name: crash
seed: 1
upstreams:
  - name: county
    path: /q
    limit: {shape: token_bucket, requests: 200, window: 1s, burst: 50}
    latency: {fixed: 15ms}
`)

	dir := t.TempDir()
	config := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("sources:\n  - id: county\n    base_url: %s\n    limit: 40\n    window: 1s\n    concurrency: 4\n", urls["county"])), 0o600); err != nil {
		t.Fatal(err)
	}
	data := filepath.Join(dir, "data")
	const token = "crash-test-admin-token-0123456789"
	const items = 120

	first := startServe(t, data, config, token)
	var reqItems []map[string]any
	for i := range items {
		reqItems = append(reqItems, map[string]any{"key": fmt.Sprintf("k%03d", i), "source": "county", "path": fmt.Sprintf("/q?n=%d", i)})
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := first.call(t, "POST", "/v1/runs", token, map[string]any{"name": "crash", "items": reqItems}, &created); code != http.StatusCreated {
		t.Fatalf("create run: %d\n%s", code, first.logs)
	}
	for deadline := time.Now().Add(20 * time.Second); s.Stats("county").Received < items/3; {
		if time.Now().After(deadline) {
			t.Fatalf("the run made no progress: %d received\n%s", s.Stats("county").Received, first.logs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	first.cmd.Wait()
	receivedAtKill := s.Stats("county").Received
	if receivedAtKill >= items {
		t.Fatalf("the run finished before the kill (%d received); the test proves nothing", receivedAtKill)
	}

	second := startServe(t, data, config, token)
	var got struct {
		Status string         `json:"status"`
		Counts map[string]any `json:"counts"`
	}
	second.awaitRun(t, created.ID, token, 60*time.Second, &got)
	if got.Status != string(auditd.RunSucceeded) {
		t.Errorf("resumed run ended %s: %v", got.Status, got.Counts)
	}
	// CI's question, asked the way CI asks it: does the run reconcile?
	var rec struct {
		Balanced bool `json:"balanced"`
		Checks   []struct {
			ID     string `json:"id"`
			Status string `json:"status"`
			Note   string `json:"note"`
		} `json:"checks"`
	}
	if code := second.call(t, "GET", "/v1/runs/"+created.ID+"/reconciliation", token, nil, &rec); code != http.StatusOK {
		t.Fatalf("reconciliation: %d", code)
	}
	if !rec.Balanced {
		t.Errorf("the resumed run does not reconcile: %+v", rec.Checks)
	}
	var table strings.Builder
	if code := run(context.Background(), []string{"reconcile", "--server", second.url, "--run", created.ID, "--token", token}, &table, &table); code != 0 {
		t.Errorf("auditd reconcile --server exited %d:\n%s", code, table.String())
	}
	req, _ := http.NewRequest("GET", second.url+"/v1/runs/"+created.ID+"/evidence.xlsx", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	book, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !bytes.HasPrefix(book, []byte("PK")) {
		t.Errorf("evidence workbook: %d, %d bytes", resp.StatusCode, len(book))
	}

	second.cmd.Process.Signal(syscall.SIGTERM)
	if err := second.cmd.Wait(); err != nil {
		t.Errorf("graceful shutdown: %v\n%s", err, second.logs)
	}

	// Offline, from the file: every request the upstream received is on record.
	db, err := openDB(data, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	counts := map[auditd.EventType]int{}
	finished := map[string]int{}
	if err := ledger.NewReader(db).ScanRun(created.ID, 0, func(e *auditd.Event) error {
		counts[e.Type]++
		if e.Type == auditd.EventItemFinished {
			finished[e.ItemKey]++
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	received := s.Stats("county").Received
	t.Logf("received %d (%d before the kill), dispatches %d, interrupted %d, resumed %d",
		received, receivedAtKill, counts[auditd.EventDispatch], counts[auditd.EventInterrupted], counts[auditd.EventRunResumed])
	if counts[auditd.EventDispatch] < received {
		t.Errorf("ledger shows %d dispatches, upstream received %d", counts[auditd.EventDispatch], received)
	}
	if counts[auditd.EventRunResumed] != 1 {
		t.Errorf("%d run.resumed events", counts[auditd.EventRunResumed])
	}
	if len(finished) != items {
		t.Errorf("%d of %d items finished", len(finished), items)
	}
	for k, n := range finished {
		if n != 1 {
			t.Errorf("item %s finished %d times", k, n)
		}
	}
	outcomes := counts[auditd.EventResponse] + counts[auditd.EventThrottle] + counts[auditd.EventTransportError] + counts[auditd.EventInterrupted]
	if outcomes != counts[auditd.EventDispatch] {
		t.Errorf("%d dispatches, %d outcomes (interrupted included)", counts[auditd.EventDispatch], outcomes)
	}
	db.Close()
	var out strings.Builder
	if code := run(context.Background(), []string{"verify", "--data", data}, &out, &out); code != 0 {
		t.Errorf("verify after the crash exited %d: %s", code, out.String())
	}
}
