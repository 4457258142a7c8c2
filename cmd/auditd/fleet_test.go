package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/etcdtest"
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
	most, j := 0, 0
	for i := range at {
		for at[i].Sub(at[j]) >= window {
			j++
		}
		most = max(most, i-j+1)
	}
	return most
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
	db, err := openDB(data, true)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := ledger.NewReader(db).Scan(1, 0, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventFleetReserved, auditd.EventFleetPaused, auditd.EventFleetCutOff, auditd.EventFleetRejoined:
			fleetEv = append(fleetEv, *e)
		case auditd.EventThrottle:
			throttles = append(throttles, e.Time)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return fleetEv, throttles
}

// Three auditd nodes share one source's budget through a three-member etcd
// cluster: requests through every node's proxy route never put more than
// the limit into any window of the upstream's log, and the fleet uses
// most of it; a node cut from etcd stops within its block, records the
// cut and its rejoin; a 429 one node sees pauses every node.
func TestFleetSharesOneBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members and three auditd nodes")
	}
	const limit, token = 20, "fleet-admin-token-0123456789abcdef"
	// On a loaded machine a dispatch record's commit holds a request back
	// by tens of milliseconds, and a batch releases two at once: the slots
	// are spaced for that lag, which costs the fleet lag/window of the rate.
	const fleetLag = 100 * time.Millisecond
	cluster := etcdtest.Start(t, 3)
	eps := cluster.Endpoints()
	cut := etcdtest.StartProxy(t, eps[2]) // node 3 reaches etcd only through it
	up := startFleetUpstream(t)
	f := startFleetNodes(t, up.URL, limit, token, func(i int) []string {
		ep := eps[i]
		if i == 2 {
			ep = cut.URL()
		}
		return []string{"--fleet-etcd", ep, "--fleet-lag", fleetLag.String()}
	})
	nodes, datas, runs := f.nodes, f.datas, f.runs

	stop := make(chan struct{})
	wait := fleetLoad(t, nodes, runs, token, 6, stop)
	start := time.Now()
	time.Sleep(8 * time.Second) // steady: every node busy
	steady := up.log()
	cut.Cut()
	cutAt := time.Now()
	time.Sleep(5 * time.Second) // longer than the blocks it holds
	// The metrics show the cut on node 3 and only there.
	for i, n := range nodes {
		m := parseMetrics(t, scrape(t, n.url+"/metrics"))
		series := fmt.Sprintf(`{key="up",node="node%d"}`, i+1)
		want := 0.0
		if i == 2 {
			want = 1
		}
		if got, ok := m["auditd_fleet_cut_off"+series]; !ok || got != want {
			t.Errorf("node %d: auditd_fleet_cut_off %v (present %v) during the cut, want %v", i+1, got, ok, want)
		}
		if m["auditd_fleet_slots_used_total"+series] == 0 || m["auditd_fleet_reservations_total"+series] == 0 {
			t.Errorf("node %d: no slots used or reservations in its metrics after 13 s of load", i+1)
		}
		t.Logf("node %d metrics: reserved %v, used %v, wasted %v, held %v, last reservation %v s", i+1,
			m["auditd_fleet_slots_reserved_total"+series], m["auditd_fleet_slots_used_total"+series],
			m["auditd_fleet_slots_wasted_total"+series], m["auditd_fleet_slots_held"+series], m["auditd_fleet_reservation_seconds"+series])
	}
	// Node 3, out of slots and cut off, answers a request it cannot admit
	// by its deadline with 503 and a Retry-After, end to end.
	req, _ := http.NewRequest("GET", nodes[2].url+"/proxy/up/n3/cut.json", nil)
	req.Header.Set("Proxy-Authorization", "Bearer "+token)
	req.Header.Set("Auditd-Run", runs[2])
	req.Header.Set("Auditd-Deadline", "1")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Errorf("node 3 during the cut: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Errorf("node 3 during the cut answered %d, Retry-After %q, want 503 with one: %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
		}
		t.Logf("node 3 during the cut: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	cut.Heal()
	healAt := time.Now()
	time.Sleep(3 * time.Second)
	up.refuse.Store(true)
	time.Sleep(5 * time.Second)
	close(stop)
	counts := wait()
	stopGracefully(t, nodes...)

	all := up.log()
	most := maxInWindow(slices.Clone(all), time.Second)
	if most > limit {
		t.Errorf("the upstream saw %d requests in one second: over the fleet's limit of %d", most, limit)
		up.mu.Lock()
		for i, at := range up.arrivals {
			t.Logf("%s %s", at.Sub(start), up.paths[i])
		}
		up.mu.Unlock()
		t.Logf("cut at %s, 429 at %s", cutAt.Sub(start), up.refused.Sub(start))
	}
	// Use: from the second second of steady load to its end.
	from, to := start.Add(2*time.Second), start.Add(8*time.Second)
	used := 0
	for _, at := range steady {
		if !at.Before(from) && at.Before(to) {
			used++
		}
	}
	share := float64(used) / (to.Sub(from).Seconds() * limit)
	t.Logf("statuses per node: %v; upstream: %d requests, at most %d in a second, use in steady load %.1f%% of the limit", counts, len(all), most, 100*share)
	// The guard (grace, skew and lag) costs 13% of this rate.
	if share < 0.82 {
		t.Errorf("the fleet used %.1f%% of the limit in steady load, want at least 82%%", 100*share)
	}

	var pausedAt [3]time.Time
	var throttled time.Time
	for i, data := range datas {
		evs, thr := fleetEvents(t, data)
		if len(thr) > 0 && (throttled.IsZero() || thr[0].Before(throttled)) {
			throttled = thr[0]
		}
		kinds := map[auditd.EventType]int{}
		for _, e := range evs {
			kinds[e.Type]++
			var d fleetDetail
			if err := json.Unmarshal([]byte(e.Detail), &d); err != nil || d.Node != fmt.Sprintf("node%d", i+1) {
				t.Errorf("node %d: fleet event detail %q: %v", i+1, e.Detail, err)
			}
			if e.Type == auditd.EventFleetReserved && d.Revision == 0 {
				t.Errorf("node %d: a grant without its etcd revision: %+v", i+1, e)
			}
			if e.Type == auditd.EventFleetPaused && d.Revision > 0 && pausedAt[i].IsZero() && e.Time.After(cutAt.Add(5*time.Second)) {
				pausedAt[i] = e.Time
			}
			if e.Type == auditd.EventFleetCutOff && i != 2 {
				t.Errorf("node %d recorded a cut-off it never had: %+v", i+1, e)
			}
		}
		t.Logf("node %d fleet events: %v", i+1, kinds)
		if kinds[auditd.EventFleetReserved] == 0 {
			t.Errorf("node %d recorded no grant", i+1)
		}
		if i == 2 && (kinds[auditd.EventFleetCutOff] == 0 || kinds[auditd.EventFleetRejoined] == 0) {
			t.Errorf("node 3 was cut off and healed, but recorded cut-offs %d, rejoins %d", kinds[auditd.EventFleetCutOff], kinds[auditd.EventFleetRejoined])
		}
	}
	// Node 3 stops within what it holds: after the end of the last block
	// it was granted before the heal (the lag allowed, and a slot's grace),
	// the upstream hears nothing from it until the heal.
	var held time.Time
	evs3, _ := fleetEvents(t, datas[2])
	for _, e := range evs3 {
		var d fleetDetail
		json.Unmarshal([]byte(e.Detail), &d)
		if e.Type == auditd.EventFleetReserved && e.Time.Before(healAt) && d.First != nil {
			iv, _ := time.ParseDuration(d.Interval)
			held = later(held, d.First.Add(time.Duration(d.Count)*iv))
		}
	}
	up.mu.Lock()
	late := 0
	for i, at := range up.arrivals {
		if strings.HasPrefix(up.paths[i], "/n3/") && at.After(held.Add(100*time.Millisecond)) && at.Before(healAt) {
			late++
		}
	}
	up.mu.Unlock()
	t.Logf("node 3 held slots until %v into its 5s cut", held.Sub(cutAt))
	if late > 0 {
		t.Errorf("node 3, cut off from etcd, sent %d requests past the slots it held", late)
	}
	if throttled.IsZero() {
		t.Fatal("no node recorded the 429")
	}
	var last time.Time
	for i, at := range pausedAt {
		if at.IsZero() {
			t.Errorf("node %d recorded no pause after the 429", i+1)
			continue
		}
		if at.After(last) {
			last = at
		}
	}
	if !last.IsZero() {
		t.Logf("429 recorded at %s; last node's pause record %v later", throttled.Format(time.RFC3339Nano), last.Sub(throttled))
	}
	// Retry-After: 2. Past the requests already on their way, no node
	// sends until it ends.
	up.mu.Lock()
	inPause := 0
	for _, at := range up.arrivals {
		if at.After(up.refused.Add(200*time.Millisecond)) && at.Before(up.refused.Add(2*time.Second)) {
			inPause++
		}
	}
	up.mu.Unlock()
	if inPause > 0 {
		t.Errorf("the fleet sent %d requests inside the pause a 429 asked for", inPause)
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
	dir, config string
}

// startFleetNodes starts three nodes named node1 to node3 sharing source
// "up" at upstream, told limit a second, each with the fleet flags flags(i)
// gives (--fleet-etcd and the like), and opens a proxy run on each.
func startFleetNodes(t *testing.T, upstream string, limit int, token string, flags func(i int) []string) *fleetNodes {
	t.Helper()
	f := &fleetNodes{dir: t.TempDir()}
	f.config = writeConfig(t, f.dir, fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    limit: %d\n    window: 1s\n    concurrency: 16\n", upstream, limit))
	for i := range 3 {
		data := filepath.Join(f.dir, fmt.Sprintf("node%d", i+1))
		n := startServe(t, data, f.config, token, append(flags(i), "--node", fmt.Sprintf("node%d", i+1))...)
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
