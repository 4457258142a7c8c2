package fetch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/staging"
)

// A proxied request's exchange with its upstream: the request sent
// once (send), a response to retry read and recorded (exchange), a final
// one streamed to the client while its body is staged (stream).

// exchange sends the dispatched request a. A response that will be
// retried is read and recorded here; a final one is streamed to the
// client (stream). done says the request has ended.
func (p *proxied) exchange(ctx, rctx context.Context, a *attempt, final bool) (done bool, err error) {
	l := p.l
	start := l.cfg.Clock.Now()
	resp, err := p.send(ctx, a.permit.SendBy)
	if errors.Is(err, errSlotPassed) {
		// Not sent (wireGate): back to the gates for a new fleet slot,
		// counted against no retry bound.
		l.slotPassed(p.ar, p.job.Item, a, p.path, wireLate)
		p.job.attempts.forgive(0)
		p.throttled = nil
		return false, nil
	}
	if err != nil {
		now := l.cfg.Clock.Now()
		x := exchange{receivedAt: now, latency: now.Sub(start), err: err}
		_, _, wait := l.settle(rctx, p.ar, &p.src, p.job.Item, a, &x)
		p.lastReason = "transport error: " + err.Error()
		switch {
		case ctx.Err() != nil:
			return true, p.gone()
		case final:
			return true, p.giveUp(p.lastReason, auditd.EUPSTREAM)
		}
		p.retryAt = l.cfg.Clock.Now().Add(wait)
		return false, nil
	}
	defer resp.Body.Close()
	// A 429 or 5xx is retried; the last one allowed is passed to the
	// client, unless the source serves its last good copy instead. A
	// request that may not be retried (a POST without an Idempotency-Key)
	// gets its one answer, whatever it is: it was sent, and may have done
	// what it asked.
	retry := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
	var stale staging.Copy
	useCopy := false // the last answer gives way to the copy
	if retry && final && p.retryable {
		stale, useCopy = p.staleCopy()
	}
	if retry && (!final || useCopy) {
		n, _ := io.Copy(io.Discard, io.LimitReader(resp.Body, proxyDrainBytes))
		now := l.cfg.Clock.Now()
		x := exchange{status: resp.StatusCode, header: resp.Header, receivedAt: now, latency: now.Sub(start), n: n}
		out, _, wait := l.settle(rctx, p.ar, &p.src, p.job.Item, a, &x)
		p.refundRefused(a, out)
		if out == auditd.OutcomeThrottled {
			p.lastReason = fmt.Sprintf("throttled (%d)", x.status)
			p.throttled = a
		} else {
			p.lastReason = fmt.Sprintf("server error (%d)", x.status)
			p.retryAt = l.cfg.Clock.Now().Add(wait)
		}
		if useCopy {
			if p.serveCopy(stale, p.lastReason) {
				return true, nil
			}
			return true, p.giveUp(p.lastReason, auditd.EUPSTREAM)
		}
		return false, nil
	}
	return true, p.stream(rctx, a, resp, start)
}

// refundRefused gives back what attempt a was charged (limiter.Permit.Refund)
// when the upstream refused it and the request is keyed: a batch the client
// keys is one the upstream takes once, whatever the retries, and a refused
// attempt counted none of its records there. Its retry, by auditd or by the
// client under the same key, is charged instead: the batch is charged once.
func (p *proxied) refundRefused(a *attempt, out auditd.Outcome) {
	if p.keyed && out == auditd.OutcomeThrottled {
		a.permit.Refund()
	}
}

