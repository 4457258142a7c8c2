package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// fakeFleetView is two nodes sharing source "county": "a", this one, and
// "b", which is cut off.
type fakeFleetView struct{}

func (fakeFleetView) Node() string { return "a" }

func (fakeFleetView) FleetSources(context.Context) (api.FleetSources, error) {
	use := func(node string, reserved int64, share float64, cut bool) api.FleetNodeUse {
		return api.FleetNodeUse{Node: node, ReportedAt: start, Span: auditd.Duration(time.Minute), Blocks: 6,
			Reserved: reserved, Used: reserved - 2, Wasted: 2, Held: 3, Share: share, CutOff: cut,
			PausedUntil: start.Add(time.Second), Etcd: auditd.Duration(2 * time.Millisecond)}
	}
	return api.FleetSources{Node: "a", Sources: []api.FleetSource{{
		Key: "county", Members: []string{"county"}, Limit: 10, Window: auditd.Duration(time.Second),
		Learned: 8, LearnedWindow: auditd.Duration(time.Second),
		Nodes: []api.FleetNodeUse{use("a", 300, 0.6, false), use("b", 200, 0.4, true)},
	}}}, nil
}

// GET /v1/fleet/sources answers what the fleet view holds, as the contract
// says (the env's specCheck), to an auditor; a node not in a fleet says so
// with a 404 not_in_fleet, never an empty 200 that reads as "no sources".
func TestFleetSources(t *testing.T) {
	e := newEnv(t)
	got := e.do(request{path: "/v1/fleet/sources", secret: e.secret[auth.RoleAuditor]})
	if got.status != http.StatusOK {
		t.Fatalf("GET /v1/fleet/sources: %d %s", got.status, got.body)
	}
	var v struct {
		Node    string `json:"node"`
		Sources []struct {
			Key   string `json:"key"`
			Nodes []struct {
				Node   string  `json:"node"`
				Share  float64 `json:"share"`
				CutOff bool    `json:"cut_off"`
				Etcd   string  `json:"etcd_latency"`
			} `json:"nodes"`
		} `json:"sources"`
	}
	got.decode(t, &v)
	if v.Node != "a" || len(v.Sources) != 1 || len(v.Sources[0].Nodes) != 2 {
		t.Fatalf("fleet view %s", got.body)
	}
	if b := v.Sources[0].Nodes[1]; b.Node != "b" || !b.CutOff || b.Share != 0.4 || b.Etcd != "2ms" {
		t.Errorf("node b's row: %+v", b)
	}
	if got := e.do(request{path: "/v1/fleet/sources"}); got.status != http.StatusUnauthorized {
		t.Errorf("without a token: %d", got.status)
	}

	// GET /v1/sources points the UI at the view, on a node in a fleet only.
	var list struct {
		Fleet *struct{ Node, View string } `json:"fleet"`
	}
	e.do(request{path: "/v1/sources", secret: e.secret[auth.RoleAuditor]}).decode(t, &list)
	if list.Fleet == nil || list.Fleet.Node != "a" || list.Fleet.View != "/v1/fleet/sources" {
		t.Errorf("GET /v1/sources in a fleet: fleet %+v", list.Fleet)
	}

	alone := newEnv(t, func(e *env) { e.srv.FleetView = nil })
	got = alone.do(request{path: "/v1/fleet/sources", secret: alone.secret[auth.RoleAuditor]})
	if p := got.problem(t); got.status != http.StatusNotFound || p.Code != "not_in_fleet" || !strings.Contains(p.Detail, "not in a fleet") {
		t.Errorf("a node not in a fleet: %d %s", got.status, got.body)
	}
	got = alone.do(request{path: "/v1/sources", secret: alone.secret[auth.RoleAuditor]})
	if got.status != http.StatusOK || strings.Contains(string(got.body), `"fleet"`) {
		t.Errorf("GET /v1/sources on a node not in a fleet: %d %s", got.status, got.body)
	}
}
