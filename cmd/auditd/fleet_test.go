package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
)

// fleetUpstream is an HTTP upstream that logs when each request reached it
// and answers 429 with Retry-After to the next request when told.
type fleetUpstream struct {
	*httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
	paths    []string
	refuse   atomic.Bool
	refused  time.Time // when it answered 429
}

func startFleetUpstream(t *testing.T) *fleetUpstream {
	u := &fleetUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		u.mu.Lock()
		u.arrivals = append(u.arrivals, now)
		u.paths = append(u.paths, r.URL.Path)
		u.mu.Unlock()
		if u.refuse.CompareAndSwap(true, false) {
			u.mu.Lock()
			u.refused = now
			u.mu.Unlock()
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *fleetUpstream) log() []time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.arrivals)
}

// maxInWindow returns the most arrivals in any span [t, t+window).
func maxInWindow(at []time.Time, window time.Duration) int {
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	most, _ := busiestWindow(at, window)
	return most
}

// busiestWindow returns the most of the sorted times at in any span
// [t, t+window), and the index of the first of them.
func busiestWindow(at []time.Time, window time.Duration) (most, first int) {
	j := 0
	for i := range at {
		for at[i].Sub(at[j]) >= window {
			j++
		}
		if i-j+1 > most {
			most, first = i-j+1, j
		}
	}
	return most, first
}

// fleetLoad sends requests through every node's proxy route, workers per
// node, until stop is closed, counting statuses per node.
func fleetLoad(t *testing.T, nodes []*child, runs []string, token string, workers int, stop <-chan struct{}) (wait func() []map[int]int) {
	return fleetLoadWithin(t, nodes, runs, token, "", workers, stop)
}

// fleetLoadWithin is fleetLoad with every request's Auditd-Deadline set to
// deadline (none when empty).
func fleetLoadWithin(t *testing.T, nodes []*child, runs []string, token, deadline string, workers int, stop <-chan struct{}) (wait func() []map[int]int) {
	counts := make([]map[int]int, len(nodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for n, node := range nodes {
		counts[n] = map[int]int{}
		for w := range workers {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest("GET", fmt.Sprintf("%s/proxy/up/n%d/w%d/r%d.json", node.url, n+1, w, i), nil)
					req.Header.Set("Proxy-Authorization", "Bearer "+token)
					req.Header.Set("Auditd-Run", runs[n])
					if deadline != "" {
						req.Header.Set("Auditd-Deadline", deadline)
					}
					resp, err := client.Do(req)
					code := -1
					if err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
						if code == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
							t.Errorf("node %d: 503 without Retry-After", n)
						}
					}
					mu.Lock()
					counts[n][code]++
					mu.Unlock()
					if code != http.StatusOK {
						time.Sleep(50 * time.Millisecond) // as a client honouring a refusal would, roughly
					}
				}
			})
		}
	}
	return func() []map[int]int {
		wg.Wait()
		return counts
	}
}

// fleetEvents reads a stopped node's ledger: its fleet events and the
// times of its throttle records.
func fleetEvents(t *testing.T, data string) (fleetEv []auditd.Event, throttles []time.Time) {
	scanLedger(t, data, func(e *auditd.Event) {
		switch e.Type {
		case auditd.EventFleetReserved, auditd.EventFleetPaused, auditd.EventFleetCutOff, auditd.EventFleetRejoined, auditd.EventFleetLearned:
			fleetEv = append(fleetEv, *e)
		case auditd.EventThrottle:
			throttles = append(throttles, e.Time)
		}
	})
	return fleetEv, throttles
}

// scanLedger calls fn with every event of a stopped node's ledger, in order.
func scanLedger(t *testing.T, data string, fn func(e *auditd.Event)) {
	t.Helper()
	db, err := openDB(data, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ledger.NewReader(db).Scan(1, 0, func(e *auditd.Event) error {
		fn(e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// fleetNodes are three auditd nodes of a fleet test, each with its data
// directory and a proxy run open.
type fleetNodes struct {
	nodes       []*child
	datas, runs []string
	dir         string
	config      string // node 1's sources (every node's, under startFleetNodes)
}

// startFleetNodes starts three nodes named node1 to node3 sharing source
// "up" at upstream, told limit a second, each with the fleet flags flags(i)
// gives (--fleet-etcd and the like), and opens a proxy run on each.
func startFleetNodes(t *testing.T, upstream string, limit int, token string, flags func(i int) []string) *fleetNodes {
	t.Helper()
	return startFleetNodesAt(t, func(int) string { return upstream }, limit, token, flags)
}

// startFleetNodesAt is startFleetNodes with node i's source "up" at
// upstream(i), so that the upstream can tell the nodes' requests apart;
// the key, and so the budget, is the same. config is node 1's.
func startFleetNodesAt(t *testing.T, upstream func(i int) string, limit int, token string, flags func(i int) []string) *fleetNodes {
	t.Helper()
	return startFleetNodesWith(t, token, func(i int) string {
		return fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    limit: %d\n    window: 1s\n    concurrency: 16\n", upstream(i), limit)
	}, flags)
}

// startFleetNodesWith starts three nodes named node1 to node3, node i
// with the sources file sources(i) and the fleet flags flags(i), and opens
// a proxy run on each. config is node 1's.
func startFleetNodesWith(t *testing.T, token string, sources func(i int) string, flags func(i int) []string) *fleetNodes {
	t.Helper()
	f := &fleetNodes{dir: t.TempDir()}
	for i := range 3 {
		name := fmt.Sprintf("node%d", i+1)
		config := writeConfig(t, t.TempDir(), sources(i))
		if i == 0 {
			f.config = config
		}
		data := filepath.Join(f.dir, name)
		n := startServe(t, data, config, token, append(flags(i), "--node", name)...)
		f.nodes = append(f.nodes, n)
		f.datas = append(f.datas, data)
		f.runs = append(f.runs, n.proxyRun(t, token))
	}
	return f
}

// stopGracefully stops each node with SIGTERM and fails the test if one
// does not shut down cleanly.
func stopGracefully(t *testing.T, nodes ...*child) {
	t.Helper()
	for _, n := range nodes {
		n.cmd.Process.Signal(syscall.SIGTERM)
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("graceful shutdown: %v\n%s", err, n.logs)
		}
	}
}
