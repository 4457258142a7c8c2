package main

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/internal/nginxtest"
)

// Three auditd nodes share one told limit through a three-member etcd
// cluster, in front of a real nginx (testdata/nginx/fleet.conf.tmpl):
// Python workers (requests and httpx) send through every node's proxy
// route and batch runs go on two nodes. nginx's own access log, read with
// a sliding window, never holds more than the limit in a second, and the
// fleet uses most of it; every grant recorded is disjoint from the others
// and every dispatch on record has a slot; a node cut from etcd stops
// within its block, records the cut and its rejoin; a 429 one node sees
// pauses every node.
func TestFleetSharesOneBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("starts nginx, three etcd members, three auditd nodes and 12 Python processes")
	}
	const limit, token = 20, "fleet-admin-token-0123456789abcdef"
	// On a loaded machine a dispatch record's commit holds a request back
	// by tens of milliseconds: the slots are spaced for serve's default lag
	// allowance, which costs the fleet lag/window of the rate, and a request
	// whose record commits later is not sent.
	const fleetLag = defaultFleetLag
	python(t)
	gw := nginxtest.Start(t, nginxtest.Config{Template: "fleet.conf.tmpl", Rate: limit, Burst: limit})
	cluster := etcdtest.Start(t, 3)
	eps := cluster.Endpoints()
	cut := etcdtest.StartProxy(t, eps[2]) // node 3 reaches etcd only through it
	f := startFleetNodesAt(t, func(i int) string { return fmt.Sprintf("%s/a/n%d", gw.URL, i+1) }, limit, token, func(i int) []string {
		ep := eps[i]
		if i == 2 {
			ep = cut.URL()
		}
		return []string{"--fleet-etcd", ep, "--fleet-lag", fleetLag.String()}
	})
	nodes, datas, runs := f.nodes, f.datas, f.runs

	stopFile := filepath.Join(t.TempDir(), "stop")
	var workers []*clients
	for i, n := range nodes {
		workers = append(workers, startClients(t, 4, 1_000_000, n.url, token, runs[i], "up", "", "--stop-file", stopFile))
	}
	start := time.Now()
	batches := []string{startBatch(t, nodes[0], token, "batch-n1", 30), startBatch(t, nodes[1], token, "batch-n2", 30)}
	time.Sleep(8 * time.Second) // steady: every node busy
	cut.Cut()
	cutAt := time.Now()
	time.Sleep(fleetCutFor(t)) // longer than the blocks it holds
	checkCutOffMetrics(t, nodes)
	// Node 3, out of slots and cut off, answers a request it cannot admit
	// by its deadline with 503 and a Retry-After, end to end.
	if code, h := proxyGet(t, nodes[2], token, runs[2], "/cut.json", "1"); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Errorf("node 3 during the cut answered %d, Retry-After %q, want 503 with one", code, h.Get("Retry-After"))
	}
	cut.Heal()
	healAt := time.Now()
	time.Sleep(3 * time.Second)
	// nginx answers this path 429 with Retry-After: 2. Its deadline is
	// shorter than the pause, so auditd does not retry it: the client gets
	// a 503 with Retry-After at the deadline.
	if code, h := proxyGet(t, nodes[0], token, runs[0], "/refuse/now.json", "1.5"); code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" {
		t.Errorf("the request nginx refuses came back %d, Retry-After %q, through node 1; want 503 with one", code, h.Get("Retry-After"))
	}
	time.Sleep(5 * time.Second)
	if err := os.WriteFile(stopFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	statuses := map[string]map[string]int{}
	for i, c := range workers {
		for _, r := range c.wait(t) {
			key := fmt.Sprintf("node%d %s", i+1, r.Lib)
			if statuses[key] == nil {
				statuses[key] = map[string]int{}
			}
			for code, n := range r.Statuses {
				statuses[key][code] += n
			}
			statuses[key]["broken"] += r.Errors
		}
	}
	for i, id := range batches {
		var run runCounts
		nodes[i].awaitRun(t, id, token, 60*time.Second, &run)
		if run.Status != string(auditd.RunSucceeded) || run.Counts.Dispatches < 30 {
			t.Errorf("node %d's batch run ended %s: %+v", i+1, run.Status, run.Counts)
		}
	}
	commits := commitLatency(t, nodes)
	stopGracefully(t, nodes...)
	gw.Stop(t) // every line logged

	all := fleetArrivals(t, gw)
	t.Logf("Python workers' statuses: %v; ledger commits per node: %s", statuses, commits)
	ledgers := readFleetLedgers(t, datas)
	interval := fleet.Interval(fleet.Rate{Limit: limit, Window: time.Second}, fleet.DefaultGrace, fleet.DefaultMaxSkew+fleetLag)
	checkBudgetWindows(t, all, ledgers, limit, interval, start)
	checkSentInTime(t, ledgers, fleetLag)
	checkSteadyShare(t, all, ledgers, start, cutAt, limit, interval)
	checkFleetRecords(t, ledgers, all, cutAt, healAt)
}

