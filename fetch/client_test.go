package fetch_test

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/auditd/auditd/fetch"
)

// TestClientCapsConnectionsPerHost sends a burst of requests to one host,
// all of them at once, to a handler that holds each until enough are in
// flight: the capped client never opens more connections than its cap (the
// rest wait for one to come free), and without the cap the same burst
// opens one per request, so the check can fail.
func TestClientCapsConnectionsPerHost(t *testing.T) {
	const burst = 24
	for _, tc := range []struct {
		name      string
		cap       int
		wantConns int64
	}{
		{"capped", 4, 4},
		{"uncapped", 0, burst},
	} {
		t.Run(tc.name, func(t *testing.T) {
			inFlight := tc.wantConns // the handler holds requests until this many arrive
			var conns, arrived, peak, now atomic.Int64
			release := make(chan struct{})
			var once sync.Once
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				n := now.Add(1)
				defer now.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				if arrived.Add(1) == inFlight {
					once.Do(func() { close(release) })
				}
				<-release
				io.WriteString(w, "ok")
			}))
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.Start()
			defer srv.Close()

			opts := fetch.DefaultClientOptions()
			opts.MaxIdlePerHost, opts.MaxConnsPerHost = burst, tc.cap
			client := fetch.NewClient(opts)
			defer client.CloseIdleConnections()

			var wg sync.WaitGroup
			errs := make(chan error, burst)
			for range burst {
				wg.Go(func() {
					resp, err := client.Get(srv.URL)
					if err != nil {
						errs <- err
						return
					}
					defer resp.Body.Close()
					if b, err := io.ReadAll(resp.Body); err != nil || string(b) != "ok" {
						errs <- err
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Errorf("request: %v", err)
			}
			if got := arrived.Load(); got != burst {
				t.Errorf("upstream received %d requests, want %d", got, burst)
			}
			if got := conns.Load(); got != tc.wantConns {
				t.Errorf("%d connections opened, want %d", got, tc.wantConns)
			}
			if got := peak.Load(); got != tc.wantConns {
				t.Errorf("%d requests in flight at most, want %d", got, tc.wantConns)
			}
		})
	}
}
