package main

import (
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/etcdtest"
)

// Three auditd nodes share one source's budget; node 2 is killed with
// SIGKILL mid-load and restarted on its data directory and address: the
// upstream never sees more than the limit in any second, the other nodes
// go on sending while it is down, and once it is back its proxy run is
// open again and its requests are answered through it.
func TestFleetNodeKilledAndRestarted(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members and three auditd nodes, one of them twice")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the long fleet tests
	const limit, token = 20, "fleet-admin-token-0123456789abcdef"
	cluster := etcdtest.Start(t, 3)
	eps := cluster.Endpoints()
	up := startFleetUpstream(t)
	flags := func(i int) []string {
		return []string{"--fleet-etcd", eps[i], "--fleet-lag", "100ms"}
	}
	f := startFleetNodes(t, up.URL, limit, token, flags)
	nodes, runs := f.nodes, f.runs

	stop := make(chan struct{})
	wait := fleetLoad(t, nodes, runs, token, 4, stop)
	time.Sleep(4 * time.Second)
	if err := nodes[1].cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	nodes[1].cmd.Wait()
	killedAt := time.Now()
	time.Sleep(3 * time.Second)
	// Back on the same address, so that its clients find it again.
	back := restartServe(t, nodes[1], f.datas[1], f.config, token, append(flags(1), "--node", "node2")...)
	restartedAt := time.Now()
	time.Sleep(4 * time.Second)
	close(stop)
	counts := wait()

	var run runCounts
	back.call(t, "GET", "/v1/runs/"+runs[1], token, nil, &run)
	if auditd.RunStatus(run.Status).Terminal() {
		t.Errorf("node 2's proxy run is %s after the restart, want it open", run.Status)
	}
	stopGracefully(t, nodes[0], nodes[2], back)

	all := up.log()
	if most := maxInWindow(slices.Clone(all), time.Second); most > limit {
		t.Errorf("the upstream saw %d requests in one second: over the fleet's limit of %d", most, limit)
	}
	// Per node, what reached the upstream while node 2 was down, and after
	// it came back.
	var down, after [3]int
	up.mu.Lock()
	for i, at := range up.arrivals {
		for n := range 3 {
			if !strings.HasPrefix(up.paths[i], fmt.Sprintf("/n%d/", n+1)) {
				continue
			}
			switch {
			case at.After(killedAt) && at.Before(restartedAt):
				down[n]++
			case at.After(restartedAt):
				after[n]++
			}
		}
	}
	up.mu.Unlock()
	t.Logf("statuses per node: %v; upstream: %d requests; while node 2 was down %v, after its restart %v; run %s %+v",
		counts, len(all), down, after, run.Status, run.Counts)
	if down[1] > 0 {
		t.Errorf("the upstream heard %d requests from node 2 after it was killed and before it restarted", down[1])
	}
	if down[0] == 0 || down[2] == 0 {
		t.Errorf("nodes 1 and 3 sent %d and %d requests while node 2 was down, want both going on", down[0], down[2])
	}
	if after[1] == 0 {
		t.Error("node 2 sent nothing through its run after its restart")
	}
}

// restartServe starts auditd serve again on dead's address (startServe
// picks a free one) with the same arguments, and waits for it to answer.
func restartServe(tb testing.TB, dead *child, dataDir, config, token string, extra ...string) *child {
	tb.Helper()
	return serveAt(tb, strings.TrimPrefix(dead.url, "http://"), dataDir, config, token, extra...)
}