// proxyGet sends one GET through node's proxy route to path of source
// "up", in run, with Auditd-Deadline deadline, and returns the status and
// headers.
func proxyGet(t *testing.T, node *child, token, run, path, deadline string) (int, http.Header) {
	t.Helper()
	req, _ := http.NewRequest("GET", node.url+"/proxy/up"+path, nil)
	req.Header.Set("Proxy-Authorization", "Bearer "+token)
	req.Header.Set("Auditd-Run", run)
	req.Header.Set("Auditd-Deadline", deadline)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("GET %s through %s: %v", path, node.url, err)
		return 0, nil
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	t.Logf("GET %s through %s: %d, Retry-After %q", path, node.url, resp.StatusCode, resp.Header.Get("Retry-After"))
	return resp.StatusCode, resp.Header
}

// startBatch starts a batch run of n items of source "up" on node, and
// returns its id.
func startBatch(t *testing.T, node *child, token, name string, n int) string {
	t.Helper()
	var items []map[string]any
	for i := range n {
		items = append(items, map[string]any{"key": fmt.Sprintf("%s-%d", name, i), "source": "up", "path": fmt.Sprintf("/%s/%d.json", name, i)})
	}
	var created struct {
		ID string `json:"id"`
	}
	if code := node.call(t, "POST", "/v1/runs", token, map[string]any{"name": name, "items": items}, &created); code != http.StatusCreated {
		t.Fatalf("create batch run %s: %d\n%s", name, code, node.logs)
	}
	return created.ID
}

// fleetCutFor is how long TestFleetSharesOneBudget cuts node 3 from etcd:
// 5 s, longer than the blocks it holds, or AUDITD_FLEET_CUT (the issue's
// 60 s: AUDITD_FLEET_CUT=60s go test -run TestFleetSharesOneBudget).
func fleetCutFor(t *testing.T) time.Duration {
	d := 5 * time.Second
	if v := os.Getenv("AUDITD_FLEET_CUT"); v != "" {
		var err error
		if d, err = time.ParseDuration(v); err != nil || d < 5*time.Second {
			t.Fatalf("AUDITD_FLEET_CUT=%q: want a duration of 5s or more", v)
		}
	}
	return d
}

// checkCutOffMetrics checks that the metrics show the cut on node 3 and
// only there, and that every node used slots and reserved.
func checkCutOffMetrics(t *testing.T, nodes []*child) {
	t.Helper()
	learners := 0
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
		if got, ok := m["auditd_fleet_learned_requests_per_second"+series]; !ok || got != 20 {
			t.Errorf("node %d: auditd_fleet_learned_requests_per_second %v (present %v), want the told 20", i+1, got, ok)
		}
		learners += int(m["auditd_fleet_learner"+series])
		t.Logf("node %d metrics: reserved %v, used %v, wasted %v, held %v, last reservation %v s", i+1,
			m["auditd_fleet_slots_reserved_total"+series], m["auditd_fleet_slots_used_total"+series],
			m["auditd_fleet_slots_wasted_total"+series], m["auditd_fleet_slots_held"+series], m["auditd_fleet_reservation_seconds"+series])
	}
	if learners != 1 {
		t.Errorf("%d nodes say they are the key's learner, want one", learners)
	}
}

