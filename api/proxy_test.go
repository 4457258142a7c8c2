package api_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// fakeProxy answers as an upstream would, or fails as the fetch loop does
// before it has answered.
type fakeProxy struct {
	status int
	header http.Header
	body   string
	err    error
}

func (f fakeProxy) Proxy(_ context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (auditd.ProxyMeta, error) {
	meta := auditd.ProxyMeta{RunID: req.RunID, ItemKey: "k", Attempts: 1}
	if f.err != nil {
		return meta, f.err
	}
	io.WriteString(out.Start(f.status, f.header, &meta), f.body)
	return meta, nil
}

// TestProxyAnswersSayWhose: on the proxy route auditd's own answers carry
// Auditd-Answer: auditd and are problems of auditd's; the upstream's pass
// through untouched, whatever their status, with Auditd-Answer: upstream,
// and an upstream cannot forge auditd's headers.
func TestProxyAnswersSayWhose(t *testing.T) {
	e := newEnv(t)
	op := e.secret[auth.RoleOperator]
	run := map[string]string{"Auditd-Run": "01J00000000000000000000001"}
	for _, tc := range []struct {
		name   string
		proxy  fakeProxy
		header map[string]string
		status int
		answer string
		body   string // the upstream's, passed through
	}{
		{"UpstreamNotFound", fakeProxy{status: 404, header: http.Header{"Content-Type": {"application/json"}, "Auditd-Answer": {"auditd"}, "Auditd-Stale": {"true"}}, body: `{"error":"no such layer"}`},
			run, 404, "upstream", `{"error":"no such layer"}`},
		{"UpstreamUnavailableNoRetryAfter", fakeProxy{status: 503, header: http.Header{"Content-Type": {"text/plain"}}, body: "down for maintenance"},
			run, 503, "upstream", "down for maintenance"},
		{"UpstreamOK", fakeProxy{status: 200, header: http.Header{"Content-Type": {"application/json"}}, body: `{"features":[]}`},
			run, 200, "upstream", `{"features":[]}`},
		{"NotAnsweredInTime", fakeProxy{err: auditd.Errorf(auditd.EUNAVAILABLE, "not admitted by the deadline")}, run, 503, "auditd", ""},
		{"NoRun", fakeProxy{status: 200}, nil, 400, "auditd", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.srv.Proxy = tc.proxy
			r := e.do(request{path: "/proxy/county/layer/0", secret: op, header: tc.header})
			if r.status != tc.status || r.header.Get("Auditd-Answer") != tc.answer {
				t.Fatalf("%d Auditd-Answer %q, want %d %q; body %s", r.status, r.header.Get("Auditd-Answer"), tc.status, tc.answer, r.body)
			}
			if tc.answer == "auditd" {
				if p := r.problem(t); !strings.HasPrefix(p.Type, "urn:auditd:problem:") {
					t.Errorf("auditd's answer is not a problem of auditd's: %+v", p)
				}
				return
			}
			if string(r.body) != tc.body || r.header.Get("Auditd-Stale") != "" {
				t.Errorf("the upstream's answer was altered or forged auditd's headers: %q, Auditd-Stale %q", r.body, r.header.Get("Auditd-Stale"))
			}
		})
	}
	// The source's base URL itself: an operation of its own in the contract.
	e.srv.Proxy = fakeProxy{status: 200, header: http.Header{"Content-Type": {"text/plain"}}, body: "root"}
	if r := e.do(request{path: "/proxy/county/", secret: op, header: run}); r.status != http.StatusOK || string(r.body) != "root" {
		t.Errorf("the base URL: %d %q", r.status, r.body)
	}
	if r := e.do(request{path: "/proxy/county/q", header: run}); r.status != http.StatusUnauthorized || r.header.Get("Auditd-Answer") != "auditd" {
		t.Errorf("unauthenticated: %d Auditd-Answer %q, want 401 auditd", r.status, r.header.Get("Auditd-Answer"))
	}
}

// echoProxy answers with what it reads of the request auditd passed to the
// fetch loop.
type echoProxy func(*auditd.ProxyRequest) string

func (f echoProxy) Proxy(_ context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (auditd.ProxyMeta, error) {
	meta := auditd.ProxyMeta{RunID: req.RunID, ItemKey: "k", Attempts: 1}
	io.WriteString(out.Start(200, http.Header{"Content-Type": {"text/plain"}}, &meta), f(req))
	return meta, nil
}

// originProxy answers with the origin auditd passed to the fetch loop.
var originProxy = echoProxy(func(req *auditd.ProxyRequest) string { return req.Origin })

// TestProxyOriginIsWhatTheClientReached: the links a rewritten response
// names point where the client reached auditd, so the proxy route tells
// the fetch loop the Host asked for, over https behind a TLS-terminating
// reverse proxy.
func TestProxyOriginIsWhatTheClientReached(t *testing.T) {
	e := newEnv(t)
	e.srv.Proxy = originProxy
	host := strings.TrimPrefix(e.url, "http://")
	for _, tc := range []struct {
		name, proto, want string
	}{
		{"Plain", "", "http://" + host},
		{"BehindTLS", "https", "https://" + host},
		{"BehindTLSList", "HTTPS, http", "https://" + host},
	} {
		t.Run(tc.name, func(t *testing.T) {
			header := map[string]string{"Auditd-Run": "01J00000000000000000000001"}
			if tc.proto != "" {
				header["X-Forwarded-Proto"] = tc.proto
			}
			r := e.do(request{path: "/proxy/county/layer/0", secret: e.secret[auth.RoleOperator], header: header})
			if r.status != 200 || string(r.body) != tc.want {
				t.Fatalf("status %d, origin %q; want 200, %q", r.status, r.body, tc.want)
			}
		})
	}
}
