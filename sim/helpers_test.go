package sim_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

// t0 is a Thursday, which the HTTP-date assertions rely on.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fixture is a simulator on a fake clock with one httptest server per upstream.
type fixture struct {
	tb     testing.TB
	sim    *sim.Sim
	clk    *clock.Fake
	urls   map[string]string
	client *http.Client
}

// mustParse parses a scenario or fails the test.
func mustParse(tb testing.TB, doc string) *sim.Scenario {
	tb.Helper()
	sc, err := sim.ParseScenario([]byte(doc))
	if err != nil {
		tb.Fatalf("parse scenario: %v", err)
	}
	return sc
}

// mustServe starts sc on a fake clock at t0, each upstream on its own
// httptest server, all torn down when the test ends.
func mustServe(tb testing.TB, sc *sim.Scenario) *fixture {
	tb.Helper()
	clk := clock.NewFake(t0)
	s, err := sim.New(sc, clk)
	if err != nil {
		tb.Fatalf("new sim: %v", err)
	}
	f := &fixture{tb: tb, sim: s, clk: clk, urls: make(map[string]string), client: &http.Client{}}
	for _, name := range s.Upstreams() {
		srv := httptest.NewServer(s.Handler(name))
		tb.Cleanup(srv.Close)
		f.urls[name] = srv.URL + s.Path(name)
	}
	// Cleanups run last-in first-out: the sim closes (ending latency waits)
	// before the servers wait for their handlers.
	tb.Cleanup(func() { s.Close(context.Background()) })
	tb.Cleanup(f.client.CloseIdleConnections)
	return f
}

// response is what a test looks at.
type response struct {
	status int
	header http.Header
	body   string
}

// do sends a request and fails the test on a transport error.
func (f *fixture) do(method, name, query, body string) response {
	f.tb.Helper()
	resp, err := f.try(method, name, query, body)
	if err != nil {
		f.tb.Fatalf("%s %s: %v", method, name, err)
	}
	return resp
}

// get is do for a GET without a body.
func (f *fixture) get(name, query string) response {
	f.tb.Helper()
	return f.do(http.MethodGet, name, query, "")
}

func (f *fixture) try(method, name, query, body string) (response, error) {
	u, ok := f.urls[name]
	if !ok {
		f.tb.Fatalf("no upstream %q", name)
	}
	if query != "" {
		u += "?" + query
	}
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		return response{}, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: string(b)}, nil
}

// at moves the fake clock to offset d after the start.
func (f *fixture) at(d time.Duration) { f.clk.Set(t0.Add(d)) }

// scenarioDir holds the shipped scenario files.
const scenarioDir = "../testdata/scenarios"

// mustLoad loads a shipped scenario file or fails the test.
func mustLoad(tb testing.TB, file string) *sim.Scenario {
	tb.Helper()
	sc, err := sim.LoadScenario(scenarioDir + "/" + file)
	if err != nil {
		tb.Fatalf("load %s: %v", file, err)
	}
	return sc
}
