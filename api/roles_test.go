package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// routeCase is one route of the API with a request that succeeds for a
// token of role min or above.
type routeCase struct {
	name string
	min  auth.Role // "" for the unauthenticated system routes
	want int       // status for an allowed caller
	// req builds a fresh request each time, so that routes that change
	// state (cancel, revoke) can be called once per caller.
	req func(e *env) request
}

const oneItemRun = `{"name":"nightly","award":{"fain":"F-1","listing_number":"10.555","recipient_uei":"ABCDEF123456"},"items":[{"key":"p1","source":"county","path":"/layer/0/query"}]}`

func routeCases() []routeCase {
	get := func(path string) func(*env) request {
		return func(*env) request { return request{path: path} }
	}
	runPath := func(suffix string) func(*env) request {
		return func(e *env) request { return request{path: "/v1/runs/" + e.runID + suffix} }
	}
	fleetPath := func(suffix string) func(*env) request {
		return func(e *env) request { return request{path: "/v1/fleet/runs/" + e.runID + suffix} }
	}
	return []routeCase{
		{"Healthz", "", 200, get("/healthz")},
		{"Metrics", "", 200, get("/metrics")},
		{"OpenAPI", "", 200, get("/openapi.yaml")},
		{"ListSources", auth.RoleAuditor, 200, get("/v1/sources")},
		{"GetSource", auth.RoleAuditor, 200, get("/v1/sources/county")},
		{"PutSource", auth.RoleAdmin, 200, func(*env) request {
			return request{method: "PUT", path: "/v1/sources/county", body: `{"base_url":"https://gis.example.gov/arcgis","limit":5,"window":"1s"}`}
		}},
		{"CreateRun", auth.RoleOperator, 201, func(*env) request {
			return request{method: "POST", path: "/v1/runs", body: oneItemRun}
		}},
		{"ListRuns", auth.RoleAuditor, 200, get("/v1/runs?status=succeeded&limit=5")},
		{"GetRun", auth.RoleAuditor, 200, runPath("")},
		{"CancelRun", auth.RoleOperator, 200, func(e *env) request {
			id := e.runs.add(auditd.RunRunning, []auditd.ItemView{{Item: auditd.Item{Key: "x", SourceID: "county", Path: "/"}}})
			return request{method: "POST", path: "/v1/runs/" + id + "/cancel"}
		}},
		{"FinishRun", auth.RoleOperator, 200, func(e *env) request {
			r := request{method: "POST", path: "/v1/runs", body: `{"name":"proxied","mode":"proxy"}`}
			r.secret = e.secret[auth.RoleOperator]
			var run struct {
				ID string `json:"id"`
			}
			if got := e.do(r); got.status != 201 || json.Unmarshal(got.body, &run) != nil {
				e.t.Fatalf("create a proxy-mode run: %d %s", got.status, got.body)
			}
			return request{method: "POST", path: "/v1/runs/" + run.ID + "/finish"}
		}},
		{"Acknowledge", auth.RoleOperator, 200, func(e *env) request {
			return request{method: "POST", path: "/v1/runs/" + e.runID + "/acknowledgements", body: `{"items":["a"]}`}
		}},
		{"AddItems", auth.RoleOperator, 200, func(e *env) request {
			r := request{method: "POST", path: "/v1/runs", body: `{"name":"paged","open":true,"items":[]}`}
			r.secret = e.secret[auth.RoleOperator]
			var run struct {
				ID string `json:"id"`
			}
			if got := e.do(r); got.status != 201 || json.Unmarshal(got.body, &run) != nil {
				e.t.Fatalf("create an open run: %d %s", got.status, got.body)
			}
			return request{method: "POST", path: "/v1/runs/" + run.ID + "/items", body: `{"items":[{"key":"k","source":"county","path":"/"}]}`}
		}},
		{"ListItems", auth.RoleAuditor, 200, runPath("/items")},
		{"GetItem", auth.RoleAuditor, 200, runPath("/items/a")},
		{"GetPayload", auth.RoleAuditor, 200, runPath("/items/a/payload")},
		{"ListEvents", auth.RoleAuditor, 200, runPath("/events?type=dispatch,response")},
		{"Reconciliation", auth.RoleAuditor, 200, runPath("/reconciliation")},
		{"RunEvidence", auth.RoleAuditor, 200, runPath("/evidence.xlsx")},
		{"RunPack", auth.RoleAuditor, 200, runPath("/evidence-pack.zip")},
		{"RunTimeline", auth.RoleAuditor, 200, runPath("/timeline?bucket=1s")},
		{"SourceTimeline", auth.RoleAuditor, 200, get("/v1/sources/county/timeline")},
		{"AwardEvidence", auth.RoleAuditor, 200, get("/v1/evidence.xlsx?award=F-1&from=2026-01-01&to=2026-04-01")},
		// F-1 has runs still going by now, whose award's pack is a 409.
		{"AwardPack", auth.RoleAuditor, 200, func(e *env) request {
			id := e.runs.add(auditd.RunSucceeded, nil)
			e.runs.mu.Lock()
			e.runs.runs[id].state.Run.Award.FAIN = "F-PACK"
			e.runs.mu.Unlock()
			return request{path: "/v1/evidence-pack.zip?award=F-PACK&from=2026-01-01&to=2026-04-01"}
		}},
		{"VerifyLedger", auth.RoleAuditor, 200, get("/v1/ledger/verify")},
		{"Checkpoint", auth.RoleAuditor, 200, get("/v1/ledger/checkpoint")},
		{"Proof", auth.RoleAuditor, 200, get("/v1/ledger/proof/1")},
		{"PublicKey", auth.RoleAuditor, 200, get("/v1/ledger/public-key")},
		{"Consistency", auth.RoleAuditor, 200, get("/v1/ledger/consistency?old=1")},
		{"Inclusion", auth.RoleAuditor, 200, get("/v1/ledger/inclusion?seq=1")},
		{"CheckpointHistory", auth.RoleAuditor, 200, get("/v1/ledger/checkpoints")},
		{"CheckpointAt", auth.RoleAuditor, 200, func(e *env) request {
			return request{path: fmt.Sprintf("/v1/ledger/checkpoints/%d", e.head())}
		}},
		// No witness is configured here: an allowed caller's cosignature is refused as such.
		{"Cosign", auth.RoleAuditor, 400, func(*env) request {
			return request{method: "POST", path: "/v1/ledger/cosignatures", body: "not a note", ctype: "text/plain"}
		}},
		{"LedgerEvents", auth.RoleAuditor, 200, get("/v1/ledger/events?from=1&limit=5")},
		{"GetRetention", auth.RoleAuditor, 200, get("/v1/awards/F-1/retention")},
		{"SetRetention", auth.RoleAdmin, 200, func(*env) request {
			return request{method: "PUT", path: "/v1/awards/F-1/retention", body: `{"final_report":"2026-01-15"}`}
		}},
		{"PlaceHold", auth.RoleAdmin, 201, func(*env) request {
			return request{method: "POST", path: "/v1/awards/F-1/holds", body: `{"reason":"audit"}`}
		}},
		{"ReleaseHold", auth.RoleAdmin, 200, func(e *env) request {
			h, err := e.srv.Retention.PlaceHold(context.Background(), "test", "F-1", "to release")
			if err != nil {
				e.t.Fatal(err)
			}
			return request{method: "POST", path: "/v1/awards/F-1/holds/" + h.ID + "/release", body: `{"reason":"done"}`}
		}},
		{"CreateToken", auth.RoleAdmin, 201, func(*env) request {
			return request{method: "POST", path: "/v1/tokens", body: `{"name":"ci","role":"auditor"}`}
		}},
		{"ListTokens", auth.RoleAdmin, 200, get("/v1/tokens")},
		{"CreateFleetRun", auth.RoleOperator, 201, func(*env) request {
			return request{method: "POST", path: "/v1/fleet/runs", body: `{"name":"fleet"}`}
		}},
		{"ListFleetRuns", auth.RoleAuditor, 200, get("/v1/fleet/runs")},
		{"GetFleetRun", auth.RoleAuditor, 200, fleetPath("")},
		{"FinishFleetRun", auth.RoleOperator, 200, func(e *env) request { return request{method: "POST", path: "/v1/fleet/runs/" + e.runID + "/finish"} }},
		{"FleetReconciliation", auth.RoleAuditor, 200, fleetPath("/reconciliation")},
		{"FleetPart", auth.RoleAuditor, 200, fleetPath("/part")},
		{"FleetPack", auth.RoleAuditor, 200, fleetPath("/evidence-pack.zip")},
		{"FleetPartPack", auth.RoleAuditor, 200, fleetPath("/part.zip")},
		{"FleetEvidence", auth.RoleAuditor, 200, fleetPath("/evidence.xlsx")},
		{"FleetTimeline", auth.RoleAuditor, 200, fleetPath("/timeline?bucket=1s")},
		{"FleetLog", auth.RoleAuditor, 200, get("/v1/fleet/log")},
		{"FleetSources", auth.RoleAuditor, 200, get("/v1/fleet/sources")},
		{"FleetCosign", auth.RoleOperator, 200, func(*env) request {
			return request{method: "POST", path: "/v1/fleet/log/cosignatures", body: `{"size":3}`}
		}},
		{"RevokeToken", auth.RoleAdmin, 204, func(e *env) request {
			tok, _, err := e.tokens.Create(context.Background(), "victim", auth.RoleAuditor, "test")
			if err != nil {
				e.t.Fatal(err)
			}
			return request{method: "DELETE", path: "/v1/tokens/" + url.PathEscape(tok.ID)}
		}},
	}
}

