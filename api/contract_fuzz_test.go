package api_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/auth"
	"github.com/getkin/kin-openapi/openapi3"
	"pgregory.net/rapid"
)

// TestContractFuzz sends requests generated from openapi.yaml to every
// operation, valid ones and invalid ones (values out of bounds, of the
// wrong type, missing, unknown, junk bodies, bad tokens), and holds every
// answer to the contract: no 5xx; every 4xx a problem; every answer one
// openapi.yaml declares, and every request it refuses refused (specCheck);
// no write from a refused request (the ledger's head unchanged).
//
// Each check is one request: -rapid.checks sets how many (100 by default;
// make fuzz sends 5,000). A failure is shrunk to a small request.
func TestContractFuzz(t *testing.T) {
	e := newEnv(t, withRetention(), withLog())
	e.srv.Proxy = fakeProxy{status: http.StatusOK, header: http.Header{"Content-Type": {"application/json"}}, body: `{"features":[]}`}
	ops := contractOperations(loadSpec(t))
	if len(ops) < 40 {
		t.Fatalf("%d operations in openapi.yaml; the walk is broken", len(ops))
	}
	g := &requestGen{e: e}
	statuses := map[int]int{}
	hit := map[string]bool{}
	sent := 0
	before, refusedBefore := e.spec.requests.Load(), e.spec.refused.Load()
	rapid.Check(t, func(rt *rapid.T) {
		e.spec.t = rt
		defer func() { e.spec.t = t }()
		op := rapid.SampledFrom(ops).Draw(rt, "operation")
		req := g.request(rt, op)
		head := e.head()
		resp, err := e.client.Do(req)
		if err != nil {
			rt.Fatalf("%s %s: %v", op.method, op.path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sent++
		statuses[resp.StatusCode]++
		hit[op.method+" "+op.path] = true
		switch st := resp.StatusCode; {
		case st >= 500:
			rt.Fatalf("%s %s: %d\n%s", req.Method, req.URL, st, body)
		case st >= 400:
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				rt.Fatalf("%s %s: %d with Content-Type %q", req.Method, req.URL, st, ct)
			}
			if after := e.head(); after != head {
				rt.Fatalf("%s %s: refused with %d, yet wrote %d ledger events: %+v", req.Method, req.URL, st, after-head, e.eventsAfter(head))
			}
		}
	})
	var codes []string
	for _, st := range slices.Sorted(mapKeys(statuses)) {
		codes = append(codes, fmt.Sprintf("%d×%d", statuses[st], st))
	}
	t.Logf("%d requests over %d of %d operations, %d of them refused by the contract itself; answers: %s",
		sent, len(hit), len(ops), e.spec.refused.Load()-refusedBefore, strings.Join(codes, " "))
	if got := e.spec.requests.Load() - before; got < int64(sent) {
		t.Errorf("the contract checked %d of %d requests", got, sent)
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// contractOp is one operation of openapi.yaml.
type contractOp struct {
	method, path string
	params       openapi3.Parameters
	body         *openapi3.Schema // the JSON body's schema; nil when it takes none
	rawBody      bool             // a body of any type (the proxy's POST)
}

func contractOperations(doc *openapi3.T) []contractOp {
	var ops []contractOp
	paths := doc.Paths.Map()
	keys := make([]string, 0, len(paths))
	for p := range paths {
		keys = append(keys, p)
	}
	sort.Strings(keys)
	for _, p := range keys {
		item := paths[p]
		methods := item.Operations()
		names := make([]string, 0, len(methods))
		for m := range methods {
			names = append(names, m)
		}
		sort.Strings(names)
		for _, m := range names {
			o := methods[m]
			op := contractOp{method: m, path: p, params: append(slices.Clone(item.Parameters), o.Parameters...)}
			if rb := o.RequestBody; rb != nil && rb.Value != nil {
				if mt := rb.Value.Content.Get("application/json"); mt != nil && mt.Schema != nil {
					op.body = mt.Schema.Value
				} else {
					op.rawBody = true
				}
			}
			ops = append(ops, op)
		}
	}
	return ops
}

// requestGen draws requests: each value valid with the contract's
// schema, a known good fixture, or junk. Half the requests are drawn
// meaning to be good (no junk, a token of a role): the contract decides
// which of them are.
type requestGen struct {
	e    *env
	good bool // the request being drawn means to be good
}

func (g *requestGen) request(rt *rapid.T, op contractOp) *http.Request {
	g.good = rapid.Bool().Draw(rt, "good")
	path := op.path
	query := url.Values{}
	header := http.Header{}
	for _, pr := range op.params {
		p := pr.Value
		if !p.Required && !rapid.Bool().Draw(rt, "with "+p.Name) {
			continue
		}
		v := g.param(rt, op, p)
		switch p.In {
		case openapi3.ParameterInPath:
			path = strings.Replace(path, "{"+p.Name+"}", url.PathEscape(v), 1)
		case openapi3.ParameterInQuery:
			query.Set(p.Name, v)
		case openapi3.ParameterInHeader:
			// A value net/http cannot send is no request at all.
			header.Set(p.Name, strings.Map(func(r rune) rune {
				if r < ' ' && r != '\t' || r == 0x7f {
					return -1
				}
				return r
			}, v))
		}
	}
	if !g.good && rapid.IntRange(0, 9).Draw(rt, "unknown query") == 0 {
		query.Set("unknown", "1")
	}
	var body []byte
	switch {
	case op.body != nil:
		switch rapid.IntRange(0, 9).Draw(rt, "body kind") {
		case 0:
			if g.good {
				body, _ = json.Marshal(g.value(rt, op.body, "body", 0))
				break
			}
			body = []byte(rapid.SampledFrom([]string{"", "null", "[]", "{", `{"a":1}{}`, "\x00\xff", "hello"}).Draw(rt, "junk body"))
		default:
			body, _ = json.Marshal(g.value(rt, op.body, "body", 0))
		}
		ct := rapid.SampledFrom([]string{"application/json", "application/json", "application/json", "text/plain", ""}).Draw(rt, "content type")
		if g.good {
			ct = "application/json"
		}
		if ct != "" {
			header.Set("Content-Type", ct)
		}
	case op.rawBody && rapid.Bool().Draw(rt, "raw body"):
		body = []byte(rapid.String().Draw(rt, "raw"))
		header.Set("Content-Type", "application/octet-stream")
	}
	who := rapid.SampledFrom([]string{"admin", "admin", "operator", "auditor", "none", "revoked", "garbage"}).Draw(rt, "token")
	if g.good {
		who = rapid.SampledFrom([]string{"admin", "operator", "auditor"}).Draw(rt, "good token")
	}
	switch who {
	case "none":
	case "revoked":
		header.Set("Authorization", "Bearer "+g.e.revoked)
	case "garbage":
		header.Set("Authorization", rapid.SampledFrom([]string{"Bearer", "Bearer x", "Basic YTpi", "bearer " + strings.Repeat("z", 300)}).Draw(rt, "garbage token"))
	default:
		header.Set("Authorization", "Bearer "+g.e.secret[auth.Role(who)])
	}
	target := g.e.url + path
	if len(query) > 0 {
		target += "?" + query.Encode()
	}
	req, err := http.NewRequest(op.method, target, bytes.NewReader(body))
	if err != nil {
		rt.Fatalf("build %s %s: %v", op.method, target, err)
	}
	if body == nil {
		req.Body, req.ContentLength = http.NoBody, 0
	}
	for k, v := range header {
		req.Header[k] = v
	}
	return req
}

// param draws a parameter's value: a fixture the server knows, one drawn
// from its schema, or junk.
func (g *requestGen) param(rt *rapid.T, op contractOp, p *openapi3.Parameter) string {
	label := "param " + p.Name
	switch rapid.IntRange(0, 5).Draw(rt, label+" kind") {
	case 0:
		if g.good {
			return g.fixture(rt, op, p.Name, label)
		}
		return junkString(rt, label)
	case 1, 2:
		if p.Schema != nil && p.Schema.Value != nil {
			return text(g.value(rt, p.Schema.Value, p.Name, 0))
		}
	}
	return g.fixture(rt, op, p.Name, label)
}

// fixture is a value of a parameter the test server knows.
func (g *requestGen) fixture(rt *rapid.T, op contractOp, name, label string) string {
	head := int(g.e.head())
	switch {
	case name == "id" && strings.HasPrefix(op.path, "/v1/runs/"):
		return g.e.runID
	case name == "id" && strings.HasPrefix(op.path, "/v1/sources/"):
		return rapid.SampledFrom([]string{"county", "city", "fuzz-src"}).Draw(rt, label)
	case name == "key":
		return rapid.SampledFrom([]string{"a", "b"}).Draw(rt, label)
	case name == "fain" || name == "award":
		return rapid.SampledFrom([]string{"F-1", "F-2"}).Draw(rt, label)
	case name == "seq" || name == "size" || name == "from" && strings.HasPrefix(op.path, "/v1/ledger") || name == "to" && strings.HasPrefix(op.path, "/v1/ledger") || name == "old" || name == "new":
		return strconv.Itoa(rapid.IntRange(0, head+2).Draw(rt, label))
	case name == "source":
		return "county"
	case name == "path":
		return "layer/0/query"
	case name == "Auditd-Run":
		return g.e.runID
	case name == "limit":
		return strconv.Itoa(rapid.IntRange(0, 1001).Draw(rt, label))
	}
	return rapid.StringMatching(`[a-z0-9-]{1,12}`).Draw(rt, label)
}

// value draws a value of schema s: valid most of the time, and now and
// then of the wrong type, out of its bounds, or junk. name is the field's
// name, which picks a fixture for fields that must name something known.
func (g *requestGen) value(rt *rapid.T, s *openapi3.Schema, name string, depth int) any {
	label := fmt.Sprintf("%s@%d", name, depth)
	if !g.good && rapid.IntRange(0, 14).Draw(rt, label+" junk?") == 0 {
		return rapid.SampledFrom([]any{nil, 7, -1, "x", "", " county", "Peñasco", true, []any{}, map[string]any{}, strings.Repeat("a", 5000)}).Draw(rt, label+" junk")
	}
	if len(s.AllOf) > 0 && s.AllOf[0].Value != nil {
		s = s.AllOf[0].Value
	}
	switch name {
	case "source":
		if rapid.IntRange(0, 3).Draw(rt, label+" known") > 0 {
			return "county"
		}
	case "path":
		if rapid.Bool().Draw(rt, label+" known") {
			return "/layer/0/query?f=json&token=abc"
		}
	case "base_url":
		if rapid.Bool().Draw(rt, label+" known") {
			return "https://fuzz.example.gov/api"
		}
	case "deadline":
		return time.Now().Add(time.Duration(rapid.IntRange(-48, 48).Draw(rt, label)) * time.Hour).UTC().Format(time.RFC3339)
	case "window", "retry_after_cap", "cooldown", "idle_timeout", "deadline_proxy":
		return rapid.SampledFrom([]string{"1s", "1m", "250ms", "0s", "200000h", "-1s", "soon"}).Draw(rt, label)
	case "final_report", "retain_until":
		return rapid.SampledFrom([]string{"2020-06-30", "2030-01-15", "15/01/2026", ""}).Draw(rt, label)
	}
	switch {
	case s.Type.Is(openapi3.TypeString):
		switch {
		case len(s.Enum) > 0:
			return rapid.SampledFrom(s.Enum).Draw(rt, label)
		case s.Format == "date-time":
			return time.Now().Add(time.Duration(rapid.IntRange(-48, 48).Draw(rt, label)) * time.Hour).UTC().Format(time.RFC3339)
		case s.Format == "byte":
			return base64.StdEncoding.EncodeToString([]byte(rapid.String().Draw(rt, label)))
		case s.Pattern != "":
			return rapid.StringMatching(s.Pattern).Draw(rt, label)
		}
		return rapid.StringN(0, 40, -1).Draw(rt, label)
	case s.Type.Is(openapi3.TypeInteger):
		lo, hi := -5, 1_000_000
		if s.Min != nil {
			lo = int(*s.Min) - 1
		}
		if s.Max != nil {
			hi = int(*s.Max) + 1
		}
		return rapid.IntRange(lo, hi).Draw(rt, label)
	case s.Type.Is(openapi3.TypeBoolean):
		return rapid.Bool().Draw(rt, label)
	case s.Type.Is(openapi3.TypeArray):
		n := rapid.IntRange(0, 3).Draw(rt, label+" len")
		out := make([]any, 0, n)
		for i := range n {
			if s.Items == nil || s.Items.Value == nil || depth > 4 {
				break
			}
			v := g.value(rt, s.Items.Value, name, depth+1)
			if m, ok := v.(map[string]any); ok && name == "items" {
				m["key"] = fmt.Sprintf("k%d", i) // unique keys, mostly
			}
			out = append(out, v)
		}
		return out
	case s.Type.Is(openapi3.TypeObject) || len(s.Properties) > 0:
		out := map[string]any{}
		if depth > 4 {
			return out
		}
		props := make([]string, 0, len(s.Properties))
		for p := range s.Properties {
			props = append(props, p)
		}
		sort.Strings(props)
		for _, p := range props {
			if !slices.Contains(s.Required, p) && !rapid.Bool().Draw(rt, label+" has "+p) {
				continue
			}
			if ps := s.Properties[p]; ps != nil && ps.Value != nil {
				out[p] = g.value(rt, ps.Value, p, depth+1)
			}
		}
		if !g.good && rapid.IntRange(0, 9).Draw(rt, label+" unknown field") == 0 {
			out["unknown_field"] = 1
		}
		return out
	}
	return nil
}

// junkString is a parameter value no schema asks for.
func junkString(rt *rapid.T, label string) string {
	return rapid.OneOf(
		rapid.SampledFrom([]string{"", " ", " county", "county ", "Peñasco", "..", "%zz", "a/b", strings.Repeat("x", 300), "-1", "0", "1e3", "null"}),
		rapid.String(),
	).Draw(rt, label+" junk")
}

// text is a drawn value as a parameter carries it.
func text(v any) string {
	switch v := v.(type) {
	case string:
		return v
	case nil:
		return ""
	}
	b, _ := json.Marshal(v)
	return strings.Trim(string(b), `"`)
}
