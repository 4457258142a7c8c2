package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/auditd/auditd/auth"
	"github.com/getkin/kin-openapi/openapi3"
)

// boundedBody is a request body whose fields openapi.yaml bounds: a valid
// base, and where in it a schema's properties go.
type boundedBody struct {
	name   string
	method string
	path   string
	role   auth.Role
	schema string              // the component schema of the properties
	base   func() any          // a valid body
	at     []string            // the JSON path to the object holding the properties
	field  func(string) string // the field name the server reports for a property
}

func boundedBodies() []boundedBody {
	source := func() any {
		return map[string]any{"base_url": "https://x.example", "limit": 10, "window": "1s"}
	}
	run := func() any {
		return map[string]any{"name": "n", "items": []any{map[string]any{"key": "k", "source": "county", "path": "/q"}}}
	}
	same := func(p string) string { return p }
	return []boundedBody{
		{"Source", "PUT", "/v1/sources/new", auth.RoleAdmin, "Source", source, nil, same},
		{"NewRun", "POST", "/v1/runs", auth.RoleOperator, "NewRun", run, nil, same},
		{"Item", "POST", "/v1/runs", auth.RoleOperator, "Item", run, []string{"items", "0"}, func(p string) string { return "items[0]." + p }},
	}
}

// boundCase is a value at or past one of openapi.yaml's bounds.
type boundCase struct {
	name  string // schema.property/bound
	field string // the field the server must name
	value any
}

// schemaBounds derives, from the properties of a schema (objects nested in
// it too: breaker), values just past every bound the contract states
// (minimum, maximum, minLength, maxLength, maxItems, maxProperties, enum,
// pattern) and, in ok, values exactly at the numeric bounds.
func schemaBounds(s *openapi3.Schema, prefix string) (bad, ok []boundCase) {
	names := make([]string, 0, len(s.Properties))
	for n := range s.Properties {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := s.Properties[n].Value
		path := prefix + n
		add := func(bound string, v any) { bad = append(bad, boundCase{path + "/" + bound, path, v}) }
		switch {
		case p.Type.Is("integer"):
			if p.Min != nil {
				add("minimum", int(*p.Min)-1)
				ok = append(ok, boundCase{path + "/minimum", path, int(*p.Min)})
			}
			if p.Max != nil {
				add("maximum", int(*p.Max)+1)
				ok = append(ok, boundCase{path + "/maximum", path, int(*p.Max)})
			}
		case p.Type.Is("string"):
			if p.MaxLength != nil {
				add("maxLength", stringOf(path, int(*p.MaxLength)+1))
			}
			if p.MinLength > 0 {
				add("minLength", "")
			}
			if len(p.Enum) > 0 {
				add("enum", "not-in-the-enum")
			}
			if p.Pattern != "" && p.Enum == nil {
				if v, found := failing(p.Pattern); found {
					add("pattern", v)
				}
			}
		case p.Type.Is("array"):
			if p.MaxItems != nil && *p.MaxItems <= 1000 {
				list := make([]any, *p.MaxItems+1)
				for i := range list {
					list[i] = fmt.Sprintf("n%d", i)
				}
				add("maxItems", list)
			}
			if p.MinItems > 0 {
				add("minItems", []any{})
			}
			if it := p.Items; it != nil && it.Value.Type.Is("string") {
				if it.Value.MaxLength != nil {
					bad = append(bad, boundCase{path + "[0]/maxLength", path + "[0]", []any{strings.Repeat("q", int(*it.Value.MaxLength)+1)}})
				}
				if it.Value.MinLength > 0 {
					bad = append(bad, boundCase{path + "[0]/minLength", path + "[0]", []any{""}})
				}
			}
		case p.Type.Is("object") && p.AdditionalProperties.Schema != nil:
			if p.MaxProps != nil {
				m := map[string]any{}
				for i := range int(*p.MaxProps) + 1 {
					m[fmt.Sprintf("X-H%d", i)] = "v"
				}
				add("maxProperties", m)
			}
			if v := p.AdditionalProperties.Schema.Value; v.Pattern != "" {
				if s, found := failing(v.Pattern); found {
					bad = append(bad, boundCase{path + "[X-H]/pattern", path + "[X-H]", map[string]any{"X-H": s}})
				}
			}
			if v := p.AdditionalProperties.Schema.Value; v.MaxLength != nil {
				bad = append(bad, boundCase{path + "[X-H]/maxLength", path + "[X-H]", map[string]any{"X-H": strings.Repeat("v", int(*v.MaxLength)+1)}})
			}
		case p.Type.Is("object"):
			b, o := schemaBounds(p, path+".")
			bad, ok = append(bad, b...), append(ok, o...)
		}
	}
	return bad, ok
}

