package fetch_test

import (
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
)

// A source under serve_stale leaves its outage: while the breaker is open
// every request is answered from the copy at once (one attempt, no
// retries with backoff against a source known to be down), and once the
// upstream answers again the next request past the cooldown is the probe,
// whose fresh answer closes the breaker. The proxied path used to read the
// breaker's state and serve the copy without asking the gates, so the
// breaker never half-opened and the copies never ended.
func TestProxyStaleBreakerCloses(t *testing.T) {
	var down atomic.Bool
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		if down.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second),
		Breaker: auditd.BreakerPolicy{Threshold: 1, Cooldown: auditd.Duration(50 * time.Millisecond)},
		Proxy:   auditd.ProxyPolicy{ServeStale: true}})
	first := e.proxyRun("")
	if r := e.send("GET", first, "/proxy/s/doc", nil, nil); r.status != 200 {
		t.Fatalf("first fetch: %d", r.status)
	}
	e.finish(first)

	down.Store(true)
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/s/doc", nil, nil)
	if r.status != 200 || r.header.Get("Auditd-Stale") != "true" || r.header.Get("Auditd-Attempts") != "1" {
		t.Fatalf("first request of the outage: %d stale %q attempts %q, want the copy after one attempt",
			r.status, r.header.Get("Auditd-Stale"), r.header.Get("Auditd-Attempts"))
	}
	down.Store(false)
	fresh := 0
	for i := 0; i < 400 && fresh == 0; i++ {
		r := e.send("GET", id, "/proxy/s/doc", nil, nil)
		switch {
		case r.status == 200 && r.header.Get("Auditd-Stale") == "":
			fresh++
		case r.status != 200:
			t.Fatalf("request %d: %d %s", i, r.status, r.body)
		default:
			time.Sleep(10 * time.Millisecond)
		}
	}
	if fresh == 0 {
		t.Fatal("the upstream is back but every answer is still the copy: the breaker never half-opened")
	}
	e.finish(id) // once the requests in flight have ended: the client has a fresh body before its outcome is observed
	if st, _ := e.lim.State("s"); st.Breaker != limiter.BreakerClosed {
		t.Fatalf("after a fresh answer the breaker is %s, want closed", st.Breaker)
	}
	var moves []string
	for _, ev := range e.events(id) {
		if ev.Type == auditd.EventBreaker {
			moves = append(moves, ev.From+">"+ev.To)
		}
	}
	if want := "[closed>open open>half_open half_open>closed]"; fmt.Sprint(moves) != want {
		t.Errorf("breaker events %v, want %s", moves, want)
	}
	e.reconcile(id)
}

// A copy is served as it was fetched: with the content type (and content
// encoding) of the response that was staged, not one sniffed from the body
// (a JSON answer came back text/plain).
func TestProxyStaleKeepsHeaders(t *testing.T) {
	var down atomic.Bool
	const ct = "application/vnd.geo+json; charset=utf-8"
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		if down.Load() {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", ct)
		fmt.Fprint(w, `{"type":"FeatureCollection","features":[]}`)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second),
		Breaker: auditd.BreakerPolicy{Threshold: 1}, Proxy: auditd.ProxyPolicy{ServeStale: true}})
	first := e.proxyRun("")
	fresh := e.send("GET", first, "/proxy/s/doc", nil, nil)
	if fresh.status != 200 || fresh.header.Get("Content-Type") != ct {
		t.Fatalf("fresh: %d %q", fresh.status, fresh.header.Get("Content-Type"))
	}
	e.finish(first)
	down.Store(true)
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/s/doc", nil, nil)
	if r.status != 200 || r.header.Get("Auditd-Stale") != "true" || string(r.body) != string(fresh.body) {
		t.Fatalf("copy: %d stale %q %q", r.status, r.header.Get("Auditd-Stale"), r.body)
	}
	if got := r.header.Get("Content-Type"); got != ct {
		t.Errorf("the copy is served as %q, the response it was staged from was %q", got, ct)
	}
	e.finish(id)
	e.reconcile(id)
}