// bufPool holds the buffers responses are streamed through.
var bufPool = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// stream sends the final response to the client while it stages a 2xx
// body (up to the staging cap, MaxBodyBytes: a larger one is passed
// through and recorded as not staged), then records the outcome and ends
// the item.
func (p *proxied) stream(rctx context.Context, a *attempt, resp *http.Response, start time.Time) error {
	l := p.l
	success := resp.StatusCode >= 200 && resp.StatusCode < 300
	var w *staging.Writer
	if success {
		var err error
		if w, err = l.cfg.Staging.NewWriter(); err != nil {
			return p.giveUp("staging: "+err.Error(), auditd.EINTERNAL)
		}
		defer w.Abort()
	}
	var keep *bytes.Buffer // for the body-error rule
	if success && p.src.BodyError != auditd.BodyErrorNone {
		keep = &bytes.Buffer{}
	}
	h := responseHeader(resp.Header)
	rw := p.rewriter(h, nil)
	var body io.Writer = p.out.Start(resp.StatusCode, h, p.meta)
	if rw != nil {
		rw.w, body = body, rw
	}
	n, readErr, writeErr, stageErr := p.pass(resp.Body, body, w, keep)
	if rw != nil && writeErr == nil && readErr == nil {
		writeErr = rw.Close()
	}
	now := l.cfg.Clock.Now()
	if readErr == nil && writeErr == nil && resp.ContentLength >= 0 {
		// The whole body is the client's now, before the outcome is
		// recorded and the item ended (those do not wait for the ledger).
		// A body without a length ends with the handler, flushed or not.
		p.out.Flush()
	}
	x := exchange{status: resp.StatusCode, header: resp.Header, receivedAt: now, latency: now.Sub(start), n: n}
	if rw != nil && rw.n > 0 {
		x.rewritten = rw.n
	}
	if keep != nil {
		x.body = keep.Bytes()
	}
	if readErr != nil {
		x = exchange{receivedAt: now, latency: now.Sub(start), err: readErr}
	}
	out, bodyErr, _ := l.settle(rctx, p.ar, &p.src, p.job.Item, a, &x)
	p.refundRefused(a, out)
	switch {
	case readErr != nil:
		p.end(auditd.ItemFailed, fmt.Sprintf("transport error after %d bytes: %v", n, readErr), nil, "", nil)
		p.out.Abort() // the client must not take the part for the whole
		return nil
	case writeErr != nil:
		p.end(auditd.ItemFailed, fmt.Sprintf("the client went away after %d bytes of the response", n), nil, "", nil)
		return nil
	case out == auditd.OutcomeBodyError:
		p.end(auditd.ItemFailed, fmt.Sprintf("error in a %d body: %s", x.status, bodyErr), nil, "", nil)
		return nil
	case !success:
		p.end(auditd.ItemFailed, fmt.Sprintf("%s (%d), passed to the client", out, x.status), nil, "", nil)
		return nil
	case stageErr != nil:
		p.end(auditd.ItemFailed, fmt.Sprintf("passed through, not staged: %d bytes (%v)", n, stageErr), nil, "", nil)
		return nil
	}
	payload, err := w.Finish()
	if err != nil {
		p.end(auditd.ItemFailed, "passed through, not staged: "+err.Error(), nil, "", nil)
		return nil
	}
	res := &auditd.ItemResult{Advertised: -1, Pages: 1, PayloadHash: payload.Sum, Bytes: payload.N}
	p.job.contentType, p.job.contentEncoding = resp.Header.Get("Content-Type"), resp.Header.Get("Content-Encoding")
	p.end(auditd.ItemSucceeded, "", res, p.lastGood, &payload)
	return nil
}

// pass copies a response's body to the client (body) as it comes,
// staging it in w (when not nil) up to the staging cap and keeping the
// start of it in keep (when not nil) for the body-error rule. It returns
// the body's size and the first error reading it, writing it to the
// client, and staging it.
func (p *proxied) pass(r io.Reader, body io.Writer, w *staging.Writer, keep *bytes.Buffer) (n int64, readErr, writeErr, stageErr error) {
	bp := bufPool.Get().(*[]byte)
	defer bufPool.Put(bp)
	buf := *bp
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(k)
			if w != nil && stageErr == nil {
				if n > p.l.cfg.MaxBodyBytes {
					stageErr = fmt.Errorf("body over the %d-byte staging cap", p.l.cfg.MaxBodyBytes)
				} else if _, err := w.Write(buf[:k]); err != nil {
					stageErr = err
				}
			}
			if keep != nil && keep.Len() < proxyBodyErrorBytes {
				keep.Write(buf[:min(k, proxyBodyErrorBytes-keep.Len())])
			}
			if _, err := body.Write(buf[:k]); err != nil {
				return n, nil, err, stageErr
			}
		}
		if err == io.EOF {
			return n, nil, nil, stageErr
		} else if err != nil {
			return n, p.scrub(fmt.Errorf("read body: %w", err)), nil, stageErr
		}
	}
}