// TestRoleMatrix calls every route as every kind of caller and checks the
// documented status: 401 without a live token, 403 below the route's role,
// the route's success status at or above it.
func TestRoleMatrix(t *testing.T) {
	e := newEnv(t, withLog(), withRetention())
	callers := []struct {
		name   string
		secret func() string
		role   auth.Role // "" for callers that do not authenticate
	}{
		{"NoToken", func() string { return "" }, ""},
		{"BadToken", func() string { return "adt_this-is-not-a-token-anyone-was-given" }, ""},
		{"RevokedToken", func() string { return e.revoked }, ""},
		{"Auditor", func() string { return e.secret[auth.RoleAuditor] }, auth.RoleAuditor},
		{"Operator", func() string { return e.secret[auth.RoleOperator] }, auth.RoleOperator},
		{"Admin", func() string { return e.secret[auth.RoleAdmin] }, auth.RoleAdmin},
	}
	cases := routeCases()
	if got := len(cases); got != len(e.srv.Routes())-countWildcards(e.srv) {
		t.Fatalf("role matrix covers %d routes, the server has %d: add the new route here", got, len(e.srv.Routes())-countWildcards(e.srv))
	}
	for _, rc := range cases {
		for _, caller := range callers {
			t.Run(rc.name+"/"+caller.name, func(t *testing.T) {
				want := rc.want
				switch {
				case rc.min == "":
				case caller.role == "":
					want = http.StatusUnauthorized
				case !caller.role.Allows(rc.min):
					want = http.StatusForbidden
				}
				req := rc.req(e)
				req.secret = caller.secret()
				r := e.do(req)
				if r.status != want {
					t.Fatalf("%s %s as %s: %d, want %d; body %s", req.method, req.path, caller.name, r.status, want, r.body)
				}
				if want >= 400 {
					p := r.problem(t)
					if p.RequestID == "" || p.RequestID != r.header.Get("X-Request-Id") {
						t.Errorf("problem request_id %q, header %q", p.RequestID, r.header.Get("X-Request-Id"))
					}
				}
				if want == http.StatusUnauthorized && r.header.Get("WWW-Authenticate") == "" {
					t.Error("401 without WWW-Authenticate")
				}
			})
		}
	}
}

func countWildcards(s *api.Server) int {
	n := 0
	for _, r := range s.Routes() {
		if r.Path == "/v1" || len(r.Path) > 0 && r.Path[len(r.Path)-1] == '*' {
			n++
		}
	}
	return n
}
