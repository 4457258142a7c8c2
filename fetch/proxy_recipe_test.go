package fetch_test

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// auditdTransport is docs/PROXY.md's Go recipe: the two headers on every
// request of a plain net/http client.
type auditdTransport struct{ token, run string }

func (t auditdTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Proxy-Authorization", "Bearer "+t.token)
	r.Header.Set("Auditd-Run", t.run)
	return http.DefaultTransport.RoundTrip(r)
}

// Sixteen goroutines share one net/http client built as docs/PROXY.md
// says, against a source with four slots: every request is answered 200,
// and the run succeeds.
func TestProxyRecipeGoNetHTTP(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"n":%d}`, n)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "counties", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second), Concurrency: 4})
	runID := e.proxyRun("")

	client := &http.Client{Transport: auditdTransport{e.token, runID}, Timeout: 60 * time.Second}
	const goroutines, each = 16, 3
	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				resp, err := client.Get(fmt.Sprintf("%s/proxy/counties/Parcels/FeatureServer/0/query?where=1%%3D1&f=json&g=%d&i=%d", e.srv.URL, g, i))
				if err != nil {
					errs <- err
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					errs <- fmt.Errorf("status %d", resp.StatusCode)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if v := e.finish(runID); v.Status != auditd.RunSucceeded || v.Counts.Succeeded != goroutines*each {
		t.Errorf("run %s %+v", v.Status, v.Counts)
	}
}