// send performs the request once: the client's headers and the source's
// secret headers, the source's secret query parameters added to the
// client's query, no redirect followed (the client gets the 3xx), and a
// body the transport cannot resend on its own (see Loop.send).
func (p *proxied) send(ctx context.Context, sendBy time.Time) (*http.Response, error) {
	u := strings.TrimRight(p.src.BaseURL, "/") + p.req.Path
	if len(p.query) > 0 {
		var q strings.Builder
		for _, k := range slices.Sorted(maps.Keys(p.query)) {
			if q.Len() > 0 {
				q.WriteByte('&')
			}
			q.WriteString(url.QueryEscape(k) + "=" + url.QueryEscape(p.query[k]))
		}
		if strings.Contains(u, "?") {
			u += "&" + q.String()
		} else {
			u += "?" + q.String()
		}
	}
	var body io.Reader = emptyBody{}
	if len(p.req.Body) > 0 {
		body = bytes.NewReader(p.req.Body)
	}
	req, err := http.NewRequestWithContext(ctx, p.req.Method, u, body)
	if err != nil {
		return nil, p.scrub(err)
	}
	req.GetBody = nil
	if len(p.req.Body) == 0 {
		req.Body = emptyBody{}
	}
	req.Header = p.req.Header.Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	if len(p.req.Body) > 0 && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range p.headers {
		req.Header.Set(k, v)
	}
	req = gateWire(req, sendBy, p.l.cfg.Clock.Now)
	resp, err := p.l.cfg.Client.Do(req) // it never follows a redirect (New)
	if err != nil {
		return nil, p.scrub(err)
	}
	return resp, nil
}

// scrub rewrites a transport error for the record: its text is built from
// redacted URLs (scrubError), and no value of the source's secret query
// parameters or headers survives in it.
func (p *proxied) scrub(err error) error {
	err = scrubError(err, p.rule)
	text := err.Error()
	for _, v := range p.query {
		if v != "" {
			text = strings.ReplaceAll(text, v, redact.Replacement)
			text = strings.ReplaceAll(text, url.QueryEscape(v), redact.Replacement)
		}
	}
	for _, v := range p.headers {
		if v != "" {
			text = strings.ReplaceAll(text, v, redact.Replacement)
		}
	}
	return withText(err, text)
}

// rewriter returns the rewriter of the source's base URL into its proxy
// URL for a response with header h, when its links are rewritten (a text
// type, the source's rewrite_urls), and takes Content-Length out of h:
// the rewritten body's length differs. Its writer is w, set by the caller
// when nil.
func (p *proxied) rewriter(h http.Header, w io.Writer) *urlRewriter {
	if p.proxyURL == "" || h.Get("Content-Encoding") != "" || !rewritable(h.Get("Content-Type")) {
		return nil
	}
	rw := newURLRewriter(w, p.src.BaseURL, p.proxyURL)
	if rw != nil {
		h.Del("Content-Length")
	}
	return rw
}

// proxyOrigin is the scheme and host the client reached auditd at:
// req.Origin, or the address its connection came in at.
func proxyOrigin(ctx context.Context, req *auditd.ProxyRequest) string {
	if req.Origin != "" {
		return strings.TrimRight(req.Origin, "/")
	}
	if addr, ok := ctx.Value(http.LocalAddrContextKey).(net.Addr); ok {
		return "http://" + addr.String()
	}
	return ""
}
