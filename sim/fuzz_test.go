package sim_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

// FuzzParseScenario: ParseScenario never panics; what it accepts is a
// *ScenarioError-free scenario that New takes unchanged (defaults are
// already filled, so checking again is a no-op), and every upstream of it
// answers a request without panicking.
func FuzzParseScenario(f *testing.F) {
	paths, _ := filepath.Glob(filepath.Join(scenarioDir, "*.yaml"))
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("upstreams: [{name: a, limit: {shape: leaky_bucket, requests: 1}}]"))
	f.Add([]byte("upstreams:\n  - &a {name: a}\n  - *a\n"))
	f.Add([]byte("groups: [{name: g, limit: {shape: none}}]\nupstreams: [{name: a, group: g}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		sc, err := sim.ParseScenario(data)
		if err != nil {
			var se *sim.ScenarioError
			if !errors.As(err, &se) {
				t.Fatalf("error %v is not a *ScenarioError", err)
			}
			return
		}
		parsed, err := sim.ParseScenario(data)
		if err != nil {
			t.Fatalf("second parse of the same input failed: %v", err)
		}
		s, err := sim.New(sc, clock.NewFake(t0))
		if err != nil {
			t.Fatalf("New rejects what ParseScenario accepted: %v", err)
		}
		if !reflect.DeepEqual(parsed, sc) {
			t.Fatalf("New changed a parsed scenario:\n%+v\n%+v", parsed, sc)
		}
		// Closed first, so latency ends at once (the request is dropped).
		s.Close(context.Background())
		for _, name := range s.Upstreams() {
			serveOnce(t, s.Handler(name))
		}
	})
}

// serveOnce sends one small request straight to h; an aborted response
// (a dropped connection) is fine, any other panic is not.
func serveOnce(t *testing.T, h http.Handler) {
	defer func() {
		if v := recover(); v != nil && v != http.ErrAbortHandler {
			t.Fatalf("handler panicked: %v", v)
		}
	}()
	req := httptest.NewRequest(http.MethodPost, "/?resultRecordCount=3&count=3", strings.NewReader(`{"rows":3}`))
	h.ServeHTTP(httptest.NewRecorder(), req)
}
