package api_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// run builds a POST /v1/runs body from the given JSON fragments of its
// first item and of the run itself.
func runBody(item, extra string) string {
	if item == "" {
		item = `"key":"k1","source":"county","path":"/q"`
	}
	if extra != "" {
		extra = "," + extra
	}
	return `{"name":"n","items":[{` + item + `}]` + extra + `}`
}

// TestBadInput sends malformed and invalid requests across the routes: each
// gets a 4xx problem naming the field where there is one, and none of them
// writes anything: not to the ledger, not a run, not a source, not a token.
func TestBadInput(t *testing.T) {
	e := newEnv(t)
	runs := "/v1/runs/" + e.runID
	cursor := func(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }
	cases := []badCase{
		// POST /v1/runs: the envelope.
		{"RunMalformedJSON", request{method: "POST", path: "/v1/runs", body: `{"name":`}, auth.RoleOperator, 400, ""},
		{"RunNotJSON", request{method: "POST", path: "/v1/runs", body: `hello`}, auth.RoleOperator, 400, ""},
		{"RunEmptyBody", request{method: "POST", path: "/v1/runs", ctype: "application/json", header: map[string]string{"Content-Type": "application/json"}}, auth.RoleOperator, 400, ""},
		{"RunArrayBody", request{method: "POST", path: "/v1/runs", body: `[]`}, auth.RoleOperator, 400, ""},
		{"RunNullBody", request{method: "POST", path: "/v1/runs", body: `null`}, auth.RoleOperator, 400, "name"},
		{"RunTrailingData", request{method: "POST", path: "/v1/runs", body: runBody("", "") + `{}`}, auth.RoleOperator, 400, ""},
		{"RunUnknownField", request{method: "POST", path: "/v1/runs", body: runBody("", `"priority":1`)}, auth.RoleOperator, 400, "priority"},
		{"RunUnknownItemField", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","verb":"GET"`, "")}, auth.RoleOperator, 400, "verb"},
		{"RunWrongContentType", request{method: "POST", path: "/v1/runs", body: runBody("", ""), ctype: "text/plain"}, auth.RoleOperator, 415, ""},
		{"RunTooLarge", request{method: "POST", path: "/v1/runs", body: runBody("", `"replay":false`+strings.Repeat(" ", 300<<10))}, auth.RoleOperator, 413, ""},
		// POST /v1/runs: types.
		{"RunNameNotString", request{method: "POST", path: "/v1/runs", body: `{"name":7,"items":[]}`}, auth.RoleOperator, 400, "name"},
		{"RunItemsNotArray", request{method: "POST", path: "/v1/runs", body: `{"name":"n","items":{}}`}, auth.RoleOperator, 400, "items"},
		{"RunPageSizeNotInt", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","page_size":"ten"`, "")}, auth.RoleOperator, 400, "items.page_size"},
		{"RunBadDeadline", request{method: "POST", path: "/v1/runs", body: runBody("", `"deadline":"tomorrow"`)}, auth.RoleOperator, 400, ""},
		{"RunBodyNotBase64", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","body":"%%%"`, "")}, auth.RoleOperator, 400, ""},
		// POST /v1/runs: validation.
		{"RunNoName", request{method: "POST", path: "/v1/runs", body: `{"items":[{"key":"k","source":"county","path":"/"}]}`}, auth.RoleOperator, 400, "name"},
		{"RunNameTooLong", request{method: "POST", path: "/v1/runs", body: `{"name":"` + strings.Repeat("n", 201) + `","items":[{"key":"k","source":"county","path":"/"}]}`}, auth.RoleOperator, 400, "name"},
		{"RunNoItems", request{method: "POST", path: "/v1/runs", body: `{"name":"n","items":[]}`}, auth.RoleOperator, 400, "items"},
		{"RunItemNoKey", request{method: "POST", path: "/v1/runs", body: runBody(`"source":"county","path":"/"`, "")}, auth.RoleOperator, 400, "items[0].key"},
		{"RunItemKeyTooLong", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"`+strings.Repeat("k", 201)+`","source":"county","path":"/"`, "")}, auth.RoleOperator, 400, "items[0].key"},
		{"RunItemPathRelative", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"q"`, "")}, auth.RoleOperator, 400, "items[0].path"},
		{"RunItemMethodPut", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","method":"PUT"`, "")}, auth.RoleOperator, 400, "items[0].method"},
		{"RunItemPagingUnknown", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","paging":"cursor"`, "")}, auth.RoleOperator, 400, "items[0].paging"},
		{"RunItemPageSizeTooBig", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","page_size":20000`, "")}, auth.RoleOperator, 400, "items[0].page_size"},
		{"RunItemUnknownSource", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"nowhere","path":"/"`, "")}, auth.RoleOperator, 400, "items[0].source"},
		{"RunDuplicateKeys", request{method: "POST", path: "/v1/runs", body: `{"name":"n","items":[{"key":"k","source":"county","path":"/"},{"key":"k","source":"county","path":"/2"}]}`}, auth.RoleOperator, 400, "items[1].key"},
		{"RunListingNumber", request{method: "POST", path: "/v1/runs", body: runBody("", `"award":{"listing_number":"10-555"}`)}, auth.RoleOperator, 400, "award.listing_number"},
		{"RunAwardYear", request{method: "POST", path: "/v1/runs", body: runBody("", `"award":{"award_year":1800}`)}, auth.RoleOperator, 400, "award.award_year"},
		{"RunUEILowerCase", request{method: "POST", path: "/v1/runs", body: runBody("", `"award":{"recipient_uei":"abcdef123456"}`)}, auth.RoleOperator, 400, "award.recipient_uei"},
		{"RunDeadlinePast", request{method: "POST", path: "/v1/runs", body: runBody("", `"deadline":"2020-01-01T00:00:00Z"`)}, auth.RoleOperator, 400, "deadline"},
		{"RunIdleTimeoutNotOpen", request{method: "POST", path: "/v1/runs", body: runBody("", `"idle_timeout":"10m"`)}, auth.RoleOperator, 400, "idle_timeout"},
		{"RunOpenIdleTimeoutTooLong", request{method: "POST", path: "/v1/runs", body: `{"name":"n","open":true,"items":[],"idle_timeout":"200h"}`}, auth.RoleOperator, 400, "idle_timeout"},
		{"RunIdempotencyKeyTooLong", request{method: "POST", path: "/v1/runs", body: runBody("", ""), header: map[string]string{"Idempotency-Key": strings.Repeat("k", 201)}}, auth.RoleOperator, 400, "Idempotency-Key"},
		// PUT /v1/sources/{id}.
		{"SourceIDMismatch", request{method: "PUT", path: "/v1/sources/county", body: `{"id":"city","base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		{"SourceBaseURLMissing", request{method: "PUT", path: "/v1/sources/new", body: `{}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLNotURL", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"not a url"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceWindowWords", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","window":"fast"}`}, auth.RoleAdmin, 400, "window"},
		{"SourceWindowNegative", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","window":"-1s"}`}, auth.RoleAdmin, 400, "window"},
		{"SourceWindowOverLimiterMax", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","limit":1,"window":"200000h"}`}, auth.RoleAdmin, 400, "window"},
		{"SourceLimitNegative", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","limit":-5}`}, auth.RoleAdmin, 400, "limit"},
		{"SourceTierUnknown", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","tier":"ultra"}`}, auth.RoleAdmin, 400, "tier"},
		{"SourceTooManyHeaders", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","headers":{` + manyHeaders(21) + `}}`}, auth.RoleAdmin, 400, "headers"},
		{"SourceUnknownField", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","rate_limit":3}`}, auth.RoleAdmin, 400, "rate_limit"},
		{"SourceBreakerThreshold", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","breaker":{"threshold":5000}}`}, auth.RoleAdmin, 400, "breaker.threshold"},
		{"SourceBreakerCooldownWords", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","breaker":{"cooldown":"soon"}}`}, auth.RoleAdmin, 400, "breaker.cooldown"},
		{"SourceBreakerProbesZero", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","breaker":{"probes":0}}`}, auth.RoleAdmin, 400, "breaker.probes"},
		{"RunItemPageSizeZero", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/","page_size":0`, "")}, auth.RoleOperator, 400, "items[0].page_size"},
		{"SourcePathIDTooLong", request{method: "PUT", path: "/v1/sources/" + strings.Repeat("s", 101), body: `{"base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		// Lists and queries.
		{"RunsLimitZero", request{path: "/v1/runs?limit=0"}, auth.RoleAuditor, 400, "limit"},
		{"RunsLimitWord", request{path: "/v1/runs?limit=lots"}, auth.RoleAuditor, 400, "limit"},
		{"RunsLimitTooBig", request{path: "/v1/runs?limit=1001"}, auth.RoleAuditor, 400, "limit"},
		{"RunsStatusUnknown", request{path: "/v1/runs?status=done"}, auth.RoleAuditor, 400, "status"},
		{"RunsFromNotTime", request{path: "/v1/runs?from=yesterday"}, auth.RoleAuditor, 400, "from"},
		{"RunsToBeforeFrom", request{path: "/v1/runs?from=2026-02-01&to=2026-01-01"}, auth.RoleAuditor, 400, "to"},
		{"RunsCursorGarbage", request{path: "/v1/runs?cursor=%21%21%21"}, auth.RoleAuditor, 400, "cursor"},
		{"EventsCursorNotSeq", request{path: runs + "/events?cursor=" + cursor("abc")}, auth.RoleAuditor, 400, "cursor"},
		{"EventsTypeUnknown", request{path: runs + "/events?type=dispatch,teleport"}, auth.RoleAuditor, 400, "type"},
		{"ItemsCursorUnknownKey", request{path: runs + "/items?cursor=" + cursor("zzz")}, auth.RoleAuditor, 400, "cursor"},
		{"ReconciliationFormat", request{path: runs + "/reconciliation?format=pdf"}, auth.RoleAuditor, 400, "format"},
		{"EvidenceNoAward", request{path: "/v1/evidence.xlsx"}, auth.RoleAuditor, 400, "award"},
		{"EvidenceBadFrom", request{path: "/v1/evidence.xlsx?award=F-1&from=03/01/2026"}, auth.RoleAuditor, 400, "from"},
		{"PackNoAward", request{path: "/v1/evidence-pack.zip"}, auth.RoleAuditor, 400, "award"},
		{"PackBadTo", request{path: "/v1/evidence-pack.zip?award=F-1&to=tomorrow"}, auth.RoleAuditor, 400, "to"},
		{"ProofNotNumber", request{path: "/v1/ledger/proof/abc"}, auth.RoleAuditor, 400, "seq"},
		{"ProofZero", request{path: "/v1/ledger/proof/0"}, auth.RoleAuditor, 400, "seq"},
		{"ProofBeyondHead", request{path: "/v1/ledger/proof/999999"}, auth.RoleAuditor, 404, ""},
		// Tokens.
		{"TokenRoleUnknown", request{method: "POST", path: "/v1/tokens", body: `{"name":"x","role":"root"}`}, auth.RoleAdmin, 400, "role"},
		{"TokenNoName", request{method: "POST", path: "/v1/tokens", body: `{"role":"auditor"}`}, auth.RoleAdmin, 400, "name"},
		{"TokenUnknownField", request{method: "POST", path: "/v1/tokens", body: `{"name":"x","role":"auditor","ttl":3}`}, auth.RoleAdmin, 400, "ttl"},
		{"TokenRevokeUnknown", request{method: "DELETE", path: "/v1/tokens/tok_nope"}, auth.RoleAdmin, 404, ""},
		// Acknowledgements.
		{"AckEmpty", request{method: "POST", path: runs + "/acknowledgements", body: `{"items":[]}`}, auth.RoleOperator, 400, "items"},
		{"AckUndeliveredItem", request{method: "POST", path: runs + "/acknowledgements", body: `{"items":["b"]}`}, auth.RoleOperator, 400, "items[0]"},
		{"AckUnknownRun", request{method: "POST", path: "/v1/runs/nope/acknowledgements", body: `{"items":["a"]}`}, auth.RoleOperator, 404, ""},
		// Routing.
		{"UnknownRoute", request{path: "/v1/nothing-here"}, auth.RoleAuditor, 404, ""},
		{"WrongMethod", request{method: "PATCH", path: "/v1/runs"}, auth.RoleOperator, 405, ""},
		{"GetOnAPostRoute", request{path: runs + "/cancel"}, auth.RoleOperator, 405, ""},
		{"GetOnADeleteRoute", request{path: "/v1/tokens/tok_x"}, auth.RoleAdmin, 405, ""},
		{"GetUnderAPostRoute", request{path: runs + "/cancel/more"}, auth.RoleOperator, 404, ""},
		{"UnknownRun", request{path: "/v1/runs/01JNOPE"}, auth.RoleAuditor, 404, ""},
		{"CancelFinishedRun", request{method: "POST", path: runs + "/cancel"}, auth.RoleOperator, 409, ""},
		// Issue 16: what was accepted and written.
		{"CursorNotEscaped", request{path: "/v1/runs?cursor=%zz"}, auth.RoleAuditor, 400, "cursor"},
		{"ItemsCursorNotEscaped", request{path: runs + "/items?cursor=%zz&limit=1"}, auth.RoleAuditor, 400, "cursor"},
		{"QuerySemicolon", request{path: "/v1/runs?limit=1;x=2"}, auth.RoleAuditor, 400, "limit"},
		{"SourceIDEncodedSlash", request{method: "PUT", path: "/v1/sources/..%2F..%2Fetc", body: `{"base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		{"SourceIDEncodedSlashGet", request{path: "/v1/sources/..%2Fcounty"}, auth.RoleAuditor, 404, ""},
		{"SourceBaseURLUserinfo", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"http://user:PW@x.example"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLUserOnly", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://tok@x.example/api"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLApiKey", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example/q?api_key=PW"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLQuery", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example/q?f=json"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLFragment", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example/#x"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLSchemeHTTPX", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"httpx://x.example"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLOpaque", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"http:foo"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLNoHost", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"http:///path"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLHexHost", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"http://0x7f000001"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceBaseURLDecimalHost", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"http://2130706433/"}`}, auth.RoleAdmin, 400, "base_url"},
		{"SourceHeaderCRLF", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","headers":{"X-Api-Key":"a\r\nX-Evil: 1"}}`}, auth.RoleAdmin, 400, "headers[X-Api-Key]"},
		{"SourceHeaderNUL", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","headers":{"X-Api-Key":"a\u0000b"}}`}, auth.RoleAdmin, 400, "headers[X-Api-Key]"},
		{"SourceHeaderBadName", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","headers":{"X Api":"v"}}`}, auth.RoleAdmin, 400, "headers"},
		{"SourceSecretQueryEmptyName", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","secret_query":[""]}`}, auth.RoleAdmin, 400, "secret_query[0]"},
		{"RunItemPathSpace", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/p 1?sq=x"`, "")}, auth.RoleOperator, 400, "items[0].path"},
		{"RunItemPathControl", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/p\u0001"`, "")}, auth.RoleOperator, 400, "items[0].path"},
		{"RunItemPathFragment", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":"/p#token=x"`, "")}, auth.RoleOperator, 400, "items[0].path"},
		// Identifiers: printable ASCII without a leading or trailing space.
		{"SourceIDLeadingSpace", request{method: "PUT", path: "/v1/sources/%20county", body: `{"base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		{"SourceIDTrailingSpace", request{method: "PUT", path: "/v1/sources/county%20", body: `{"base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		{"SourceIDNotASCII", request{method: "PUT", path: "/v1/sources/pe%C3%B1asco", body: `{"base_url":"https://x.example"}`}, auth.RoleAdmin, 400, "id"},
		{"SourceGroupTrailingSpace", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","group":"gw "}`}, auth.RoleAdmin, 400, "group"},
		{"RunItemKeyLeadingSpace", request{method: "POST", path: "/v1/runs", body: runBody(`"key":" k","source":"county","path":"/"`, "")}, auth.RoleOperator, 400, "items[0].key"},
		{"RunItemSourceTrailingSpace", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county ","path":"/"`, "")}, auth.RoleOperator, 400, "items[0].source"},
		{"RunAwardFAINSpace", request{method: "POST", path: "/v1/runs", body: runBody("", `"award":{"fain":"F-1 "}`)}, auth.RoleOperator, 400, "award.fain"},
		{"RunIdempotencyKeyEmpty", request{method: "POST", path: "/v1/runs", body: runBody("", ""), header: map[string]string{"Idempotency-Key": ""}}, auth.RoleOperator, 400, "Idempotency-Key"},
		{"TokenNameTrailingSpace", request{method: "POST", path: "/v1/tokens", body: `{"name":"ci ","role":"auditor"}`}, auth.RoleAdmin, 400, "name"},
		{"FAINEmpty", request{path: "/v1/awards//retention"}, auth.RoleAuditor, 400, "fain"},
		{"FAINTooLong", request{path: "/v1/awards/" + strings.Repeat("F", 65) + "/retention"}, auth.RoleAuditor, 400, "fain"},
		{"FAINHoldTooLong", request{method: "POST", path: "/v1/awards/" + strings.Repeat("F", 65) + "/holds", body: `{"reason":"x"}`}, auth.RoleAdmin, 400, "fain"},
		{"ProxyItemKeyEmpty", request{path: "/proxy/county/q", header: map[string]string{"Auditd-Run": "01J00000000000000000000001", "Auditd-Item-Key": ""}}, auth.RoleOperator, 400, "Auditd-Item-Key"},
		// Empty values and nulls are refused, not read as left out.
		{"RunsLimitEmpty", request{path: "/v1/runs?limit="}, auth.RoleAuditor, 400, "limit"},
		{"LedgerEventsToEmpty", request{path: "/v1/ledger/events?to"}, auth.RoleAuditor, 400, "to"},
		{"SourceSecretQueryNull", request{method: "PUT", path: "/v1/sources/new", body: `{"base_url":"https://x.example","secret_query":null}`}, auth.RoleAdmin, 400, "secret_query"},
		{"RunItemPathNull", request{method: "POST", path: "/v1/runs", body: runBody(`"key":"k","source":"county","path":null`, "")}, auth.RoleOperator, 400, "items[0].path"},
		{"EvidenceUnknownAward", request{path: "/v1/evidence.xlsx?award=NO-SUCH-FAIN"}, auth.RoleAuditor, 404, ""},
		{"PackUnknownAward", request{path: "/v1/evidence-pack.zip?award=NO-SUCH-FAIN"}, auth.RoleAuditor, 404, ""},
		{"PackUnknownRun", request{path: "/v1/runs/01J00000000000000000000009/evidence-pack.zip"}, auth.RoleAuditor, 404, ""},
	}
	generated := specCases(t, loadSpec(t))
	if len(generated) < 40 {
		t.Fatalf("%d cases generated from openapi.yaml's bounds; the walk is broken", len(generated))
	}
	cases = append(cases, generated...)
	if len(cases) < 100 {
		t.Fatalf("%d cases; the issue asks for at least 100", len(cases))
	}
	head, nRuns, nSources := e.head(), e.runs.count(), e.sources.count()
	toks, err := e.tokens.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.secret = e.secret[tc.role]
			r := e.do(tc.req)
			if r.status != tc.status {
				t.Fatalf("%d, want %d; body %s", r.status, tc.status, r.body)
			}
			p := r.problem(t)
			if p.Status != tc.status || !strings.HasPrefix(p.Type, "urn:auditd:problem:") || p.RequestID == "" {
				t.Errorf("problem %+v", p)
			}
			if p.Field != tc.field {
				t.Errorf("field %q, want %q (detail %q)", p.Field, tc.field, p.Detail)
			}
		})
	}
	if got := e.eventsAfter(head); len(got) != 0 {
		t.Errorf("rejected requests wrote %d ledger events, first %+v", len(got), got[0])
	}
	if e.runs.count() != nRuns || e.sources.count() != nSources {
		t.Errorf("rejected requests created runs (%d to %d) or sources (%d to %d)", nRuns, e.runs.count(), nSources, e.sources.count())
	}
	after, err := e.tokens.List()
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(toks) {
		t.Errorf("rejected requests changed tokens: %d to %d", len(toks), len(after))
	}
}

// badCase is a request that must be refused with status, naming field.
type badCase struct {
	name   string
	req    request
	role   auth.Role
	status int
	field  string
}

func manyHeaders(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"X-H%d":"v"`, i)
	}
	return b.String()
}

// TestServerErrorsAreGeneric: an internal failure reaches the client as a
// 500 with a generic message and the request id, never the error text.
func TestServerErrorsAreGeneric(t *testing.T) {
	e := newEnv(t)
	e.srv.Reports = failingReports{}
	r := e.do(request{path: "/v1/runs/" + e.runID + "/reconciliation", secret: e.secret[auth.RoleAuditor]})
	if r.status != http.StatusInternalServerError {
		t.Fatalf("%d, want 500", r.status)
	}
	p := r.problem(t)
	if strings.Contains(p.Detail, "disk on fire") || !strings.Contains(p.Detail, p.RequestID) || p.Code != "internal" {
		t.Errorf("problem leaks or lacks the request id: %+v", p)
	}
}

type failingReports struct{ fakeReports }

func (failingReports) WriteReconciliation(context.Context, io.Writer, string, string) error {
	return errors.New("disk on fire")
}

// TestGetOnAPostRoute: a GET on a route that takes other methods only is
// a 405 naming them in Allow and in its detail, as any other method the
// route does not take is, though the UI's catch-all answers every GET no
// route takes.
func TestGetOnAPostRoute(t *testing.T) {
	e := newEnv(t)
	for path, want := range map[string]string{
		"/v1/runs/01J00000000000000000000001/cancel": "OPTIONS, POST",
		"/v1/tokens/tok_x":                           "OPTIONS, DELETE",
	} {
		r := e.do(request{path: path})
		if r.status != http.StatusMethodNotAllowed || r.header.Get("Allow") != want {
			t.Errorf("GET %s: %d, Allow %q; want 405, Allow %q", path, r.status, r.header.Get("Allow"), want)
			continue
		}
		if p := r.problem(t); p.Code != "method_not_allowed" || !strings.Contains(p.Detail, want) {
			t.Errorf("GET %s: problem %+v", path, p)
		}
	}
	if r := e.do(request{path: "/v1/runs/01J00000000000000000000001/cancel/more"}); r.status != http.StatusNotFound {
		t.Errorf("GET under a POST route: %d, want 404", r.status)
	}
	// Any other method a route does not take is said the same way.
	r := e.do(request{method: "PUT", path: "/v1/runs/01J00000000000000000000001/cancel"})
	if p := r.problem(t); r.status != http.StatusMethodNotAllowed || p.Detail != "/v1/runs/01J00000000000000000000001/cancel takes OPTIONS, POST, not PUT." {
		t.Errorf("PUT on a POST route: %d %+v", r.status, p)
	}
}

// TestProxyWithoutAPath: /proxy/{source} with nothing after it is no route
// whatever the method, and its 404 says where the path goes.
func TestProxyWithoutAPath(t *testing.T) {
	e := newEnv(t)
	for _, method := range []string{"GET", "POST", "DELETE"} {
		r := e.do(request{method: method, path: "/proxy/county", secret: e.secret[auth.RoleOperator]})
		p := r.problem(t)
		if r.status != http.StatusNotFound || !strings.Contains(p.Detail, "/proxy/county/ is the source's base URL") || r.header.Get("Allow") != "" || r.header.Get(api.ProxyAnswerHeader) != api.ProxyAnswerAuditd {
			t.Errorf("%s /proxy/county: %d %+v, Allow %q", method, r.status, p, r.header.Get("Allow"))
		}
	}
}
