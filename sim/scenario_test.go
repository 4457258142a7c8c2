package sim_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

func TestParseScenarioRejects(t *testing.T) {
	tests := []struct {
		name  string
		doc   string
		line  int
		field string
		msg   string
	}{
		{"UnknownTopLevelField", "upstreams: [{name: a}]\nseeds: 3\n", 2, "seeds", "unknown field"},
		{"UnknownNestedField", "upstreams:\n  - name: a\n    limit:\n      shape: leaky_bucket\n      requests: 1\n      rate: 5\n", 6, "upstreams[0].limit.rate", "unknown field"},
		{"FieldGivenTwice", "upstreams:\n  - name: a\n    name: b\n", 3, "upstreams[0].name", "given twice"},
		{"UnknownShape", "upstreams:\n  - name: a\n    limit: {shape: leaky, requests: 1}\n", 3, "upstreams[0].limit.shape", `unknown shape "leaky"`},
		{"MissingShape", "upstreams:\n  - name: a\n    limit: {requests: 1}\n", 3, "upstreams[0].limit.shape", "missing"},
		{"RequestsNotANumber", "upstreams:\n  - name: a\n    limit:\n      shape: fixed_window\n      requests: many\n", 5, "upstreams[0].limit.requests", `cannot use "many" as a whole number`},
		{"RequestsZero", "upstreams:\n  - name: a\n    limit:\n      shape: fixed_window\n      requests: 0\n", 5, "upstreams[0].limit.requests", "want 1-1000000"},
		{"WindowWithoutUnit", "upstreams:\n  - name: a\n    limit: {shape: fixed_window, requests: 1, window: 60}\n", 3, "upstreams[0].limit.window", "a duration such as 30s"},
		{"BurstOnFixedWindow", "upstreams:\n  - name: a\n    limit: {shape: fixed_window, requests: 1, burst: 3}\n", 3, "upstreams[0].limit.burst", "leaky_bucket and token_bucket only"},
		{"ChangesOutOfOrder", "upstreams:\n  - name: a\n    limit:\n      shape: sliding_window\n      requests: 10\n      changes:\n        - {after: 30s, requests: 5}\n        - {after: 10s, requests: 2}\n", 8, "upstreams[0].limit.changes[1].after", "after the previous change"},
		{"RejectStatus", "upstreams:\n  - name: a\n    reject: {status: 500}\n", 3, "upstreams[0].reject.status", "want 429 or 503"},
		{"RetryAfterForm", "upstreams:\n  - name: a\n    reject:\n      retry_after: http_date\n", 4, "upstreams[0].reject.retry_after", `unknown form "http_date"`},
		{"AdvertiseForm", "upstreams:\n  - name: a\n    reject: {advertise: github}\n", 3, "upstreams[0].reject.advertise", `unknown header set "github"`},
		{"OutageEndsBeforeItStarts", "upstreams:\n  - name: a\n    outages:\n      - from: 1m\n        to: 30s\n", 5, "upstreams[0].outages[0].to", "after from"},
		{"OutageDropWithStatus", "upstreams:\n  - name: a\n    outages: [{from: 0s, to: 1s, drop: true, status: 503}]\n", 3, "upstreams[0].outages[0].status", "no status"},
		{"OutageStatus", "upstreams:\n  - name: a\n    outages: [{from: 0s, to: 1s, status: 404}]\n", 3, "upstreams[0].outages[0].status", "want 500, 502 or 503"},
		{"BodyErrorWithoutTrigger", "upstreams:\n  - name: a\n    body_errors:\n      - style: arcgis\n", 4, "upstreams[0].body_errors[0].every", "give every"},
		{"CollectionKind", "upstreams:\n  - name: a\n    collection: {kind: wms, records: 3}\n", 3, "upstreams[0].collection.kind", `unknown kind "wms"`},
		{"RequiredHeaderStatus", "upstreams:\n  - name: a\n    required_header: {name: X-Key, value: k, status: 200}\n", 3, "upstreams[0].required_header.status", "want 401, 403 or 498"},
		{"RequiredHeaderName", "upstreams:\n  - name: a\n    required_header: {name: \"X Key\", value: k}\n", 3, "upstreams[0].required_header.name", "HTTP header name"},
		{"DuplicateUpstream", "upstreams:\n  - name: a\n  - name: a\n", 3, "upstreams[1].name", "defined twice"},
		{"BadUpstreamName", "upstreams:\n  - name: a b\n", 2, "upstreams[0].name", "letters, digits"},
		{"UnknownGroup", "upstreams:\n  - name: a\n    group: gw\n", 3, "upstreams[0].group", `no group named "gw"`},
		{"GroupAndOwnLimit", "groups: [{name: gw, limit: {shape: none}}]\nupstreams:\n  - name: a\n    group: gw\n    limit: {shape: none}\n", 5, "upstreams[0].limit", "remove one"},
		{"EmptyGroup", "groups:\n  - name: gw\n    limit: {shape: none}\nupstreams: [{name: a}]\n", 2, "groups[0].name", "no upstream"},
		{"NoUpstreams", "name: x\n", 0, "upstreams", "at least one"},
		{"ListWhereMappingBelongs", "upstreams:\n  - name: a\n    latency: [1s]\n", 3, "upstreams[0].latency", "want a mapping"},
		{"Alias", "upstreams:\n  - &u {name: a}\n  - *u\n", 2, "upstreams[0]", "aliases"},
		{"NegativeLatency", "upstreams:\n  - name: a\n    latency: {fixed: -1s}\n", 3, "upstreams[0].latency.fixed", "want 0 to"},
		{"PathWithoutSlash", "upstreams:\n  - name: a\n    path: api\n", 3, "upstreams[0].path", "starting with /"},
		{"TwoDocuments", "upstreams: [{name: a}]\n---\nupstreams: [{name: b}]\n", 2, "", "one YAML document"},
		{"Empty", "", 0, "", "empty"},
		{"NotYAML", "upstreams: [\n", 0, "", "yaml"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := sim.ParseScenario([]byte(tt.doc))
			var se *sim.ScenarioError
			if !errors.As(err, &se) {
				t.Fatalf("got %v, want a *ScenarioError", err)
			}
			if !errors.Is(err, sim.ErrInvalidScenario) {
				t.Errorf("%v does not wrap ErrInvalidScenario", err)
			}
			if se.Line != tt.line || se.Field != tt.field || !strings.Contains(se.Msg, tt.msg) {
				t.Errorf("got line %d field %q msg %q, want line %d field %q msg containing %q",
					se.Line, se.Field, se.Msg, tt.line, tt.field, tt.msg)
			}
		})
	}
}

