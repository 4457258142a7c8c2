package web_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/web/webtest"
)

// getTimeline asks the fake API, in process, for the timeline the page on
// show fetched for its charts, with the same query.
func getTimeline(t *testing.T, ctx context.Context, h http.Handler) auditd.Timeline {
	t.Helper()
	url, err := webtest.TimelineURL(ctx)
	if err != nil || url == "" {
		t.Fatalf("the page says of no timeline it fetched (%v)", err)
	}
	req := httptest.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+auditorToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, rec.Code, rec.Body)
	}
	var tl auditd.Timeline
	if err := json.Unmarshal(rec.Body.Bytes(), &tl); err != nil {
		t.Fatal(err)
	}
	return tl
}
