package api

import (
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

// The proxy route: ANY /proxy/{source}/{path...}. A pipeline points its own
// HTTP client at it; auditd authenticates the pipeline, paces, records and
// forwards each request to the source's base URL, with the source's secret
// headers and query parameters, and answers with the upstream's response.
// docs/PROXY.md is the user's page.

// DefaultMaxProxyBodyBytes caps a proxied POST's body.
const DefaultMaxProxyBodyBytes = 1 << 20

// costProxy is what a proxied request costs its token: the request and
// the item it becomes, as a run costs one unit per item on top.
const costProxy = 2

// Request headers of the proxy route.
const (
	// ProxyRunHeader names the proxy-mode run the request belongs to.
	ProxyRunHeader = "Auditd-Run"
	// ProxyItemKeyHeader names the request's item; without it the key is
	// derived from the method, path and query.
	ProxyItemKeyHeader = "Auditd-Item-Key"
	// ProxyDeadlineHeader bounds the request's waits and retries, in
	// seconds or as a Go duration; without it the source's deadline holds.
	ProxyDeadlineHeader = "Auditd-Deadline"
	// ProxyCostHeader is what the request spends of its source's budget
	// (the records it carries): a whole number from 1 to maxProxyCost.
	// Without it the request costs 1.
	ProxyCostHeader = "Auditd-Cost"
	// ProxyTokenHeader is another place for the pipeline's auditd token,
	// for clients that cannot set Proxy-Authorization.
	ProxyTokenHeader = "Auditd-Token"
)

// Response headers of the proxy route.
const (
	// ProxyAnswerHeader says whose answer a response of the proxy route
	// is: ProxyAnswerAuditd (a problem of auditd's) or ProxyAnswerUpstream
	// (the upstream's response, or its last good copy, passed through).
	ProxyAnswerHeader      = "Auditd-Answer"
	ProxyDispatchSeqHeader = "Auditd-Dispatch-Seq" // ledger sequence of the dispatch answered
	ProxyAttemptsHeader    = "Auditd-Attempts"     // dispatches made
	ProxyWaitedHeader      = "Auditd-Waited"       // seconds spent at the gates and in backoff
	ProxyStaleHeader       = "Auditd-Stale"        // "true": the last good copy, not a fresh response
	ProxyStaleRunHeader    = "Auditd-Stale-Run"    // the run that fetched the copy
	ProxyStaleAtHeader     = "Auditd-Stale-Fetched-At"
	ProxyPayloadHeader     = "Auditd-Payload-Sha256" // the copy's hash
)

// Values of ProxyAnswerHeader.
const (
	ProxyAnswerAuditd   = "auditd"
	ProxyAnswerUpstream = "upstream"
)

// proxyMethods are the methods the proxy forwards.
var proxyMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost}

// runIDPattern is a run id: a ULID.
var runIDPattern = regexp.MustCompile(`^[0-9A-HJKMNP-TV-Z]{26}$`)

func (s *Server) registerProxyRoutes(e *echo.Echo) {
	// /proxy/{source} alone is no route (handleUI refuses it): the
	// source's base URL itself is /proxy/{source}/.
	e.Any("/proxy/:source/*", s.handleProxy, s.allow(auth.RoleOperator, costInline))
}

// requestSecret is the auditd token a request carries: in
// Proxy-Authorization or Auditd-Token (the proxy route, where
// Authorization may be meant for the upstream and is dropped), else in
// Authorization.
func requestSecret(c echo.Context) (string, bool) {
	h := c.Request().Header
	if v := h.Get("Proxy-Authorization"); v != "" {
		return bearer(v)
	}
	if v := strings.TrimSpace(h.Get(ProxyTokenHeader)); v != "" {
		return v, true
	}
	return bearer(h.Get(echo.HeaderAuthorization))
}

// handleProxy: parse and validate everything the client sent (nothing is
// recorded or forwarded for a bad request), charge the token, and hand the
// request to the fetch loop, which writes the response.
func (s *Server) handleProxy(c echo.Context) error {
	r := c.Request()
	if !isProxyMethod(r.Method) {
		c.Response().Header().Set(echo.HeaderAllow, strings.Join(proxyMethods, ", "))
		return &auditd.Error{Code: codeMethodNotAllowed, Message: fmt.Sprintf("The proxy forwards %s; not %s.", strings.Join(proxyMethods, ", "), r.Method)}
	}
	req, err := s.proxyRequest(c)
	if err != nil {
		return err
	}
	if err := s.charge(c, token(c), costProxy); err != nil {
		return err
	}
	if s.Proxy == nil {
		return auditd.Errorf(auditd.EUNAVAILABLE, "The proxy is not configured on this server.")
	}
	out := &proxyResponder{c: c}
	meta, err := s.Proxy.Proxy(r.Context(), req, out)
	if err != nil && !out.started {
		setProxyMeta(c.Response().Header(), &meta)
		if meta.RetryAfter > 0 {
			c.Response().Header().Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(meta.RetryAfter.Seconds()))), 10))
		}
		return err
	}
	return nil
}

