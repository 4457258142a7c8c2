package api_test

import (
	"log/slog"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
)

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// echoParam matches an echo path parameter (":id").
var echoParam = regexp.MustCompile(`:([A-Za-z_]+)`)

// TestSpecMatchesRoutes fails when a route the server registers is missing
// from openapi.yaml, or an operation of openapi.yaml has no route.
func TestSpecMatchesRoutes(t *testing.T) {
	doc := loadSpec(t)
	inSpec := map[string]bool{}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			inSpec[method+" "+path] = true
		}
	}
	inServer := map[string]bool{}
	for _, r := range api.NewServer().Routes() {
		// The proxy route takes every method (answering 405 to those it
		// does not forward); the spec documents those it forwards.
		if r.Path == "/proxy/:source/*" {
			if r.Method == http.MethodGet || r.Method == http.MethodHead || r.Method == http.MethodPost {
				inServer[r.Method+" /proxy/{source}/{path}"] = true
				inServer[r.Method+" /proxy/{source}/"] = true // the base URL: an empty path
			}
			continue
		}
		// Wildcards are echo's own: the group's catch-all and the UI fallback.
		if strings.Contains(r.Path, "*") || r.Path == "/v1" {
			continue
		}
		inServer[r.Method+" "+echoParam.ReplaceAllString(r.Path, "{$1}")] = true
	}
	if len(inServer) < 25 {
		t.Fatalf("only %d routes found; the walk is broken", len(inServer))
	}
	for _, k := range sorted(inServer) {
		if !inSpec[k] {
			t.Errorf("route %s is missing from openapi.yaml", k)
		}
	}
	for _, k := range sorted(inSpec) {
		if !inServer[k] {
			t.Errorf("openapi.yaml documents %s, which the server does not serve", k)
		}
	}
}

func sorted(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestSpecServed checks GET /openapi.yaml returns the embedded document.
func TestSpecServed(t *testing.T) {
	e := newEnv(t)
	r := e.do(request{path: "/openapi.yaml"})
	if r.status != http.StatusOK || string(r.body) != string(api.Spec()) {
		t.Fatalf("GET /openapi.yaml: %d, %d bytes; want 200 and the embedded %d bytes", r.status, len(r.body), len(api.Spec()))
	}
}

// TestSpecListsEveryEventType fails when the contract's event types and
// the ledger's (auditd.EventTypes) differ: a type the API filters by must
// be one a client can read about, and the other way round.
func TestSpecListsEveryEventType(t *testing.T) {
	doc := loadSpec(t)
	var inSpec []string
	for _, v := range doc.Components.Schemas["Event"].Value.Properties["type"].Value.Enum {
		inSpec = append(inSpec, v.(string))
	}
	var known []string
	for _, et := range auditd.EventTypes {
		known = append(known, string(et))
	}
	sort.Strings(inSpec)
	sort.Strings(known)
	if strings.Join(inSpec, " ") != strings.Join(known, " ") {
		t.Fatalf("event types in the contract:\n%v\nin auditd.EventTypes:\n%v", inSpec, known)
	}
}
