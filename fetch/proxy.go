package fetch

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/staging"
)

// The proxy route's requests. A pipeline keeps its own HTTP code and points
// it at auditd; each request it sends becomes an item of a proxy-mode run
// and passes the same gates, in the same order, as a batch run's item
// (fetchPage): the breaker, the group pause, the rate and a concurrency
// slot (Limiter.Acquire), a dispatch durable before the request leaves
// (dispatch), and an outcome recorded and learned from (settle). auditd
// retries 429s, 5xx and transport errors itself, honouring Retry-After,
// until the request's deadline; the client sees one final response.

// Proxy limits.
const (
	// proxyDrainBytes is how much of a response that will be retried is
	// read (and discarded) so that its connection can be kept.
	proxyDrainBytes = 64 << 10
	// proxyBodyErrorBytes is how much of a 2xx body is kept to find an
	// error inside it, for a source with a body_error rule.
	proxyBodyErrorBytes = 1 << 20
	// proxyMaxDeadline bounds the deadline a request may ask for.
	proxyMaxDeadline = time.Hour
)

// responseHeader is the upstream's response header as the client gets it.
func responseHeader(h http.Header) http.Header {
	out := h.Clone()
	auditd.RemoveHopHeaders(out)
	for k := range out {
		if strings.HasPrefix(k, "Auditd-") {
			delete(out, k) // only auditd says what Auditd-* headers say
		}
	}
	return out
}

