package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestSimServesScenarioUntilCancelled runs `auditd sim` on the demo
// scenario: it prints one line per upstream, writes the same URLs as JSON,
// serves them, and exits 0 with per-upstream counts when the context ends.
func TestSimServesScenarioUntilCancelled(t *testing.T) {
	urlsOut := filepath.Join(t.TempDir(), "urls.json")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	var stderr syncBuffer
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"sim", "--scenario", "../../testdata/scenarios/demo.yaml", "--urls-out", urlsOut}, outW, &stderr)
		outW.Close()
	}()

	lines := bufio.NewScanner(outR)
	printed := make(map[string]string)
	var order []string
	for len(order) < 8 && lines.Scan() {
		name, u, ok := strings.Cut(lines.Text(), " ")
		if !ok {
			t.Fatalf("line %q is not 'name base_url'", lines.Text())
		}
		printed[name] = u
		order = append(order, name)
	}
	if len(order) != 8 || order[0] != "harris-county" || order[7] != "county-geocoder" {
		t.Fatalf("printed %v, want the demo's 8 upstreams in scenario order (stderr: %s)", order, stderr.String())
	}

	data, err := os.ReadFile(urlsOut)
	if err != nil {
		t.Fatal(err)
	}
	var written map[string]string
	if err := json.Unmarshal(data, &written); err != nil {
		t.Fatalf("urls file: %v", err)
	}
	for name, u := range printed {
		if written[name] != u {
			t.Errorf("%s: file says %q, stdout %q", name, written[name], u)
		}
	}

	resp, err := http.Get(printed["travis-county"] + "?resultRecordCount=10")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("travis-county: %d, want 200", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, printed["county-geocoder"], nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("county-geocoder without its key: %d, want 401", resp.StatusCode)
	}

	cancel()
	if code := <-exit; code != 0 {
		t.Fatalf("exit %d, want 0 (stderr: %s)", code, stderr.String())
	}
	for _, want := range []string{"travis-county received=1 by_status=map[200:1]", "county-geocoder received=1 by_status=map[401:1]"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr.String())
		}
	}
}

func TestSimRejectsBadInvocations(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("upstreams:\n  - name: a\n    limit: {shape: leaky, requests: 1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		args   []string
		stderr string
	}{
		{"NoScenario", []string{"sim"}, "usage: auditd sim"},
		{"UnknownFlag", []string{"sim", "--scenarios", "x"}, "flag provided but not defined"},
		{"MissingFile", []string{"sim", "--scenario", "no-such.yaml"}, "no-such.yaml"},
		{"InvalidScenario", []string{"sim", "--scenario", bad}, "line 3: upstreams[0].limit.shape"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr syncBuffer
			if code := run(context.Background(), tt.args, &stdout, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.stderr)
			}
		})
	}
}

// syncBuffer is a strings.Builder safe for the command's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
