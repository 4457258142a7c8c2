package fetch

import (
	"bytes"
	"io"
	"mime"
	"net/url"
	"strings"
)

// A service document names its server's own URLs: the operation URLs of
// OGC capabilities (WFS, WMS, WMTS), the service URLs of ArcGIS REST JSON,
// the next links of paged JSON. A client that follows them would leave the
// proxy for the upstream, unpaced and unrecorded. So a proxied text
// response (XML, JSON, HTML) has every occurrence of its source's base URL
// rewritten into the source's proxy URL, as it streams to the client; the
// body staged, hashed and recorded is the upstream's.

// rewritable reports whether a response of content type ct is text whose
// URLs are rewritten: XML, JSON and HTML, with their +xml and +json kin.
func rewritable(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	switch {
	case mt == "text/html", mt == "text/xml", mt == "application/xml", mt == "application/json",
		mt == "text/json", mt == "application/javascript", mt == "text/javascript",
		strings.HasSuffix(mt, "+xml"), strings.HasSuffix(mt, "+json"):
		return true
	}
	return false
}

// urlRewriter rewrites a source's base URL into its proxy URL in a body
// written to it in pieces of any size: what could be the start of an
// occurrence is held back until the next write, or Close, decides it.
type urlRewriter struct {
	w    io.Writer
	from [][]byte // occurrences to rewrite, each beginning with "http"
	to   [][]byte // what each becomes
	keep int      // the longest of from, plus the byte after it
	buf  []byte   // written, not yet passed on
	n    int      // occurrences rewritten
	err  error
}

// newURLRewriter returns a rewriter of base (the source's base URL) into
// proxy (its proxy URL on auditd) onto w. Both schemes of the base URL's
// host are rewritten (a server behind a TLS proxy often names itself
// http), each as written and with its slashes escaped as JSON encoders
// may write them (`https:\/\/host\/path`). It returns nil when base is
// not an http(s) URL.
func newURLRewriter(w io.Writer, base, proxy string) *urlRewriter {
	u, err := url.Parse(strings.TrimRight(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil
	}
	rest := "://" + u.Host + u.EscapedPath()
	proxy = strings.TrimRight(proxy, "/")
	r := &urlRewriter{w: w}
	for _, scheme := range []string{"https", "http"} {
		from := scheme + rest
		r.from = append(r.from, []byte(from), []byte(strings.ReplaceAll(from, "/", `\/`)))
		r.to = append(r.to, []byte(proxy), []byte(strings.ReplaceAll(proxy, "/", `\/`)))
	}
	for _, f := range r.from {
		r.keep = max(r.keep, len(f)+1)
	}
	return r
}

var httpPrefix = []byte("http")

// Write passes p on with the occurrences it completes rewritten. It
// reports len(p) unless the writer below failed.
func (r *urlRewriter) Write(p []byte) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	r.buf = append(r.buf, p...)
	done := r.scan(false)
	r.buf = append(r.buf[:0], r.buf[done:]...)
	return len(p), r.err
}

// Close passes on what is held back.
func (r *urlRewriter) Close() error {
	if r.err == nil {
		r.scan(true)
		r.buf = r.buf[:0]
	}
	return r.err
}

// scan writes out r.buf, rewritten, as far as it can be decided (all of
// it when final), and returns how far that is.
func (r *urlRewriter) scan(final bool) int {
	b, i := r.buf, 0
	emit := func(p []byte) {
		if r.err == nil && len(p) > 0 {
			_, r.err = r.w.Write(p)
		}
	}
	for r.err == nil {
		k := bytes.Index(b[i:], httpPrefix)
		if k < 0 {
			end := len(b)
			if !final { // "htt" at the end may begin an occurrence
				end = max(i, len(b)-len(httpPrefix)+1)
			}
			emit(b[i:end])
			return end
		}
		k += i
		if !final && len(b)-k < r.keep {
			emit(b[i:k])
			return k
		}
		j := r.match(b[k:])
		if j < 0 {
			emit(b[i : k+1])
			i = k + 1
			continue
		}
		emit(b[i:k])
		emit(r.to[j])
		r.n++
		i = k + len(r.from[j])
	}
	return len(b)
}

// match returns which of r.from b begins with, as a whole URL prefix (the
// next byte ends the base URL's path: it is no longer a path character,
// or a '/', '?' or '#'), or -1.
func (r *urlRewriter) match(b []byte) int {
	for j, f := range r.from {
		if !bytes.HasPrefix(b, f) {
			continue
		}
		if len(b) == len(f) || endsPath(b[len(f)]) {
			return j
		}
	}
	return -1
}

// endsPath reports whether c, after a base URL, leaves its last path
// segment whole: "/wfs" in "/wfs?" or "/wfs/x", not in "/wfs2".
func endsPath(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return false
	case c == '-', c == '.', c == '_', c == '~', c == '%', c == ':', c == '@', c == '!', c == '$', c == '+', c == ',', c == ';', c == '=':
		return false
	}
	return true
}
