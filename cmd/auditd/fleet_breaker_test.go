package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/etcdtest"
)

// outageUpstream answers 500 while down and 200 otherwise, logging when
// each request arrived and from which node (the first path segment).
type outageUpstream struct {
	*httptest.Server
	down     atomic.Bool
	mu       sync.Mutex
	arrivals []nodeArrival
}

type nodeArrival struct {
	node string
	at   time.Time
	down bool
}

func startOutageUpstream(t *testing.T) *outageUpstream {
	u := &outageUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		node, _, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
		down := u.down.Load()
		u.mu.Lock()
		u.arrivals = append(u.arrivals, nodeArrival{node, time.Now(), down})
		u.mu.Unlock()
		if down {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

// TestFleetSharesTheBreaker: three nodes in front of one upstream that
// fails for 5 s. The first node whose breaker opens pauses the fleet until
// its probe; the other nodes send nothing more while the upstream is down
// (their requests wait, or are shed at their deadline), the opener sends
// only its half-open probes, and every node is served again once it is back.
func TestFleetSharesTheBreaker(t *testing.T) {
	if testing.Short() {
		t.Skip("three auditd nodes for 16 s")
	}
	const token = "fleet-admin-token-0123456789abcdef"
	up := startOutageUpstream(t)
	cluster := etcdtest.Start(t, 1)
	f := startFleetNodesWith(t, token, func(i int) string {
		return fmt.Sprintf("sources:\n  - id: up\n    base_url: %s/node%d\n    limit: 20\n    window: 1s\n    concurrency: 4\n    breaker: {threshold: 3, cooldown: 2s}\n", up.URL, i+1)
	}, func(int) []string { return []string{"--fleet-etcd", cluster.Endpoints()[0]} })
	nodes, runs, datas := f.nodes, f.runs, f.datas
	stop := make(chan struct{})
	wait := fleetLoadWithin(t, nodes, runs, token, "3", 2, stop)
	time.Sleep(3 * time.Second)
	up.down.Store(true)
	downAt := time.Now()
	time.Sleep(5 * time.Second)
	up.down.Store(false)
	upAt := time.Now()
	time.Sleep(8 * time.Second) // the probe after a 4 s cooldown, then the others' grace
	close(stop)
	wait()
	stopGracefully(t, nodes...)

	// The breaker pauses each node recorded, with the node that opened it.
	type breakerPause struct {
		at, until time.Time
		by        string
	}
	var first *breakerPause
	seen := map[string]bool{} // nodes that recorded a breaker's pause
	openers := map[string]bool{}
	for i, data := range datas {
		events, _ := fleetEvents(t, data)
		for _, e := range events {
			var d fleetDetail
			if e.Type != auditd.EventFleetPaused || json.Unmarshal([]byte(e.Detail), &d) != nil || d.Breaker == "" {
				continue
			}
			seen[fmt.Sprintf("node%d", i+1)], openers[d.Breaker] = true, true
			if first == nil || e.Time.Before(first.at) {
				first = &breakerPause{at: e.Time, until: *d.Until, by: d.Breaker}
			}
		}
	}
	if first == nil {
		t.Fatal("no node recorded a breaker's pause")
	}
	if len(seen) != 3 {
		t.Errorf("nodes that recorded a breaker's pause: %v, want all three", seen)
	}
	t.Logf("down at +0s; the first breaker's pause recorded at +%v by %s's breaker, until +%v; openers %v",
		first.at.Sub(downAt).Round(time.Millisecond), first.by, first.until.Sub(downAt).Round(time.Millisecond), openers)

	// While the upstream is down, once the pause has reached every node,
	// only the openers' probes reach it.
	settled := first.at.Add(300 * time.Millisecond)
	up.mu.Lock()
	arrivals := append([]nodeArrival(nil), up.arrivals...)
	up.mu.Unlock()
	sent, after := map[string]int{}, map[string]int{}
	firstAfter := map[string]time.Duration{}
	for _, a := range arrivals {
		switch {
		case a.at.After(settled) && a.at.Before(upAt):
			sent[a.node]++
		case a.at.After(upAt):
			if after[a.node] == 0 {
				firstAfter[a.node] = a.at.Sub(downAt).Round(time.Millisecond)
			}
			after[a.node]++
		}
	}
	t.Logf("the first request of each node after the recovery (+%v): %v", upAt.Sub(downAt).Round(time.Millisecond), firstAfter)
	t.Logf("requests that reached the upstream between the pause and its recovery (%v): %v; after it: %v", upAt.Sub(settled).Round(time.Millisecond), sent, after)
	// Cooldowns of 2 s, then 4 s: a probe for each, and one in flight.
	for node, n := range sent {
		if !openers[node] {
			t.Errorf("%s sent %d requests while another node's breaker held the fleet, want none", node, n)
		} else if n > 3 {
			t.Errorf("%s, whose breaker opened, sent %d requests while the upstream was down, want only its probes (at most 3)", node, n)
		}
	}
	for _, name := range []string{"node1", "node2", "node3"} {
		if after[name] == 0 {
			t.Errorf("%s sent nothing after the upstream came back", name)
		}
	}
}
