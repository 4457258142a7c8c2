package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/etcdtest"
)

// Three auditd nodes, each told every member of a three-member etcd, share
// one source's budget. One member stops: the fleet goes on sending. Then
// the leader stops, leaving no quorum: past the last slot any node was
// granted (plus the lag allowance and a slot's grace) the upstream hears
// nothing, and no second ever holds more than the limit.
func TestFleetStopsWithoutQuorum(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members and three auditd nodes")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the other long fleet tests
	const limit, token = 20, "fleet-admin-token-0123456789abcdef"
	const lag = 100 * time.Millisecond
	cluster := etcdtest.Start(t, 3)
	up := startFleetUpstream(t)
	f := startFleetNodes(t, up.URL, limit, token, func(int) []string {
		return []string{"--fleet-etcd", strings.Join(cluster.Endpoints(), ","), "--fleet-lag", lag.String()}
	})
	nodes, datas, runs := f.nodes, f.datas, f.runs

	stop := make(chan struct{})
	// A short deadline: without a quorum the requests end with 503 rather
	// than waiting out the default 30 s.
	wait := fleetLoadWithin(t, nodes, runs, token, "2", 4, stop)
	time.Sleep(3 * time.Second)
	lead := cluster.Leader()
	if lead < 0 {
		t.Fatal("no etcd leader")
	}
	cluster.Members[(lead+1)%3].Stop()
	oneStopped := time.Now()
	time.Sleep(4 * time.Second)
	lead = cluster.Leader()
	if lead < 0 {
		t.Fatal("no etcd leader with two members of three")
	}
	stopping := time.Now() // a leader's Stop hands over leadership first, which may take seconds
	cluster.Members[lead].Stop()
	noQuorum := time.Now()
	time.Sleep(4 * time.Second)
	close(stop)
	counts := wait()
	stopGracefully(t, nodes...)

	all := up.log()
	if most := maxInWindow(slices.Clone(all), time.Second); most > limit {
		t.Errorf("the upstream saw %d requests in one second: over the fleet's limit of %d", most, limit)
	}
	// The end of the last block any node was granted.
	var held time.Time
	cutOffs := 0
	for _, data := range datas {
		evs, _ := fleetEvents(t, data)
		for _, e := range evs {
			var d fleetDetail
			if err := json.Unmarshal([]byte(e.Detail), &d); err != nil {
				t.Fatal(err)
			}
			if e.Type == auditd.EventFleetReserved && d.First != nil {
				iv, _ := time.ParseDuration(d.Interval)
				held = later(held, d.First.Add(time.Duration(d.Count)*iv))
			}
			if e.Type == auditd.EventFleetCutOff && e.Time.After(noQuorum) {
				cutOffs++
			}
		}
	}
	withQuorum, past := 0, 0
	for _, at := range all {
		if at.After(oneStopped.Add(time.Second)) && at.Before(stopping) {
			withQuorum++
		}
		if at.After(held.Add(lag + 20*time.Millisecond)) {
			past++
		}
	}
	t.Logf("statuses per node: %v; upstream: %d requests, %d in the 3 s with two members; the leader took %v to stop; last slot granted %v after it had; %d cut-off records",
		counts, len(all), withQuorum, noQuorum.Sub(stopping), held.Sub(noQuorum), cutOffs)
	if withQuorum < 3*limit/2 {
		t.Errorf("with two members of three the upstream heard %d requests in 3 s, want the fleet going on (at least %d)", withQuorum, 3*limit/2)
	}
	if past > 0 {
		t.Errorf("without a quorum the upstream heard %d requests past the last slot granted", past)
	}
	if cutOffs == 0 {
		t.Error("no node recorded that it was cut off when the quorum was lost")
	}
}