func isProxyMethod(m string) bool {
	for _, p := range proxyMethods {
		if m == p {
			return true
		}
	}
	return false
}

// idHeader returns the value of header name and whether the request has
// it at all: one sent empty is there, and refused, not taken as absent.
func idHeader(h http.Header, name string) (string, bool) {
	v, ok := h[http.CanonicalHeaderKey(name)]
	if !ok || len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// proxyOrigin is the scheme and host the client reached auditd at, for
// the links a rewritten response names: the Host it asked for, over https
// when the connection is TLS or a reverse proxy in front says so
// (X-Forwarded-Proto). Trusting that header costs nothing: it only shapes
// the links in the answer to the same client.
func proxyOrigin(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(strings.TrimSpace(strings.Split(r.Header.Get("X-Forwarded-Proto"), ",")[0]), "https") {
		scheme = "https"
	}
	if r.Host == "" {
		return ""
	}
	return scheme + "://" + r.Host
}

// proxyRequest reads and checks a proxied request.
func (s *Server) proxyRequest(c echo.Context) (*auditd.ProxyRequest, error) {
	r := c.Request()
	source := c.Param("source") // decoded once (decodeRequest)
	if s.validate.Var(source, "required,max=100,printascii") != nil {
		return nil, invalid("source", "The source in /proxy/{source}/ must be 1 to 100 printable ASCII characters, without a leading or trailing space.")
	}
	path, err := proxyPath(r.URL)
	if err != nil {
		return nil, err
	}
	req := &auditd.ProxyRequest{SourceID: source, Method: r.Method, Path: path, Origin: proxyOrigin(r)}

	req.RunID = CanonicalRunID(r.Header.Get(ProxyRunHeader))
	if req.RunID == "" {
		return nil, invalid(ProxyRunHeader, "Every proxied request names its run in %s; create one with POST /v1/runs {\"name\":...,\"mode\":\"proxy\"}.", ProxyRunHeader)
	}
	if !runIDPattern.MatchString(req.RunID) {
		return nil, invalid(ProxyRunHeader, "%s must be a run id (26 characters, as POST /v1/runs returned it).", ProxyRunHeader)
	}
	if key, ok := idHeader(r.Header, ProxyItemKeyHeader); ok {
		if s.validate.Var(key, "required,max=200,printascii") != nil {
			return nil, invalid(ProxyItemKeyHeader, "%s must be 1 to 200 printable ASCII characters, without a leading or trailing space.", ProxyItemKeyHeader)
		}
		req.ItemKey = key
	}
	if v := r.Header.Get(ProxyDeadlineHeader); v != "" {
		d, ok := parseProxyDeadline(v)
		if !ok {
			return nil, invalid(ProxyDeadlineHeader, "%s is seconds (30, 2.5) or a Go duration (90s), more than 0 and at most 1h.", ProxyDeadlineHeader)
		}
		req.Deadline = d
	}
	if key, ok := idHeader(r.Header, IdempotencyKeyHeader); ok {
		if s.validate.Var(key, "required,max=200,printascii") != nil {
			return nil, invalid(IdempotencyKeyHeader, "%s must be 1 to 200 printable ASCII characters, without a leading or trailing space.", IdempotencyKeyHeader)
		}
		req.Idempotent = true
	}
	if v, ok := idHeader(r.Header, ProxyCostHeader); ok {
		n, ok := parseProxyCost(v)
		if !ok {
			return nil, invalid(ProxyCostHeader, "%s is a whole number from 1 to %d: the records the request carries.", ProxyCostHeader, maxProxyCost)
		}
		req.Cost = n
	}

	hasBody := r.ContentLength > 0 || (r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody)
	switch {
	case r.Method != http.MethodPost && hasBody:
		return nil, invalid("", "A proxied %s carries no body.", r.Method)
	case r.Method == http.MethodPost:
		if r.ContentLength > s.MaxProxyBodyBytes {
			return nil, &auditd.Error{Code: codeTooLarge, Message: fmt.Sprintf("Body larger than %d bytes.", s.MaxProxyBodyBytes)}
		}
		body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, s.MaxProxyBodyBytes))
		if err != nil {
			var maxErr *http.MaxBytesError
			if errors.As(err, &maxErr) {
				return nil, &auditd.Error{Code: codeTooLarge, Message: fmt.Sprintf("Body larger than %d bytes.", maxErr.Limit)}
			}
			return nil, invalid("", "The body could not be read: %v.", err)
		}
		req.Body = body
	}
	req.Header = forwardHeader(r.Header)
	return req, nil
}

