package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The service's /metrics, after a run against a simulator that refuses one
// source and has another down: promtool accepts it; the per-source series
// moved as the run did (refusals counted, a breaker opened, the learned
// pace and the in-flight gauges there); the lifecycle log has a line for each
// thing an operator alerts on, and neither holds a secret.
func TestMetricsAndLogs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the long fleet tests
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool not installed (Debian's prometheus package): .ci/run must install it")
		}
		t.Log("promtool not installed: the format check is skipped")
	}
	const secretKey, secretQuery = "hdr-secret-5d1c0a77", "qry-secret-77a0c1d5"
	s, urls := startSim(t, `
name: telemetry
seed: 1
upstreams:
  - name: limited
    path: /q
    limit: {shape: fixed_window, requests: 3, window: 2s}
    reject: {status: 429, retry_after: delta}
    required_header: {name: X-Api-Key, value: `+secretKey+`}
  - name: down
    path: /q
    outages:
      - {from: 0s, to: 24h, status: 502}
`)
	dir := t.TempDir()
	config := filepath.Join(dir, "sources.yaml")
	cfg := fmt.Sprintf(`sources:
  - id: limited
    base_url: %s
    limit: 20
    window: 1s
    headers: {X-Api-Key: %s}
    secret_query: [key]
  - id: down
    base_url: %s
    max_attempts: 2
    breaker: {threshold: 2, cooldown: 1s}
`, urls["limited"], secretKey, urls["down"])
	if err := os.WriteFile(config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "telemetry-test-admin-token-0123456789"
	c := startServe(t, filepath.Join(dir, "data"), config, token)

	var items []map[string]any
	for i := range 12 {
		items = append(items, map[string]any{"key": fmt.Sprintf("l%02d", i), "source": "limited", "path": fmt.Sprintf("/q?n=%d&key=%s", i, secretQuery)})
	}
	for i := range 3 {
		items = append(items, map[string]any{"key": fmt.Sprintf("d%02d", i), "source": "down", "path": fmt.Sprintf("/q?n=%d", i)})
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := c.call(t, "POST", "/v1/runs", token, map[string]any{"name": "telemetry", "items": items}, &created); code != http.StatusCreated {
		t.Fatalf("create run: %d", code)
	}
	var done struct {
		Status string `json:"status"`
	}
	c.awaitRun(t, created.ID, token, 2*time.Minute, &done)

	// The run's end is logged once its reconciliation is read: give it a
	// moment before reading what the service said.
	time.Sleep(500 * time.Millisecond)
	body := scrape(t, c.url+"/metrics")
	if promtool != "" {
		cmd := exec.Command(promtool, "check", "metrics")
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("promtool check metrics: %v\n%s", err, out)
		}
	}
	series := parseMetrics(t, body)
	for _, want := range []struct {
		series  string
		atLeast float64
	}{
		{`auditd_throttles_total{source="limited",status="429"}`, 1},
		{`auditd_responses_total{class="429",source="limited"}`, 1},
		{`auditd_responses_total{class="2xx",source="limited"}`, 12},
		{`auditd_responses_total{class="5xx",source="down"}`, 2},
		{`auditd_breaker_transitions_total{source="down",to="open"}`, 1},
		{`auditd_items_total{outcome="succeeded",source="limited"}`, 12},
		{`auditd_items_total{outcome="failed",source="down"}`, 3},
		{`auditd_dispatches_total{source="limited"}`, 13},
		{`auditd_runs_finished_total{status="partial"}`, 1},
		{`auditd_learned_limit_per_second{source="limited"}`, 0.01},
		{`auditd_ceiling_per_second{source="limited"}`, 20},
		{`auditd_ledger_commit_seconds_count`, 1},
		{`auditd_ledger_append_seconds_count`, 30},
		{`auditd_wait_seconds_count{gate="pause",source="limited"}`, 1},
	} {
		if got, ok := series[want.series]; !ok || got < want.atLeast {
			t.Errorf("%s = %v (present %v), want at least %v", want.series, got, ok, want.atLeast)
		}
	}
	for _, name := range []string{`auditd_breaker_state{source="down"}`, `auditd_in_flight_requests{source="limited"}`, `auditd_pause_remaining_seconds{source="limited"}`} {
		if _, ok := series[name]; !ok {
			t.Errorf("gauge %s missing", name)
		}
	}
	for k := range series {
		if strings.Contains(k, "item") && strings.Contains(k, "key=") || strings.Contains(k, "/q") {
			t.Errorf("series with an unbounded label: %s", k)
		}
	}
	if bytes.Contains(body, []byte(secretKey)) || bytes.Contains(body, []byte(secretQuery)) {
		t.Error("/metrics carries a secret")
	}

	// Stop the service, then read its log.
	c.cmd.Process.Signal(syscall.SIGINT)
	c.cmd.Wait()
	logs := c.logs.String()
	for _, line := range []string{
		`msg=serving `,
		`msg="run started" run=` + created.ID,
		`msg="learned limit changed" source=limited`,
		`msg=refused source=limited`,
		`msg="breaker open" source=down`,
		`msg="run finished" run=` + created.ID + ` status=partial`,
		`balanced=true`,
		`msg="shutting down"`,
		`msg=stopped`,
	} {
		if !strings.Contains(logs, line) {
			t.Errorf("the log has no %q:\n%s", line, logs)
		}
	}
	if strings.Contains(logs, secretKey) || strings.Contains(logs, secretQuery) {
		t.Errorf("the log carries a secret:\n%s", logs)
	}
	if n := strings.Count(logs, "msg=dispatch"); n > 0 {
		t.Errorf("%d lines per dispatch at the default level", n)
	}
	_ = s
}

func scrape(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", resp.StatusCode, err)
	}
	return body
}

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$`)

// parseMetrics reads the text exposition's samples into series -> value,
// labels as written (client_golang sorts them by name).
func parseMetrics(t *testing.T, body []byte) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("unreadable sample %q", line)
		}
		v, err := strconv.ParseFloat(m[2], 64)
		if err != nil {
			t.Fatalf("sample %q: %v", line, err)
		}
		out[m[1]] = v
	}
	return out
}
