package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// TestRunIDInEitherCase: a ULID reads the same in either case, so a run id
// pasted in lower case finds the run, on its routes and in Auditd-Run, and
// is handed over in capitals, as runs are stored.
func TestRunIDInEitherCase(t *testing.T) {
	e := newEnv(t)
	aud, op := e.secret[auth.RoleAuditor], e.secret[auth.RoleOperator]
	lower := strings.ToLower(e.runID)
	var run struct {
		ID string `json:"id"`
	}
	e.do(request{path: "/v1/runs/" + lower, secret: aud}).decode(t, &run)
	if run.ID != e.runID {
		t.Errorf("GET /v1/runs/%s found %q, want %s", lower, run.ID, e.runID)
	}
	if r := e.do(request{path: "/v1/runs/" + lower + "/reconciliation", secret: aud}); r.status != http.StatusOK {
		t.Errorf("GET /v1/runs/%s/reconciliation: %d %s", lower, r.status, r.body)
	}
	if r := e.do(request{path: "/v1/runs/not-a-run", secret: aud}); r.status != http.StatusNotFound {
		t.Errorf("GET /v1/runs/not-a-run: %d %s, want 404", r.status, r.body)
	}
	e.srv.Proxy = echoProxy(func(req *auditd.ProxyRequest) string { return req.RunID })
	if r := e.do(request{path: "/proxy/county/q", secret: op, header: map[string]string{"Auditd-Run": lower}}); r.status != http.StatusOK || string(r.body) != e.runID {
		t.Errorf("Auditd-Run %s reached the fetch loop as %q (%d), want %s", lower, r.body, r.status, e.runID)
	}
}
