package api_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// TestPackRoutes: a finished run's pack is the builder's, asked for that
// run, downloaded as a file; an award's covers its runs oldest first; a
// run that has not ended, or an award with one, is a 409 that records
// nothing and builds nothing; a server without a builder answers 503.
func TestPackRoutes(t *testing.T) {
	e := newEnv(t)
	aud := e.secret[auth.RoleAuditor]

	r := e.do(request{path: "/v1/runs/" + e.runID + "/evidence-pack.zip", secret: aud})
	if r.status != http.StatusOK || r.header.Get("Content-Type") != api.MIMEZIP || string(r.body) != "PK\x03\x04 fake pack" {
		t.Fatalf("run pack: %d %q %q", r.status, r.header.Get("Content-Type"), r.body)
	}
	if cd := r.header.Get("Content-Disposition"); cd != `attachment; filename="evidence-pack-`+e.runID+`.zip"` {
		t.Errorf("Content-Disposition %q", cd)
	}
	if call, _ := e.packs.last(); !slices.Equal(call.runIDs, []string{e.runID}) || call.filters != "run "+e.runID {
		t.Errorf("the builder was asked for %+v", call)
	}

	// A second finished run of the award, created later: the award's pack
	// lists both, oldest first, and says which period it covers.
	e.clock.Advance(60e9)
	later := e.runs.add(auditd.RunPartial, nil)
	e.runs.mu.Lock()
	e.runs.runs[later].state.Run.Award.FAIN = "F-1"
	e.runs.mu.Unlock()
	r = e.do(request{path: "/v1/evidence-pack.zip?award=F-1&from=2026-01-01", secret: aud})
	if r.status != http.StatusOK || r.header.Get("Content-Type") != api.MIMEZIP {
		t.Fatalf("award pack: %d %s", r.status, r.body)
	}
	if call, _ := e.packs.last(); !slices.Equal(call.runIDs, []string{e.runID, later}) || call.filters != "award=F-1 from=2026-01-01T00:00:00Z to=-" {
		t.Errorf("the builder was asked for %+v", call)
	}

	running := e.runs.add(auditd.RunRunning, nil)
	e.runs.mu.Lock()
	e.runs.runs[running].state.Run.Award.FAIN = "F-1"
	e.runs.mu.Unlock()
	_, calls := e.packs.last()
	for _, path := range []string{"/v1/runs/" + running + "/evidence-pack.zip", "/v1/evidence-pack.zip?award=F-1"} {
		head := e.head()
		r := e.do(request{path: path, secret: aud})
		if r.status != http.StatusConflict || !strings.Contains(r.problem(t).Detail, running) {
			t.Errorf("GET %s with a running run: %d %s, want 409 naming it", path, r.status, r.body)
		}
		if evs := e.eventsAfter(head); len(evs) != 0 {
			t.Errorf("GET %s refused, yet recorded %d events", path, len(evs))
		}
	}
	if _, n := e.packs.last(); n != calls {
		t.Errorf("the builder was called %d times for refused requests", n-calls)
	}

	e.srv.Packs = nil
	head := e.head()
	if r := e.do(request{path: "/v1/runs/" + e.runID + "/evidence-pack.zip", secret: aud}); r.status != http.StatusServiceUnavailable {
		t.Errorf("no builder: %d %s, want 503", r.status, r.body)
	}
	if evs := e.eventsAfter(head); len(evs) != 0 {
		t.Errorf("no builder, yet %d events recorded", len(evs))
	}
}
