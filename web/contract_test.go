package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// specPath is the API's contract. The fake API of the browser test must
// answer what the real one would, so its answers are checked against it.
const specPath = "../api/openapi.yaml"

func TestFakeAPIFollowsContract(t *testing.T) {
	if _, err := os.Stat(specPath); errors.Is(err, fs.ErrNotExist) {
		t.Skip("no api/openapi.yaml")
	}
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(specPath)
	if err != nil {
		t.Fatalf("load spec: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("spec: %v", err)
	}

	_, api := newFakeAPI(t)
	tests := []struct {
		name, uri, template string
		token               string
		status              int
		ctype               string
	}{
		{"Runs", "/v1/runs?limit=50", "/v1/runs", auditorToken, 200, "application/json"},
		{"RunsNextPage", "/v1/runs?cursor=MDFK", "/v1/runs", auditorToken, 200, "application/json"},
		{"RunRunning", "/v1/runs/" + runID, "/v1/runs/{id}", auditorToken, 200, "application/json"},
		{"RunFinished", "/v1/runs/" + runID, "/v1/runs/{id}", auditorToken, 200, "application/json"},
		{"Reconciliation", "/v1/runs/" + runID + "/reconciliation", "/v1/runs/{id}/reconciliation", auditorToken, 200, "application/json"},
		{"Events", "/v1/runs/" + runID + "/events?type=throttle", "/v1/runs/{id}/events", auditorToken, 200, "application/json"},
		{"Items", "/v1/runs/" + runID + "/items", "/v1/runs/{id}/items", auditorToken, 200, "application/json"},
		{"Sources", "/v1/sources", "/v1/sources", auditorToken, 200, "application/json"},
		{"FleetSources", "/v1/fleet/sources", "/v1/fleet/sources", auditorToken, 200, "application/json"},
		{"Source", "/v1/sources/hays-gis", "/v1/sources/{id}", auditorToken, 200, "application/json"},
		{"Verify", "/v1/ledger/verify", "/v1/ledger/verify", auditorToken, 200, "application/json"},
		{"Checkpoint", "/v1/ledger/checkpoint", "/v1/ledger/checkpoint", auditorToken, 200, "text/plain"},
		{"PublicKey", "/v1/ledger/public-key", "/v1/ledger/public-key", auditorToken, 200, "text/plain"},
		{"RunsOfSource", "/v1/runs?source=hays-gis&limit=1", "/v1/runs", auditorToken, 200, "application/json"},
		{"RunTimeline", "/v1/runs/" + runID + "/timeline", "/v1/runs/{id}/timeline", auditorToken, 200, "application/json"},
		{"RunTimelineOneSource", "/v1/runs/" + runID + "/timeline?source=hays-gis&bucket=1m", "/v1/runs/{id}/timeline", auditorToken, 200, "application/json"},
		{"SourceTimeline", "/v1/sources/hays-gis/timeline?from=2026-11-29T18:40:05.123Z&to=2026-11-29T19:10:02.004Z", "/v1/sources/{id}/timeline", auditorToken, 200, "application/json"},
		{"SourceTimelineCarriedIn", "/v1/sources/hays-gis/timeline?from=2026-11-29T18:52:10Z&to=2026-11-29T18:53:00Z", "/v1/sources/{id}/timeline", auditorToken, 200, "application/json"},
		{"Unauthorized", "/v1/runs?limit=1", "/v1/runs", "wrong", 401, "application/problem+json"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest("GET", tc.uri, nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			rec := httptest.NewRecorder()
			api.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status = %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			item := doc.Paths.Find(tc.template)
			if item == nil {
				t.Fatalf("spec has no path %s", tc.template)
			}
			op := item.GetOperation(http.MethodGet)
			if op == nil {
				t.Fatalf("spec has no GET %s", tc.template)
			}
			resp := op.Responses.Status(tc.status)
			if resp == nil || resp.Value == nil {
				t.Fatalf("spec has no %d for GET %s", tc.status, tc.template)
			}
			ctype := rec.Header().Get("Content-Type")
			if !strings.HasPrefix(ctype, tc.ctype) {
				t.Fatalf("Content-Type = %q, want %s", ctype, tc.ctype)
			}
			mt := resp.Value.Content.Get(tc.ctype)
			if mt == nil || mt.Schema == nil {
				t.Fatalf("spec has no %s body for %d of GET %s", tc.ctype, tc.status, tc.template)
			}
			if !strings.Contains(tc.ctype, "json") {
				return
			}
			var body any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body: %v", err)
			}
			if err := doc.ValidateSchemaJSON(mt.Schema.Value, body, openapi3.VisitAsResponse(), openapi3.MultiErrors()); err != nil {
				t.Errorf("body does not follow the spec:\n%v", err)
			}
		})
	}
}
