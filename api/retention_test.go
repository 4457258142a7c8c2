package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/retention"
)

func withRetention() envOption {
	return func(e *env) {
		k := retention.New(e.ledger, nil)
		k.Clock = e.clock
		e.srv.Retention = k
	}
}

// TestRetentionRoutes: an admin records an award's retention and places
// and releases a hold, each a ledger event naming the token; an auditor
// reads it; bad input is a 400 naming the field and records nothing.
func TestRetentionRoutes(t *testing.T) {
	e := newEnv(t, withRetention())
	admin, aud := e.secret[auth.RoleAdmin], e.secret[auth.RoleAuditor]
	adminTok, _ := e.tokens.Authenticate(admin)
	head := e.head()
	var st retention.Status
	r := e.do(request{method: "PUT", path: "/v1/awards/F-9/retention", secret: admin, body: `{"final_report":"2026-01-15"}`})
	r.decode(t, &st)
	if r.status != http.StatusOK || !st.Set || st.Award.RetainUntil.Format("2006-01-02") != "2029-01-15" || st.Purgeable {
		t.Fatalf("set retention: %d %+v", r.status, st)
	}
	var h retention.Hold
	r = e.do(request{method: "POST", path: "/v1/awards/F-9/holds", secret: admin, body: `{"reason":"OIG audit"}`})
	r.decode(t, &h)
	if r.status != http.StatusCreated || h.ID == "" || h.Reason != "OIG audit" || h.PlacedBy != adminTok.Principal() {
		t.Fatalf("place hold: %d %+v", r.status, h)
	}
	r = e.do(request{method: "POST", path: "/v1/awards/F-9/holds/" + h.ID + "/release", secret: admin, body: `{"reason":"audit closed"}`})
	r.decode(t, &h)
	if r.status != http.StatusOK || h.Active() {
		t.Fatalf("release: %d %+v", r.status, h)
	}
	if r := e.do(request{method: "POST", path: "/v1/awards/F-9/holds/" + h.ID + "/release", secret: admin, body: `{"reason":"again"}`}); r.status != http.StatusConflict {
		t.Errorf("release twice: %d, want 409", r.status)
	}
	e.do(request{path: "/v1/awards/F-9/retention", secret: aud}).decode(t, &st)
	if len(st.Holds) != 1 || st.Holds[0].ReleaseReason != "audit closed" {
		t.Errorf("status %+v", st)
	}
	var types []string
	for _, ev := range e.eventsAfter(head) {
		if ev.Principal != adminTok.Principal() {
			t.Errorf("event %s names %q", ev.Type, ev.Principal)
		}
		types = append(types, string(ev.Type))
	}
	if got := strings.Join(types, " "); got != "retention.set hold.placed hold.released" {
		t.Errorf("events %s", got)
	}

	head = e.head()
	for _, tc := range []struct{ method, path, body, field string }{
		{"PUT", "/v1/awards/F-9/retention", `{"final_report":"15/01/2026"}`, "final_report"},
		{"PUT", "/v1/awards/F-9/retention", `{"retain_until":"2030-01-01"}`, "final_report"},
		{"PUT", "/v1/awards/F-9/retention", `{"final_report":"2026-01-15","retain_until":"2020-01-01"}`, "retain_until"},
		{"PUT", "/v1/awards/F-9/retention", `{"final_report":"2026-01-15","retain_until":""}`, "retain_until"},
		{"POST", "/v1/awards/F-9/holds", `{"reason":""}`, "reason"},
		{"POST", "/v1/awards/F-9/holds/h1/release", `{}`, "reason"},
	} {
		r := e.do(request{method: tc.method, path: tc.path, secret: admin, body: tc.body})
		if p := r.problem(t); r.status != http.StatusBadRequest || p.Field != tc.field {
			t.Errorf("%s %s %s: %d %q, want 400 naming %s", tc.method, tc.path, tc.body, r.status, p.Field, tc.field)
		}
	}
	if r := e.do(request{method: "POST", path: "/v1/awards/F-9/holds/h999/release", secret: admin, body: `{"reason":"x"}`}); r.status != http.StatusNotFound {
		t.Errorf("unknown hold: %d", r.status)
	}
	if e.head() != head {
		t.Error("refused requests recorded events")
	}
}
