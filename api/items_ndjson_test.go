package api_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/auditd/auditd/auth"
)

// An open batch run takes a page streamed as NDJSON, one item a line
// (blank lines skipped), answered as openapi.yaml says; a bad line
// refuses the page whole, naming the line, and the run keeps what it had.
func TestAddItemsNDJSON(t *testing.T) {
	e := newEnv(t)
	op := e.secret[auth.RoleOperator]
	var run struct {
		ID        string `json:"id"`
		ItemCount int    `json:"item_count"`
	}
	e.do(request{method: "POST", path: "/v1/runs", secret: op, body: `{"name":"streamed","open":true,"items":[]}`}).decode(t, &run)
	path := "/v1/runs/" + run.ID + "/items"
	line := func(key, p string) string {
		return fmt.Sprintf(`{"key":%q,"source":"county","path":%q}`, key, p)
	}
	post := func(lines ...string) response {
		t.Helper()
		return e.do(request{method: "POST", path: path, secret: op, ctype: "application/x-ndjson", body: strings.Join(lines, "\n") + "\n"})
	}

	got := post(line("k1", "/q?n=1"), "", line("k2", "/q?n=2"), line("k3", "/q?n=3"))
	if got.status != 200 {
		t.Fatalf("a streamed page: %d %s", got.status, got.body)
	}
	if got.decode(t, &run); run.ItemCount != 3 {
		t.Fatalf("after a streamed page of 3: %d items", run.ItemCount)
	}

	for _, tc := range []struct {
		name  string
		lines []string
		field string
	}{
		{"MissingPath", []string{line("k4", "/q"), `{"key":"k5","source":"county"}`}, "line 2: path"},
		{"NotJSON", []string{line("k4", "/q"), line("k5", "/q"), `{"key":`}, "line 3"},
		{"UnknownField", []string{`{"key":"k4","source":"county","path":"/q","colour":"red"}`}, "line 1: colour"},
		{"KeyTheRunHas", []string{line("k4", "/q"), "", line("k2", "/q")}, "line 3: key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := post(tc.lines...)
			if got.status != 400 {
				t.Fatalf("%d %s, want 400", got.status, got.body)
			}
			if p := got.problem(t); p.Field != tc.field || !strings.HasPrefix(p.Detail, "Line ") {
				t.Fatalf("names %q (%q), want %q and a detail naming the line", p.Field, p.Detail, tc.field)
			}
			var now struct {
				ItemCount int `json:"item_count"`
			}
			if json.Unmarshal(e.do(request{path: "/v1/runs/" + run.ID, secret: op}).body, &now); now.ItemCount != 3 {
				t.Fatalf("a refused page left the run with %d items, want 3", now.ItemCount)
			}
		})
	}

	if got := post(""); got.status != 400 {
		t.Fatalf("an empty page: %d %s, want 400", got.status, got.body)
	}
}
