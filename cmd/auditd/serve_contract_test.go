package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/api"
	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
)

// serveCounty starts auditd serve on dir/data with one source, county,
// in front of packUpstream, 100 a second.
func serveCounty(t *testing.T, dir, token string) *child {
	t.Helper()
	up := packUpstream(t)
	config := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf("sources:\n  - id: county\n    base_url: %s\n    limit: 100\n    window: 1s\n", up.URL)), 0o600); err != nil {
		t.Fatal(err)
	}
	return startServe(t, filepath.Join(dir, "data"), config, token)
}

// TestServeAnswersMatchTheContract: the real service (auditd serve, its
// run store, registry, limiter, ledger and reports), not the API tests'
// fakes, answers as openapi.yaml says: a finished run's items page by
// page, the ledger's events past its head, every read of a run, a source
// and the ledger. A source the limiter would refuse is a 400 that stores
// and records nothing.
func TestServeAnswersMatchTheContract(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd serve")
	}
	const token = "contract-test-admin-token-0123456789"
	srv := serveCounty(t, t.TempDir(), token)
	v := newContractCheck(t)
	get := func(path string) []byte {
		t.Helper()
		status, body := v.do(t, srv.url, "GET", path, token, "")
		if status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, status, body)
		}
		return body
	}

	var items []map[string]any
	for i := range 7 {
		items = append(items, map[string]any{"key": fmt.Sprintf("k%d", i), "source": "county", "path": fmt.Sprintf("/q?n=%d&token=abc", i)})
	}
	runBody, _ := json.Marshal(map[string]any{"name": "contract", "items": items})
	status, body := v.do(t, srv.url, "POST", "/v1/runs", token, string(runBody))
	var run struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(body, &run); status != http.StatusCreated || run.ID == "" {
		t.Fatalf("create run: %d %s", status, body)
	}
	var done struct{}
	srv.awaitRun(t, run.ID, token, 60*time.Second, &done)

	// A finished run's items, a page of 3 at a time.
	var keys []string
	for path := "/v1/runs/" + run.ID + "/items?limit=3"; ; {
		var page struct {
			Items []struct {
				Key string `json:"key"`
			} `json:"items"`
			Next string `json:"next_cursor"`
		}
		if err := json.Unmarshal(get(path), &page); err != nil {
			t.Fatal(err)
		}
		for _, it := range page.Items {
			keys = append(keys, it.Key)
		}
		if page.Next == "" {
			break
		}
		path = "/v1/runs/" + run.ID + "/items?limit=3&cursor=" + page.Next
	}
	if len(keys) != len(items) {
		t.Errorf("paged %d items, want %d: %v", len(keys), len(items), keys)
	}

	var verified struct {
		HeadSeq uint64 `json:"head_seq"`
	}
	json.Unmarshal(get("/v1/ledger/verify"), &verified)
	for _, path := range []string{
		"/v1/runs", "/v1/runs/" + run.ID, "/v1/runs/" + run.ID + "/events", "/v1/runs/" + run.ID + "/items/k0",
		"/v1/runs/" + run.ID + "/reconciliation", "/v1/runs/" + run.ID + "/timeline", "/v1/sources", "/v1/sources/county",
		"/v1/sources/county/timeline", "/v1/ledger/proof/1", "/v1/ledger/checkpoints", "/v1/tokens",
		fmt.Sprintf("/v1/ledger/events?from=%d", verified.HeadSeq+1),
	} {
		get(path)
	}

	// Replaying the run with its key: the same run, though its paths hold
	// credentials.
	for i := range 2 {
		status, body := v.doHeader(t, srv.url, "POST", "/v1/runs", token, string(runBody), map[string]string{"Idempotency-Key": "contract-1"})
		if status != http.StatusCreated {
			t.Fatalf("submit %d with an Idempotency-Key: %d %s", i, status, body)
		}
	}

	var head struct {
		HeadSeq uint64 `json:"head_seq"`
	}
	json.Unmarshal(get("/v1/ledger/verify"), &head)
	status, body = v.do(t, srv.url, "PUT", "/v1/sources/slow", token, `{"base_url":"https://slow.example.gov","limit":1,"window":"200000h"}`)
	if status != http.StatusBadRequest || !strings.Contains(string(body), `"field":"window"`) {
		t.Errorf("a window past the limiter's: %d %s, want 400 naming window", status, body)
	}
	if status, _ := v.do(t, srv.url, "GET", "/v1/sources/slow", token, ""); status != http.StatusNotFound {
		t.Errorf("the refused source was stored: GET answers %d", status)
	}
	if after := get(fmt.Sprintf("/v1/ledger/events?from=%d", head.HeadSeq+1)); strings.Contains(string(after), "source.changed") {
		t.Errorf("the refused source was recorded: %s", after)
	}
}

// contractCheck validates answers against openapi.yaml.
type contractCheck struct{ router routers.Router }

func newContractCheck(t *testing.T) *contractCheck {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(api.Spec())
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = nil
	r, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contractCheck{router: r}
}

func (v *contractCheck) do(t *testing.T, base, method, path, token, body string) (int, []byte) {
	t.Helper()
	return v.doHeader(t, base, method, path, token, body, nil)
}

// doHeader sends one request and fails the test when its answer is not
// one openapi.yaml declares.
func (v *contractCheck) doHeader(t *testing.T, base, method, path, token, body string, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, val := range header {
		req.Header.Set(k, val)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no operation of openapi.yaml: %v", method, path, err)
	}
	ct := resp.Header.Get("Content-Type")
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  resp.StatusCode,
		Header:  resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true, ExcludeResponseBody: !strings.Contains(ct, "json") || strings.Contains(ct, "ndjson")},
	}
	in.SetBodyBytes(got)
	if err := openapi3filter.ValidateResponse(req.Context(), in); err != nil {
		t.Errorf("%s %s: answer %d does not match openapi.yaml: %v\nbody: %.500s", method, path, resp.StatusCode, err, got)
	}
	return resp.StatusCode, got
}
