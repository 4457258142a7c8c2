package auditd

import (
	"io"
	"net/http"
	"strings"
	"time"
)

// hopHeaders are the hop-by-hop headers (RFC 9110 7.6.1), which a proxy
// never forwards, in either direction.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// RemoveHopHeaders removes the hop-by-hop headers from h, and those its
// Connection header names.
func RemoveHopHeaders(h http.Header) {
	for _, v := range h.Values("Connection") {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				h.Del(name)
			}
		}
	}
	for _, k := range hopHeaders {
		h.Del(k)
	}
}

// ProxyRequest is one request a pipeline sends through the proxy route
// (ANY /proxy/{source}/{path}), as the API hands it to the fetch loop:
// validated, its body read, and its headers already rid of what never
// goes upstream (hop-by-hop headers, the client's credentials, auditd's
// own Auditd-* headers).
type ProxyRequest struct {
	RunID    string
	SourceID string
	Method   string // GET, HEAD or POST
	// Path is the path and query to put after the source's base URL,
	// escaped as the client sent it ("/rest/services/x/query?f=json").
	Path   string
	Header http.Header
	Body   []byte // a POST's body; nil otherwise
	// ItemKey names the request's item in the run; "" derives one from
	// the method, path and query.
	ItemKey string
	// Deadline bounds the waits and retries; 0 takes the source's
	// (Source.Proxy.Deadline).
	Deadline time.Duration
	// Idempotent says the client sent an Idempotency-Key: a POST may then
	// be retried after a 429, 5xx or transport error.
	Idempotent bool
	// Cost is what the request spends of its source's budget (the records
	// it carries; the Auditd-Cost header). Zero means 1.
	Cost int
	// Origin is the scheme and host the client reached auditd at
	// ("https://auditd.example.org"), for the proxy URLs a response's
	// rewritten links name (ProxyPolicy.RewriteURLs); empty takes the
	// address the client's connection came in at, over http.
	Origin string
}

// ProxyMeta is what auditd tells the client of a proxied request besides
// the upstream's own response (the API sends it as Auditd-* headers).
type ProxyMeta struct {
	RunID   string
	ItemKey string
	// DispatchSeq is the ledger sequence number of the dispatch whose
	// response the client gets (the last one); 0 when nothing was sent.
	DispatchSeq uint64
	Attempts    int           // dispatches made for the request
	Waited      time.Duration // time spent at the gates and in backoff
	// RetryAfter is, for a request not answered by its deadline, when the
	// gates expect to admit the same request.
	RetryAfter time.Duration
	// Stale describes the last good copy served instead of a fresh
	// response; nil for a fresh one.
	Stale *StaleCopy
}

// StaleCopy is a last good copy served for a request that could not be
// fetched by its deadline.
type StaleCopy struct {
	PayloadHash string
	FetchedAt   time.Time
	Age         time.Duration
	RunID       string // the run that fetched it; "" when the ledger no longer says
}

// ProxyResponder is where the proxy writes its one final response.
type ProxyResponder interface {
	// Start sends status and header, with meta's headers added, and
	// returns where the body goes.
	Start(status int, header http.Header, meta *ProxyMeta) io.Writer
	// Abort breaks the response off (the connection is closed), so that a
	// client never takes a truncated body for a whole one.
	Abort()
	// Flush sends what the body holds so far to the client now.
	Flush()
}