// Proxy carries out one proxied request and writes its one final response
// to out: the upstream's, or the last good copy (meta.Stale). When it
// returns an error nothing was written to out, and meta says what auditd
// knows (the item, the attempts, RetryAfter); the API renders the error.
//
// A request for a run that is not an active proxy-mode run, or for an
// unknown source, or while the ledger cannot write (Ledger.Stalled), is
// refused before anything is recorded or sent (nothing is written). Once its item is added, the request's end is always on
// record: item.finished, succeeded (with payload.staged), failed, shed or
// served from cache.
func (l *Loop) Proxy(ctx context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (auditd.ProxyMeta, error) {
	meta := auditd.ProxyMeta{RunID: req.RunID}
	ar := l.activeRun(req.RunID)
	if ar == nil || ar.proxy == nil {
		return meta, notProxyRun(ctx, l.cfg.Runs, req.RunID)
	}
	src, err := l.cfg.Registry.GetSource(req.SourceID)
	if err != nil {
		return meta, auditd.Errorf(auditd.ENOTFOUND, "Unknown source %q; PUT /v1/sources/{id} first.", req.SourceID)
	}
	if msg := l.costRefusal(src.ID, req.Cost, "request"); msg != "" {
		return meta, &auditd.Error{Code: auditd.ETOOLARGE, Field: "Auditd-Cost", Message: msg}
	}
	headers, err := l.cfg.Registry.RequestHeaders(src.ID)
	if err != nil {
		return meta, err
	}
	query, err := l.cfg.Registry.RequestQuery(src.ID)
	if err != nil {
		return meta, err
	}
	if _, err := l.cfg.Ledger.Stalled(); err != nil {
		meta.RetryAfter = stallRetryAfter
		return meta, auditd.Errorf(auditd.EUNAVAILABLE, "auditd cannot write its ledger for now, so nothing was sent; retry.")
	}
	if err := l.enterProxy(ar); err != nil {
		return meta, err
	}
	defer l.leaveProxy(ar)

	// The request ends with the client's connection, the run's
	// cancellation or the loop's shutdown, whichever comes first.
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	defer context.AfterFunc(ar.proxy.ctx, stop)()
	if err := ar.snapshotSource(ctx, l.cfg.Registry, src.ID); err != nil {
		return meta, err
	}

	// The source's secret query names are credentials' in the client's
	// path too: one redaction rule, the loop's (package redact).
	rule := redact.New(append(slices.Clone(src.SecretQuery), slices.Sorted(maps.Keys(query))...))
	p := &proxied{l: l, ar: ar, src: src, req: req, out: out, meta: &meta, headers: headers, query: query,
		rule: rule, path: rule.URL(req.Path)}
	if src.Proxy.Rewrites() {
		if origin := proxyOrigin(ctx, req); origin != "" {
			p.proxyURL = origin + "/proxy/" + url.PathEscape(src.ID)
		}
	}
	it := &auditd.Item{SourceID: src.ID, Method: req.Method, Path: p.path, Cost: req.Cost}
	var detail string
	if req.Method == http.MethodPost {
		sum := sha256.Sum256(req.Body)
		p.bodySum = hex.EncodeToString(sum[:])
		d, _ := json.Marshal(proxiedDetail{BodySHA256: p.bodySum, BodyBytes: len(req.Body)})
		detail = string(d)
	}
	if err := ar.addProxyItem(it, req.ItemKey); err != nil {
		return meta, err
	}
	meta.ItemKey = it.Key
	p.job = &job{Item: it, attempts: &itemAttempts{}}
	p.lastGood = staging.RequestKey(src.ID, it.Method, it.Path, []byte(p.bodySum))
	// The item's item.queued goes to the ledger with its first dispatch,
	// in one commit: posted on its own it would be written alone (an idle
	// ledger seals a group at once) and the dispatch would wait for two
	// fsyncs instead of one. Whatever else the item records first posts
	// it before (flushQueued).
	p.queued = &auditd.Event{Type: auditd.EventItemQueued, RunID: ar.id, SourceID: src.ID, ItemKey: it.Key,
		Method: it.Method, Path: it.Path, Detail: detail}
	err = p.run(ctx)
	return meta, err
}

// notProxyRun says why run id takes no proxied requests.
func notProxyRun(ctx context.Context, store Runs, id string) error {
	v, err := store.Run(ctx, id)
	switch {
	case auditd.ErrorCode(err) == auditd.ENOTFOUND:
		return &auditd.Error{Code: auditd.ENOTFOUND, Field: "Auditd-Run", Message: fmt.Sprintf("No run %q; create one with POST /v1/runs {\"mode\":\"proxy\"}.", id)}
	case err != nil:
		return err
	case v.Mode != auditd.RunProxy:
		return &auditd.Error{Code: auditd.ECONFLICT, Field: "Auditd-Run", Message: fmt.Sprintf("Run %s is a batch run; proxied requests need a run created with \"mode\":\"proxy\".", id)}
	case v.Status.Terminal():
		return &auditd.Error{Code: auditd.ECONFLICT, Field: "Auditd-Run", Message: fmt.Sprintf("Run %s is %s; it takes no more requests.", id, v.Status)}
	}
	return auditd.Errorf(auditd.EUNAVAILABLE, "Run %s is not active (auditd is starting or shutting down); retry.", id)
}

// addProxyItem adds it to the run under key, or under a key derived from
// its method and path when key is "": the same request sent again gets
// " #2", " #3" and so on. A key the run has is ECONFLICT.
func (ar *activeRun) addProxyItem(it *auditd.Item, key string) error {
	if key != "" {
		it.Key = key
		return ar.live.AddItem(*it)
	}
	base := proxyKey(it.Method, it.Path)
	pr := ar.proxy
	pr.mu.Lock()
	n := pr.repeats[base]
	pr.mu.Unlock()
	for ; ; n++ {
		it.Key = base
		if n > 0 {
			it.Key = fmt.Sprintf("%s #%d", base, n+1)
		}
		err := ar.live.AddItem(*it)
		if auditd.ErrorCode(err) != auditd.ECONFLICT {
			pr.mu.Lock()
			pr.repeats[base] = max(pr.repeats[base], n+1)
			pr.mu.Unlock()
			return err
		}
	}
}

// maxProxyKey leaves room, under the 200 characters of an item key, for
// the " #n" of a repeated request.
const maxProxyKey = 190

// proxyKey derives a proxied request's item key from its method and its
// recorded path: "GET /query?f=json". A long or unprintable one is cut and
// ends with a hash of the whole.
func proxyKey(method, path string) string {
	k := method + " " + path
	printable := true
	for i := 0; i < len(k); i++ {
		if k[i] < ' ' || k[i] > '~' {
			printable = false
			break
		}
	}
	if printable && len(k) <= maxProxyKey {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	cut := make([]byte, 0, maxProxyKey)
	for i := 0; i < len(k) && len(cut) < maxProxyKey-18; i++ {
		if k[i] >= ' ' && k[i] <= '~' {
			cut = append(cut, k[i])
		}
	}
	return string(cut) + "~" + hex.EncodeToString(sum[:8])
}

// proxied is one proxied request being carried out.
type proxied struct {
	l        *Loop
	ar       *activeRun
	src      auditd.Source
	req      *auditd.ProxyRequest
	out      auditd.ProxyResponder
	meta     *auditd.ProxyMeta
	job      *job
	rule     redact.Rule       // what is a credential in its URLs
	path     string            // the recorded path: credentials redacted
	bodySum  string            // a POST body's SHA-256, hex
	lastGood string            // the request's key in the last-good index
	headers  map[string]string // the source's secret headers
	query    map[string]string // the source's secret query parameters
	proxyURL string            // the source's proxy URL, its base URL's rewrite; "" when not rewritten

	retryable  bool      // a 429, 5xx or transport error may be retried (run)
	keyed      bool      // a POST with an Idempotency-Key, or to a source keying POSTs on their body (refundRefused)
	noCopy     bool      // its last good copy did not verify: wait as a request without one
	retryAt    time.Time // own backoff after a 5xx or transport error
	throttled  *attempt  // the attempt a throttle answered, until the next dispatch
	lastReason string
	// queued is the item's item.queued until it is added to the ledger:
	// with the first dispatch, or before any other record of the item.
	queued *auditd.Event
}

// flushQueued posts the item's item.queued, unless it is on its way.
func (p *proxied) flushQueued() {
	if p.queued == nil {
		return
	}
	buf := p.l.eventBuf()
	buf[0] = *p.queued
	p.queued = nil
	p.l.post(p.ar, buf, 1, nil, nil)
}

// end ends the request's item (Loop.endItem), its item.queued first.
func (p *proxied) end(out auditd.Outcome, reason string, res *auditd.ItemResult, lastGood string, payload *staging.Payload) {
	p.flushQueued()
	p.l.endItem(p.ar, p.job, out, reason, res, lastGood, payload)
}

// run passes the request through the gates and sends it until it gets a
// final response, its deadline passes, or the client goes away.
func (p *proxied) run(ctx context.Context) error {
	l, src, it := p.l, &p.src, p.job
	rctx := p.ar.recordCtx
	maxAttempts := l.cfg.MaxAttempts
	if src.MaxAttempts > 0 {
		maxAttempts = src.MaxAttempts
	}
	// A POST is retried only when that is safe: the client says so with an
	// Idempotency-Key, or the source's POSTs change nothing.
	p.keyed = p.req.Method == http.MethodPost && (p.req.Idempotent || src.Proxy.KeyOnBody)
	p.retryable = p.req.Method != http.MethodPost || p.keyed || src.Proxy.RetryPost
	wait := p.req.Deadline
	if wait <= 0 {
		wait = src.Proxy.Deadline.D()
	}
	if wait <= 0 {
		wait = auditd.DefaultProxyDeadline
	}
	deadline := l.cfg.Clock.Now().Add(min(wait, proxyMaxDeadline))
	if !p.ar.deadline.IsZero() && p.ar.deadline.Before(deadline) {
		deadline = p.ar.deadline
	}
	for {
		if ctx.Err() != nil {
			return p.gone()
		}
		if _, err := l.cfg.Ledger.Stalled(); err != nil {
			// Nothing leaves unrecorded, and nothing is recorded while the
			// ledger's writes fail: the client hears so now rather than at
			// its deadline. The item's end lands once writes succeed.
			p.end(auditd.ItemFailed, "ledger writes failing: nothing was sent", nil, "", nil)
			p.meta.RetryAfter = stallRetryAfter
			return auditd.Errorf(auditd.EUNAVAILABLE, "auditd cannot write its ledger for now, so nothing was sent; retry.")
		}
		// A source that is down is answered from the last good copy at
		// once rather than waited for, when the source serves copies
		// (admit).
		fallback := src.Proxy.ServeStale && !p.noCopy && l.hasCopy(p.lastGood)
		perm, end, err := l.admit(ctx, src.ID, limiter.Request{Cost: it.Cost, Deadline: deadline, NotBefore: p.retryAt}, fallback)
		// The waits held back the request's next dispatch: they carry its attempt.
		recordAdmission(p, it.Item, 0, uint32(it.attempts.spent(0)+1), perm, p.throttled)
		for _, w := range perm.Waits {
			p.meta.Waited += w.Actual
		}
		switch end {
		case admitDown:
			if fallback && p.serveStale("breaker open") {
				return nil
			}
			p.noCopy = fallback // it did not verify: wait as a request without one
			var down *limiter.DownError
			if errors.As(err, &down) && !fallback {
				p.meta.RetryAfter = max(down.Wait, time.Second)
				return p.giveUp(downReason(down, l.cfg.Clock.Now()), auditd.EUNAVAILABLE)
			}
			continue
		case admitShed:
			var shed *limiter.ShedError
			errors.As(err, &shed)
			return p.shed(shed)
		case admitGone:
			return p.gone()
		case admitFailed:
			return p.giveUp("limiter: "+err.Error(), auditd.EINTERNAL)
		}
		a := &attempt{page: 0, n: it.attempts.next(0), permit: perm}
		err = p.dispatch(ctx, a, deadline)
		if errors.Is(err, errBreakerOpened) || errors.Is(err, errPausedMeanwhile) {
			it.attempts.unspend(0) // nothing was sent: the number is not spent
			continue
		} else if errors.Is(err, errSlotPassed) {
			// On record and closed, not sent: back to the gates for a new
			// fleet slot, within the request's deadline. Nothing reached the
			// upstream, so it counts against no retry bound.
			it.attempts.forgive(0)
			p.throttled = nil
			continue
		} else if errors.Is(err, errDispatchLate) {
			// Not durable in time, so not sent; the item ends once the
			// ledger has decided the dispatch record (dispatch).
			p.meta.RetryAfter = stallRetryAfter
			return auditd.Errorf(auditd.EUNAVAILABLE, "The ledger could not record the dispatch by the request's deadline, so nothing was sent; retry.")
		} else if err != nil {
			// Not durable, so not sent.
			l.log.Error("record dispatch", "run", p.ar.id, "item", it.Key, "err", err)
			p.end(auditd.ItemFailed, "the dispatch could not be recorded; nothing was sent", nil, "", nil)
			p.meta.RetryAfter = stallRetryAfter
			return auditd.Errorf(auditd.EUNAVAILABLE, "The dispatch could not be recorded, so nothing was sent; retry.")
		}
		p.meta.DispatchSeq, p.meta.Attempts = a.seq, it.attempts.total
		p.throttled = nil
		final := !p.retryable || it.attempts.charged(0) >= maxAttempts
		if done, err := p.exchange(ctx, rctx, a, final); done {
			return err
		}
	}
}

// note records e, which describes what already happened, for the
// request's run without waiting for it to be durable (recorder.post): what the
// run records next is stored after it all the same. A proxied request
// waits for no record but its dispatch's (dispatch), and that only until
// its deadline, so that a client is not held while the ledger's writes
// fail; a batch run's worker posts these too (batchEnds.record).
func (p *proxied) note(e auditd.Event) {
	p.flushQueued()
	buf := p.l.eventBuf()
	buf[0] = e
	p.l.post(p.ar, buf, 1, nil, nil)
}

// stallRetryAfter is the Retry-After of a request refused because the
// ledger cannot write: as long as a worker waits between tries of a
// record the disk refused (maxRecordBackoff).
const stallRetryAfter = maxRecordBackoff

// errDispatchLate means a dispatch record was not durable by the request's
// deadline (the ledger's writes fail, and it retries them), or before the
// client went away: the request was not sent.
var errDispatchLate = errors.New("dispatch not durable in time")

// dispatch records the dispatch of a (Loop.dispatch), with the item's
// item.queued when it is not on its way yet, but waits for it only until
// the request's deadline or the client's going away: a client is not held
// past its deadline while the ledger's writes fail. The record may still
// land after that (errDispatchLate): once the ledger decides it, the
// request's item ends, failed, closing the dispatch, if it landed, with
// dispatch.interrupted (the request was never sent), so that the run has
// no dispatch without an outcome.
func (p *proxied) dispatch(ctx context.Context, a *attempt, deadline time.Time) error {
	l, ar, it, job := p.l, p.ar, p.job.Item, p.job
	queued := p.queued
	// deadline is on the loop's clock; a context's is on the wall's.
	wctx, cancel := context.WithTimeout(ctx, deadline.Sub(l.cfg.Clock.Now()))
	defer cancel()
	err := l.dispatch(wctx, ar, it, a, p.path, queued, func(f auditd.Future) {
		ar.posts.Add(1) // the run's end waits for the item's
		f.Then(func(stored []auditd.Event, err error) {
			defer ar.posts.Done()
			res := &auditd.ItemResult{Advertised: -1, Outcome: auditd.ItemFailed, Attempts: job.attempts.total}
			if err != nil {
				job.attempts.unspend(0)
				res.Attempts = job.attempts.total
				res.Reason = "the dispatch could not be recorded; nothing was sent"
				buf, n := l.eventBuf(), 0
				if queued != nil { // refused with the dispatch
					buf[n] = *queued
					n++
				}
				buf[n] = finishedEvent(it, res)
				l.post(ar, buf, n+1, nil, res)
				return
			}
			ar.live.Count(stored...)
			// Not sent, but on record: windows count it where R9 does.
			a.permit.Sent(stored[len(stored)-1].Time)
			res.Reason = "the dispatch record was durable only after the request's deadline; nothing was sent"
			buf := l.eventBuf()
			buf[0] = auditd.Event{Type: auditd.EventInterrupted, SourceID: it.SourceID, ItemKey: it.Key, Page: uint32(a.page),
				Attempt: a.n, Method: it.Method, Path: p.path, Reason: auditd.NotSentPrefix + ": its record was durable only after the request's deadline"}
			buf[1] = finishedEvent(it, res)
			l.post(ar, buf, 2, nil, res)
		})
	})
	if err == nil || errors.Is(err, errDispatchLate) || errors.Is(err, errSlotPassed) {
		p.queued = nil // on record, or on its way with the dispatch
	}
	return err
}

// gone ends the item of a request whose context ended before it got an
// answer: the client went away, the run was cancelled, or auditd is
// shutting down.
func (p *proxied) gone() error {
	reason := "the client went away before an answer"
	switch {
	case p.ar.isCancelled():
		reason = "cancelled"
	case p.l.ctx.Err() != nil:
		reason = "auditd shut down before an answer"
	}
	p.end(auditd.ItemFailed, reason, nil, "", nil)
	return auditd.Errorf(auditd.EUNAVAILABLE, "No answer: %s.", reason)
}

// giveUp ends a request that cannot be answered fresh: from the last good
// copy when the source allows it and there is one, as failed otherwise
// (an error of code for the client).
func (p *proxied) giveUp(reason, code string) error {
	if endUnanswered(p, reason, auditd.ItemFailed, reason) {
		return nil
	}
	if code == auditd.EUNAVAILABLE && p.meta.RetryAfter == 0 {
		p.meta.RetryAfter = time.Second
	}
	return auditd.Errorf(code, "%s.", upperFirst(reason))
}

// shed ends a request the gates could not admit before its deadline: the
// shed is recorded, then the last good copy is served when the source
// allows it, or the client is told when the gates expect to admit it.
func (p *proxied) shed(shed *limiter.ShedError) error {
	gate := string(shed.Gate)
	if endShed(p, p.job.Item, gate) {
		return nil
	}
	p.meta.RetryAfter = max(shed.Wait, time.Second)
	why := ""
	if p.lastReason != "" {
		why = " after " + p.lastReason
	}
	return auditd.Errorf(auditd.EUNAVAILABLE, "Not admitted by the request's deadline (the %s gate)%s; the gates expect to admit it in %v.",
		gate, why, p.meta.RetryAfter.Round(time.Millisecond))
}

// staleCopy returns the request's last good copy, when the source serves
// stale copies and the index holds one that still verifies.
func (p *proxied) staleCopy() (staging.Copy, bool) {
	if !p.src.Proxy.ServeStale {
		return staging.Copy{}, false
	}
	return p.l.lastGoodCopy(p.lastGood)
}

// serveStale answers the request from its last good copy, if there is one
// and it still verifies (staleCopy): cache.served is recorded and the item
// ends cached.
func (p *proxied) serveStale(reason string) bool {
	c, ok := p.staleCopy()
	return ok && p.serveCopy(c, reason)
}

// serveCopy answers the request from c, its last good copy, unless c can
// no longer be opened.
func (p *proxied) serveCopy(c staging.Copy, reason string) bool {
	l := p.l
	rc, err := l.cfg.Staging.Open(c.Sum)
	if err != nil {
		return false
	}
	defer rc.Close()
	cp := l.endCached(p, p.job.Item, c, reason)
	p.meta.Stale = &auditd.StaleCopy{PayloadHash: c.Sum, FetchedAt: c.FetchedAt.UTC(), Age: time.Duration(cp.Age), RunID: cp.OriginRun}
	br := bufio.NewReader(rc)
	h := http.Header{}
	if c.ContentType != "" {
		h.Set("Content-Type", c.ContentType)
	} else { // a batch run's copy, or one kept before copies kept headers
		head, _ := br.Peek(512)
		h.Set("Content-Type", http.DetectContentType(head))
	}
	if c.ContentEncoding != "" {
		h.Set("Content-Encoding", c.ContentEncoding)
	}
	if p.req.Method == http.MethodHead {
		p.out.Start(http.StatusOK, h, p.meta)
		return true
	}
	rw := p.rewriter(h, nil)
	var body io.Writer = p.out.Start(http.StatusOK, h, p.meta)
	if rw != nil {
		rw.w, body = body, rw
	}
	if _, err := io.Copy(body, br); err == nil && rw != nil {
		_ = rw.Close()
	}
	return true
}

func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