// commitLatency reads each node's ledger commit histogram: how many
// commits, and how many took longer than 50 ms and 100 ms.
func commitLatency(t *testing.T, nodes []*child) string {
	t.Helper()
	var out []string
	for i, n := range nodes {
		m := parseMetrics(t, scrape(t, n.url+"/metrics"))
		all := m[`auditd_ledger_commit_seconds_bucket{le="+Inf"}`]
		out = append(out, fmt.Sprintf("node%d %.0f (over 50 ms %.0f, over 100 ms %.0f, over 250 ms %.0f)", i+1, all,
			all-m[`auditd_ledger_commit_seconds_bucket{le="0.05"}`], all-m[`auditd_ledger_commit_seconds_bucket{le="0.1"}`],
			all-m[`auditd_ledger_commit_seconds_bucket{le="0.25"}`]))
	}
	return strings.Join(out, "; ")
}

// fleetArrival is one request in the fleet upstream's access log.
type fleetArrival struct {
	at     time.Time // when nginx began it: the line's time less the request's
	status int
	node   int    // 1 to 3, from the URI's /a/nN prefix
	path   string // the URI past that prefix: the path the node recorded
}

// fleetArrivals reads nginx's access log (fleet.conf.tmpl's format), in
// the order of arrival.
func fleetArrivals(t *testing.T, gw *nginxtest.Server) []fleetArrival {
	t.Helper()
	var out []fleetArrival
	for _, l := range gatewayLog(t, gw) {
		f := strings.Fields(l.line)
		if len(f) != 4 {
			t.Fatalf("access log line %q: want 4 fields", l.line)
		}
		took, err := strconv.ParseFloat(f[2], 64)
		if err != nil {
			t.Fatalf("access log line %q: %v", l.line, err)
		}
		a := fleetArrival{at: time.UnixMilli(int64(math.Round((l.at - took) * 1000))), status: l.status}
		uri := strings.Trim(f[3], `"`)
		if _, err := fmt.Sscanf(uri, "/a/n%d/", &a.node); err != nil {
			t.Fatalf("access log line %q: a URI of no node", l.line)
		}
		a.path = strings.TrimPrefix(uri, fmt.Sprintf("/a/n%d", a.node))
		out = append(out, a)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at.Before(out[j].at) })
	return out
}

// checkSteadyShare logs the share of the limit nginx saw used from the
// third second of load to the cut, and the share the fleet's grants held
// there (used or wasted). The use is a figure to watch, not a check: on a
// loaded machine takers woken past a slot's grace waste slots (63% to 89%
// used under race at load averages 5 to 13). The grants are the fleet's
// doing: they must hold at least two thirds of what the guard allows, or
// the nodes left time between their blocks that nobody held (74% to 89%
// granted in the same runs).
func checkSteadyShare(t *testing.T, all []fleetArrival, ledgers []fleetLedger, start, cutAt time.Time, limit int, interval time.Duration) {
	t.Helper()
	from, to := start.Add(3*time.Second), cutAt
	in := func(at time.Time) bool { return !at.Before(from) && at.Before(to) }
	used, granted := 0, 0
	for _, a := range all {
		if in(a.at) {
			used++
		}
	}
	for _, l := range ledgers {
		for _, s := range l.slots {
			if in(s) {
				granted++
			}
		}
	}
	span := to.Sub(from)
	share, held, guardCap := float64(used)/(span.Seconds()*float64(limit)), float64(granted)/(span.Seconds()*float64(limit)), float64(time.Second)/float64(time.Duration(limit)*interval)
	t.Logf("nginx logged %d requests; in %.1f s of steady load %d: %.1f%% of the limit; granted %.1f%%; the guard's cap %.1f%%",
		len(all), span.Seconds(), used, 100*share, 100*held, 100*guardCap)
	if held < guardCap*2/3 {
		t.Errorf("the fleet's grants held %.1f%% of the limit in steady load, want at least two thirds of the guard's cap %.1f%%", 100*held, 100*guardCap)
	}
}