// stringOf is a string of n characters that is valid for the field in
// every way but its length.
func stringOf(path string, n int) string {
	switch {
	case strings.HasSuffix(path, "base_url"):
		return "https://x.example/" + strings.Repeat("a", n-len("https://x.example/"))
	case strings.HasSuffix(path, "path"):
		return "/" + strings.Repeat("a", n-1)
	}
	return strings.Repeat("a", n)
}

// failing returns a value the pattern refuses.
func failing(pattern string) (string, bool) {
	re := regexp.MustCompile(pattern)
	for _, v := range []string{"bogus", "a\r\nb", "/a b", "1h2", "x"} {
		if !re.MatchString(v) {
			return v, true
		}
	}
	return "", false
}

// with returns base with value set at the JSON path at+key.
func with(base any, at []string, key string, value any) any {
	b, _ := json.Marshal(base)
	var v any
	json.Unmarshal(b, &v)
	cur := v
	for _, k := range at {
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[k]
			if !ok {
				next = map[string]any{}
				c[k] = next
			}
			cur = next
		case []any:
			var i int
			fmt.Sscan(k, &i)
			cur = c[i]
		}
	}
	// A nested property ("breaker.threshold") is an object of its own.
	parts := strings.Split(key, ".")
	m := cur.(map[string]any)
	for _, p := range parts[:len(parts)-1] {
		next, ok := m[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[p] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = value
	return v
}

// specCases are TestBadInput's cases derived from openapi.yaml: a value
// just past each bound of each bounded body's schema, refused with 400
// naming the field. The same bodies are first checked to be refused by
// the spec itself, so neither side can move a bound alone.
func specCases(t *testing.T, doc *openapi3.T) []badCase {
	t.Helper()
	var cases []badCase
	for _, bb := range boundedBodies() {
		bad, _ := boundsOf(t, doc, bb)
		for _, bc := range bad {
			body := bodyWith(bb, bc)
			if err := specAccepts(t, doc, bb, body); err == nil {
				t.Errorf("%s/%s: openapi.yaml accepts %s; the generated value is not past the bound", bb.name, bc.name, body)
				continue
			}
			cases = append(cases, badCase{"Spec/" + bb.name + "/" + bc.name,
				request{method: bb.method, path: bb.path, body: body}, bb.role, http.StatusBadRequest, bb.field(bc.field)})
		}
	}
	return cases
}

func boundsOf(t *testing.T, doc *openapi3.T, bb boundedBody) (bad, ok []boundCase) {
	t.Helper()
	ref := doc.Components.Schemas[bb.schema]
	if ref == nil {
		t.Fatalf("openapi.yaml has no schema %s", bb.schema)
	}
	return schemaBounds(ref.Value, "")
}

// bodyWith is bb's valid body with bc's value in place.
func bodyWith(bb boundedBody, bc boundCase) string {
	key, _, _ := strings.Cut(bc.field, "[")
	b, _ := json.Marshal(with(bb.base(), bb.at, key, bc.value))
	return string(b)
}

// specAccepts validates a body against the schema of its request.
func specAccepts(t *testing.T, doc *openapi3.T, bb boundedBody, body string) error {
	t.Helper()
	schema := "NewRun"
	if bb.method == "PUT" {
		schema = "Source"
	}
	var v any
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		t.Fatal(err)
	}
	return doc.Components.Schemas[schema].Value.VisitJSON(v)
}

// TestSpecBoundsAccepted: a value exactly at each numeric bound of
// openapi.yaml is accepted by the spec and by the server, the other half
// of TestBadInput's spec cases: together they hold the server to the
// contract's bounds from both sides.
func TestSpecBoundsAccepted(t *testing.T) {
	e := newEnv(t)
	doc := loadSpec(t)
	n := 0
	for _, bb := range boundedBodies() {
		_, ok := boundsOf(t, doc, bb)
		for _, bc := range ok {
			n++
			t.Run(bb.name+"/"+bc.name, func(t *testing.T) {
				body := bodyWith(bb, bc)
				if err := specAccepts(t, doc, bb, body); err != nil {
					t.Fatalf("openapi.yaml refuses %s: %v", body, err)
				}
				r := e.do(request{method: bb.method, path: bb.path, body: body, secret: e.secret[bb.role]})
				if r.status/100 != 2 {
					t.Fatalf("%d for %s: %s", r.status, body, r.body)
				}
			})
		}
	}
	if n < 15 {
		t.Fatalf("only %d bounds found; the walk is broken", n)
	}
}