// forwardHeader returns the headers of a client's request that may go
// upstream: without hop-by-hop headers (and those Connection names), the
// client's credentials for auditd (Authorization, Proxy-Authorization,
// Auditd-Token), auditd's own Auditd-* and X-Request-Id headers, Host,
// and Accept-Encoding (auditd asks for gzip itself and stages what it
// decodes).
func forwardHeader(h http.Header) http.Header {
	out := h.Clone()
	auditd.RemoveHopHeaders(out)
	for k := range out {
		if strings.HasPrefix(k, "Auditd-") {
			delete(out, k)
		}
	}
	for _, k := range []string{echo.HeaderAuthorization, "Host", "Accept-Encoding", "Expect", "Content-Length", echo.HeaderXRequestID} {
		out.Del(k)
	}
	return out
}

// proxyPath is the path and query a proxied request puts after its
// source's base URL, escaped as the client sent it. A path with a "." or
// ".." segment, escaped or not, or a backslash or control character, is
// refused: it could leave the base URL's path.
func proxyPath(u *url.URL) (string, error) {
	raw := u.EscapedPath()
	// /proxy/{source}[/rest]
	rest := strings.TrimPrefix(raw, "/proxy/")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		rest = rest[i:]
	} else {
		rest = "/"
	}
	for seg := range strings.SplitSeq(rest, "/") {
		dec, err := url.PathUnescape(seg)
		if err != nil {
			return "", invalid("path", "The path is not validly escaped.")
		}
		for part := range strings.FieldsFuncSeq(dec, func(r rune) bool { return r == '/' || r == '\\' }) {
			if part == "." || part == ".." {
				return "", invalid("path", "The path may not hold . or .. segments.")
			}
		}
		if strings.ContainsAny(dec, "\\") || strings.ContainsFunc(dec, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return "", invalid("path", "The path may not hold backslashes or control characters.")
		}
		if dec == "." || dec == ".." {
			return "", invalid("path", "The path may not hold . or .. segments.")
		}
	}
	if u.RawQuery != "" {
		if strings.ContainsFunc(u.RawQuery, func(r rune) bool { return r < ' ' || r == 0x7f }) {
			return "", invalid("query", "The query may not hold control characters.")
		}
		return rest + "?" + u.RawQuery, nil
	}
	return rest, nil
}

// maxProxyCost bounds Auditd-Cost, as an item's cost is bounded.
const maxProxyCost = 1_000_000

// parseProxyCost reads Auditd-Cost: decimal digits only (no sign, space
// or exponent), from 1 to maxProxyCost.
func parseProxyCost(v string) (int, bool) {
	if v == "" || strings.Trim(v, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 1 && n <= maxProxyCost
}

// parseProxyDeadline reads Auditd-Deadline: seconds, or a Go duration.
func parseProxyDeadline(v string) (time.Duration, bool) {
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			return 0, false
		}
		d = time.Duration(f * float64(time.Second))
	}
	return d, d > 0 && d <= time.Hour
}

// proxyResponder writes the proxy's final response through echo.
type proxyResponder struct {
	c       echo.Context
	started bool
}

func (p *proxyResponder) Start(status int, header http.Header, meta *auditd.ProxyMeta) io.Writer {
	p.started = true
	h := p.c.Response().Header()
	for k, v := range header {
		if k == echo.HeaderXRequestID || strings.HasPrefix(k, "Auditd-") {
			continue // auditd's own: an upstream cannot forge them
		}
		h[k] = v
	}
	setProxyMeta(h, meta)
	h.Set(ProxyAnswerHeader, ProxyAnswerUpstream)
	p.c.Response().WriteHeader(status)
	return p.c.Response()
}

func (p *proxyResponder) Abort() { panic(http.ErrAbortHandler) }

// Flush sends what is written so far, where the server can (echo's own
// Flush panics where it cannot).
func (p *proxyResponder) Flush() { _ = http.NewResponseController(p.c.Response().Writer).Flush() }

// setProxyMeta sets the Auditd-* headers that say what auditd did.
func setProxyMeta(h http.Header, m *auditd.ProxyMeta) {
	if m.RunID != "" {
		h.Set(ProxyRunHeader, m.RunID)
	}
	if m.ItemKey != "" {
		h.Set(ProxyItemKeyHeader, m.ItemKey)
	}
	if m.DispatchSeq > 0 {
		h.Set(ProxyDispatchSeqHeader, strconv.FormatUint(m.DispatchSeq, 10))
	}
	h.Set(ProxyAttemptsHeader, strconv.Itoa(m.Attempts))
	h.Set(ProxyWaitedHeader, strconv.FormatFloat(m.Waited.Seconds(), 'f', 3, 64))
	if st := m.Stale; st != nil {
		h.Set(ProxyStaleHeader, "true")
		h.Set("Age", strconv.FormatInt(int64(st.Age.Seconds()), 10))
		h.Set(ProxyStaleAtHeader, st.FetchedAt.Format(time.RFC3339Nano))
		h.Set(ProxyPayloadHeader, st.PayloadHash)
		if st.RunID != "" {
			h.Set(ProxyStaleRunHeader, st.RunID)
		}
	}
}
