package fetch_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// TestLoopLearnsConcurrency: a source configured for 4 requests at once
// against a server that refuses beyond 2 in flight (503 and Retry-After,
// each admitted request taking 300 ms of the fake clock). The loop hands
// each response's count in flight to the registry, which cuts the source
// to 2 (registry.changed, cause concurrency), and sets the limiter's slots
// to that; the run ends with every item fetched.
func TestLoopLearnsConcurrency(t *testing.T) {
	h := newHarness(t, "name: none\nseed: 1\nupstreams:\n  - name: unused\n")
	srv := newInFlightServer(t, h.clk, 2)
	h.urls["conc"] = srv.URL
	h.source(t, auditd.Source{ID: "conc", Limit: 20, Window: auditd.Duration(time.Second), Concurrency: 4}, "conc")

	var items []auditd.Item
	for i := range 60 {
		k := string(rune('a'+i/26)) + string(rune('a'+i%26))
		items = append(items, auditd.Item{Key: k, SourceID: "conc", Path: "/x?k=" + k})
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "in flight", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	end := h.finish(t, v.ID)
	if end.Counts.Succeeded != len(items) {
		t.Fatalf("run ended %s with %+v, want every item fetched", end.Status, end.Counts)
	}
	st, err := h.reg.State("conc")
	if err != nil {
		t.Fatal(err)
	}
	slots, err := h.lim.Concurrency("conc")
	if err != nil {
		t.Fatal(err)
	}
	if st.Concurrency != 2 || slots != 2 {
		t.Fatalf("registry concurrency %d, limiter slots %d; want both cut to the server's 2", st.Concurrency, slots)
	}
	changes := 0
	for _, e := range h.events(t, v.ID) {
		if e.Type == auditd.EventRegistryChanged && e.Cause == registry.CauseConcurrency {
			changes++
		}
	}
	if changes == 0 {
		t.Fatal("no registry.changed of cause concurrency in the run")
	}
}

// TestLoopGrowsConcurrency: a source with no concurrency set starts at the
// limiter's default and is not capped there. Against a server that takes
// up to 8 requests at once (300 ms of the fake clock each) under a pace 4
// slots cannot meet, the run has workers enough for the slots learning
// adds, and ends with more slots than it started with, none past what the
// server takes.
func TestLoopGrowsConcurrency(t *testing.T) {
	h := newHarness(t, "name: none\nseed: 1\nupstreams:\n  - name: unused\n")
	srv := newInFlightServer(t, h.clk, 8)
	h.urls["wide"] = srv.URL
	h.source(t, auditd.Source{ID: "wide", Limit: 100, Window: auditd.Duration(time.Second)}, "wide")

	var items []auditd.Item
	for i := range 240 {
		k := string(rune('a'+i/26)) + string(rune('a'+i%26))
		items = append(items, auditd.Item{Key: k, SourceID: "wide", Path: "/x?k=" + k})
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "wide", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	end := h.finish(t, v.ID)
	if end.Counts.Succeeded != len(items) {
		t.Fatalf("run ended %s with %+v, want every item fetched", end.Status, end.Counts)
	}
	slots, err := h.lim.Concurrency("wide")
	if err != nil {
		t.Fatal(err)
	}
	most := srv.most()
	if slots <= limiter.DefaultConcurrency || slots > 8 || most <= limiter.DefaultConcurrency {
		t.Fatalf("slots %d at the end, at most %d in flight at the server; want past the default %d and at most the server's 8",
			slots, most, limiter.DefaultConcurrency)
	}
}

// inFlightServer takes up to limit requests at once, each 300 ms of the
// fake clock, and refuses any beyond with 503 and Retry-After.
type inFlightServer struct {
	*httptest.Server
	mu                 sync.Mutex
	inFlight, mostSeen int
}

func newInFlightServer(t *testing.T, clk *clock.Fake, limit int) *inFlightServer {
	s := &inFlightServer{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		if s.inFlight >= limit {
			s.mu.Unlock()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		s.inFlight++
		s.mostSeen = max(s.mostSeen, s.inFlight)
		s.mu.Unlock()
		defer func() { s.mu.Lock(); s.inFlight--; s.mu.Unlock() }()
		clock.Sleep(r.Context(), clk, 300*time.Millisecond)
		w.Write([]byte("{}"))
	}))
	t.Cleanup(s.Close)
	return s
}

// most is the most requests the server held at once.
func (s *inFlightServer) most() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mostSeen
}
