package fetch_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/auditd/auditd/api/apiclient"
)

// The Go client oapi-codegen generates from api/openapi.yaml compiles and
// drives the service: a source put, a batch run submitted, waited for and
// reconciled, and a proxy-mode run created, used through the proxy route,
// finished and reconciled.
func TestGeneratedClientDrivesRuns(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	ctx := context.Background()
	bearer := func(secret string) apiclient.ClientOption {
		return apiclient.WithRequestEditorFn(func(_ context.Context, req *http.Request) error {
			req.Header.Set("Authorization", "Bearer "+secret)
			return nil
		})
	}
	admin, err := apiclient.NewClientWithResponses(e.srv.URL, bearer(e.admin))
	if err != nil {
		t.Fatal(err)
	}
	c, err := apiclient.NewClientWithResponses(e.srv.URL, bearer(e.token))
	if err != nil {
		t.Fatal(err)
	}

	limit, window := 100, "1s"
	put, err := admin.PutSourceWithResponse(ctx, "county", apiclient.PutSourceJSONRequestBody{BaseUrl: &up.URL, Limit: &limit, Window: &window})
	if err != nil || put.StatusCode() != http.StatusCreated {
		t.Fatalf("put source: %v %d %s", err, put.StatusCode(), put.Body)
	}

	items := []apiclient.Item{{Key: "layer-0", Source: "county", Path: "/layer/0/query"}}
	created, err := c.CreateRunWithResponse(ctx, nil, apiclient.NewRun{Name: "nightly", Items: &items})
	if err != nil || created.JSON201 == nil {
		t.Fatalf("create run: %v %d %s", err, created.StatusCode(), created.Body)
	}
	batch := created.JSON201.Id
	for deadline := time.Now().Add(10 * time.Second); ; {
		got, err := c.GetRunWithResponse(ctx, batch)
		if err != nil || got.JSON200 == nil {
			t.Fatalf("get run: %v %s", err, got.Body)
		}
		if got.JSON200.Status == apiclient.RunStatusSucceeded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run %s still %s", batch, got.JSON200.Status)
		}
		time.Sleep(10 * time.Millisecond)
	}
	reconciled(t, c, batch)

	mode := apiclient.RunModeProxy
	created, err = c.CreateRunWithResponse(ctx, nil, apiclient.NewRun{Name: "proxied", Mode: &mode})
	if err != nil || created.JSON201 == nil {
		t.Fatalf("create proxy run: %v %d %s", err, created.StatusCode(), created.Body)
	}
	proxied := created.JSON201.Id
	got, err := c.ProxyGetWithResponse(ctx, "county", "doc", &apiclient.ProxyGetParams{AuditdRun: proxied})
	if err != nil || got.StatusCode() != http.StatusOK || string(got.Body) != `{"path":"/doc"}` {
		t.Fatalf("proxied GET: %v %d %s", err, got.StatusCode(), got.Body)
	}
	fin, err := c.FinishRunWithResponse(ctx, proxied)
	if err != nil || fin.JSON200 == nil || fin.JSON200.Status != apiclient.RunStatusSucceeded || fin.JSON200.Counts.Items != 1 {
		t.Fatalf("finish: %v %d %s", err, fin.StatusCode(), fin.Body)
	}
	reconciled(t, c, proxied)
}

func reconciled(t *testing.T, c *apiclient.ClientWithResponses, id string) {
	t.Helper()
	rec, err := c.GetReconciliationWithResponse(context.Background(), id, nil)
	if err != nil || rec.JSON200 == nil {
		t.Fatalf("reconciliation of %s: %v %d %s", id, err, rec.StatusCode(), rec.Body)
	}
	if !rec.JSON200.Balanced {
		t.Errorf("run %s does not reconcile: %s", id, rec.Body)
	}
}