func TestParseScenarioFillsDefaults(t *testing.T) {
	sc := mustParse(t, `
upstreams:
  - name: a
    limit: {shape: token_bucket, requests: 7}
    outages: [{from: 1s, to: 2s}]
    body_errors: [{style: grants_gov, every: 2}, {style: arcgis, every: 3}]
    collection: {kind: arcgis}
    required_header: {name: X-Key, value: k}
`)
	u := sc.Upstreams[0]
	checks := []struct {
		name      string
		got, want any
	}{
		{"Window", u.Limit.Window, time.Second},
		{"TokenBucketBurstIsRequests", u.Limit.Burst, 7},
		{"RejectStatus", u.Reject.Status, 429},
		{"RetryAfter", u.Reject.RetryAfter, sim.RetryAfterDelta},
		{"Advertise", u.Reject.Advertise, sim.AdvertiseNone},
		{"OutageStatus", u.Outages[0].Status, 503},
		{"GrantsGovCode", u.BodyErrors[0].Code, 1},
		{"ArcGISCode", u.BodyErrors[1].Code, 498},
		{"MaxPage", u.Collection.MaxPage, 1000},
		{"Layer", u.Collection.Layer, "a"},
		{"AuthStatus", u.RequiredHeader.Status, 401},
		{"PerSecond", u.Limit.PerSecond(), 7.0},
	}
	for _, c := range checks {
		t.Run(c.name, func(t *testing.T) {
			if c.got != c.want {
				t.Errorf("got %v, want %v", c.got, c.want)
			}
		})
	}
}

// TestNewValidatesScenariosBuiltInGo: a Scenario built in Go gets the same
// checks as a parsed one, without a line to name.
func TestNewValidatesScenariosBuiltInGo(t *testing.T) {
	sc := &sim.Scenario{Upstreams: []sim.Upstream{{
		Name:  "a",
		Limit: &sim.Limit{Shape: sim.ShapeSlidingWindow, Requests: 10, Window: -time.Second},
	}}}
	_, err := sim.New(sc, clock.NewFake(t0))
	var se *sim.ScenarioError
	if !errors.As(err, &se) || se.Field != "upstreams[0].limit.window" || se.Line != 0 {
		t.Fatalf("got %v, want a *ScenarioError for upstreams[0].limit.window without a line", err)
	}
	sc.Upstreams[0].Limit.Window = 0
	if _, err := sim.New(sc, clock.NewFake(t0)); err != nil {
		t.Fatalf("new: %v", err)
	}
	if sc.Upstreams[0].Limit.Window != sim.DefaultWindow {
		t.Errorf("window %s, want the default %s filled in", sc.Upstreams[0].Limit.Window, sim.DefaultWindow)
	}
}

// TestShippedScenariosLoad: every file in testdata/scenarios parses and
// starts, and the set the fetch loop's tests and make run rely on is there.
func TestShippedScenariosLoad(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join(scenarioDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
		t.Run(filepath.Base(p), func(t *testing.T) {
			sc, err := sim.LoadScenario(p)
			if err != nil {
				t.Fatalf("load: %v", err)
			}
			if _, err := sim.New(sc, clock.NewFake(t0)); err != nil {
				t.Fatalf("new: %v", err)
			}
		})
	}
	for _, want := range []string{
		"leaky_bucket.yaml", "fixed_window.yaml", "sliding_window.yaml", "token_bucket.yaml",
		"halving.yaml", "shared_gateway.yaml", "retry_after_forms.yaml", "outage.yaml",
		"body_errors.yaml", "paging.yaml", "demo.yaml",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("testdata/scenarios lacks %s", want)
		}
	}
}

func TestLoadScenarioNamesTheFile(t *testing.T) {
	_, err := sim.LoadScenario(filepath.Join(scenarioDir, "no-such-file.yaml"))
	if err == nil || !strings.Contains(err.Error(), "no-such-file.yaml") {
		t.Fatalf("got %v, want an error naming the file", err)
	}
}
