package fetch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
)

// pageEnd says how the attempts at one page ended.
type pageEnd int

const (
	pageOK        pageEnd = iota // body holds a good response
	pageFailed                   // give up on the item: retries spent or not retryable
	pageShed                     // not admitted before the run's deadline
	pageAbandon                  // the loop is shutting down; the item resumes later
	pageCancelled                // the run was cancelled
)

// doItem carries out one item: every page in order, staging the payload,
// and ends it with exactly one item.finished, unless the loop shuts down
// first, in which case the item resumes at the next start.
func (l *Loop) doItem(ctx context.Context, ar *activeRun, item *auditd.Item) {
	attempts := ar.takeAttempts(item.Key) // the worker's alone
	it := &job{Item: item, attempts: &attempts}
	if ar.isCancelled() {
		l.endItem(ar, it, auditd.ItemFailed, "cancelled", nil, "", nil)
		return
	}
	src, err := l.cfg.Registry.GetSource(it.SourceID)
	if err != nil {
		l.endItem(ar, it, auditd.ItemFailed, "source removed: "+err.Error(), nil, "", nil)
		return
	}
	lastGoodKey := staging.RequestKey(it.SourceID, it.Method, it.Path, it.Body)
	ends := batchEnds{l, ar, it, lastGoodKey}
	if ar.replay {
		if ends.fallBack("replay") {
			return
		}
	}

	// Pages are built from the path as sent, and recorded redacted.
	sendable := it.Item
	if it.SendPath == runs.LostSendPath {
		l.endItem(ar, it, auditd.ItemFailed, "the path's credentials were sealed under a key this process does not hold; submit the item again", nil, "", nil)
		return
	} else if it.SendPath != "" {
		cp := *it.Item
		cp.Path, sendable = it.SendPath, &cp
	}

	w, err := l.cfg.Staging.NewWriter()
	if err != nil {
		l.endItem(ar, it, auditd.ItemFailed, "staging: "+err.Error(), nil, "", nil)
		return
	}
	defer w.Abort()
	res := &auditd.ItemResult{Advertised: -1}
	records := 0
	for p := 0; ; p++ {
		if p >= maxPages {
			ends.failOrServe(fmt.Sprintf("more than %d pages", maxPages))
			return
		}
		pg, err := pageRequest(sendable, p)
		if err != nil {
			l.endItem(ar, it, auditd.ItemFailed, err.Error(), nil, "", nil)
			return
		}
		body, end, reason := l.fetchPage(ctx, ar, &src, it, pg, lastGoodKey)
		switch end {
		case pageAbandon:
			return
		case pageCancelled:
			l.endItem(ar, it, auditd.ItemFailed, "cancelled", nil, "", nil)
			return
		case pageShed:
			ends.shed(reason)
			return
		case pageFailed:
			ends.failOrServe(reason)
			return
		}
		if p > 0 {
			w.Write([]byte("\n"))
		}
		if _, err := w.Write(body); err != nil {
			ends.failOrServe("staging: " + err.Error())
			return
		}
		res.Pages++
		if it.Paging == auditd.PagingNone {
			break
		}
		info, err := parsePage(it.Paging, body, records)
		if err != nil {
			ends.failOrServe(err.Error())
			return
		}
		records += info.records
		if info.total >= 0 {
			res.Advertised = info.total
		}
		if !info.more {
			break
		}
	}
	payload, err := w.Finish()
	if err != nil {
		ends.failOrServe("staging: " + err.Error())
		return
	}
	res.PayloadHash, res.Bytes, res.Records = payload.Sum, payload.N, records
	res.CountMatched = it.Paging != auditd.PagingNone && res.Advertised == records
	l.endItem(ar, it, auditd.ItemSucceeded, "", res, lastGoodKey, &payload)
}

// fetchPage sends one page until it succeeds, fails for good, or the run's
// deadline or the loop's life ends. It returns the body of a good response.
func (l *Loop) fetchPage(ctx context.Context, ar *activeRun, src *auditd.Source, it *job, pg page, lastGood string) ([]byte, pageEnd, string) {
	rctx := ar.recordCtx // not cancelled with the run: see activeRun.recordCtx
	rule := redact.New(src.SecretQuery)
	path := rule.URL(pg.path)
	maxAttempts := l.cfg.MaxAttempts
	if src.MaxAttempts > 0 {
		maxAttempts = src.MaxAttempts
	}
	var retryAt time.Time // own backoff after a 5xx or transport error
	var refused spell     // refusals of a spent window, in a row
	lastReason := ""
	recordFailures := 0    // dispatch records the ledger refused in a row
	var throttled *attempt // the dispatch a throttle answered, until the page's next dispatch
	for {
		if ctx.Err() != nil {
			if ar.isCancelled() {
				return nil, pageCancelled, "cancelled"
			}
			return nil, pageAbandon, ""
		}
		if charged := it.attempts.charged(pg.index); charged >= maxAttempts {
			reason := fmt.Sprintf("%d attempts spent", charged)
			if free := it.attempts.spent(pg.index) - charged; free > 0 {
				reason += fmt.Sprintf(" (and %d refusals of a spent window or quota)", free)
			}
			return nil, pageFailed, reason + "; last: " + lastReason
		}
		// A source that is down is answered from the item's last good copy
		// at once rather than waited for (admit).
		fallback := l.hasCopy(lastGood)
		p, end, err := l.admit(ctx, it.SourceID, limiter.Request{Cost: it.Cost, Deadline: ar.deadline, NotBefore: retryAt}, fallback)
		// The waits held back the page's next dispatch: they carry its attempt.
		recordAdmission(batchEnds{l, ar, it, lastGood}, it.Item, pg.index, uint32(it.attempts.spent(pg.index)+1), p, throttled)
		switch end {
		case admitDown:
			var down *limiter.DownError
			if errors.As(err, &down) && !fallback {
				// Down for OutageBound: a source that stays down ends the
				// run's items at once.
				return nil, pageFailed, downReason(down, l.cfg.Clock.Now())
			}
			return nil, pageFailed, "breaker open"
		case admitShed:
			var shed *limiter.ShedError
			errors.As(err, &shed)
			return nil, pageShed, string(shed.Gate)
		case admitGone:
			if ar.isCancelled() {
				return nil, pageCancelled, "cancelled"
			}
			return nil, pageAbandon, ""
		case admitFailed:
			return nil, pageFailed, "limiter: " + err.Error()
		}

		a := &attempt{page: pg.index, n: it.attempts.next(pg.index), permit: p}
		err = l.dispatch(rctx, ar, it.Item, a, path, nil, nil)
		if errors.Is(err, errBreakerOpened) || errors.Is(err, errPausedMeanwhile) {
			it.attempts.unspend(pg.index) // nothing was sent: the number is not spent
			continue
		} else if errors.Is(err, errSlotPassed) {
			// On record and closed, not sent: the number stays spent, but
			// not against the page's attempts.
			it.attempts.forgive(pg.index)
			recordFailures, throttled = 0, nil
			continue
		} else if err != nil {
			// Not durable, so not sent: the ledger never shows fewer
			// requests than the upstream received. The request waits and
			// goes back to the gates; only a shutdown leaves it, for the
			// next start.
			it.attempts.unspend(pg.index)
			if !l.pauseAfter(ctx, ar, "record dispatch", &recordFailures, err) {
				if ar.isCancelled() {
					return nil, pageCancelled, "cancelled"
				}
				return nil, pageAbandon, ""
			}
			continue
		}
		recordFailures = 0
		throttled = nil

		x := l.send(rctx, src, rule, it.Item, pg, a.permit.SendBy)
		if errors.Is(x.err, errSlotPassed) {
			l.slotPassed(ar, it.Item, a, path, wireLate)
			it.attempts.forgive(pg.index)
			continue
		}
		out, bodyErr, wait := l.settle(rctx, ar, src, it.Item, a, &x)
		final, pe, reason, backoff := pageVerdict(&x, out, bodyErr, rule)
		switch {
		case final && pe == pageOK:
			return x.body, pageOK, ""
		case final:
			return nil, pe, reason
		case backoff:
			retryAt = l.cfg.Clock.Now().Add(wait)
		case out == auditd.OutcomeThrottled:
			throttled = a
		}
		lastReason = reason
		if end := refused.note(a, it.attempts, l.cfg.Clock.Now(), reason); end != "" {
			return nil, pageFailed, end
		}
	}
}

// spell is a page's refusals in a row that showed only a window or quota
// spent (attempt.windowSpent).
type spell struct {
	from time.Time // the first of them; zero when the last answer was another
}

// note takes the answer to a, a dispatch of a page of an item with
// attempts ia, which came back at now for reason. A window or quota spent
// refuses whatever was asked: the page waits for it as the gates say,
// spending none of its attempts, unless the refusals outlast any window
// worth waiting for (RefusalBound). note returns why the page ends then,
// else "".
func (s *spell) note(a *attempt, ia *itemAttempts, now time.Time, reason string) string {
	if !a.windowSpent {
		s.from = time.Time{}
		return ""
	}
	ia.forgive(a.page)
	if s.from.IsZero() {
		s.from = now
		return ""
	}
	if now.Sub(s.from) < RefusalBound {
		return ""
	}
	return fmt.Sprintf("refused for %v, %d attempts answered by a spent window or quota that never reset; last: %s",
		now.Sub(s.from).Round(time.Second), ia.spent(a.page)-ia.charged(a.page), reason)
}

// RefusalBound is how long a page may meet refusals that show only a
// window or quota spent (registry.Decision.Spent, or a Retry-After the
// gates honour) before it ends failed. Such refusals spend none of the
// page's attempts: the server would refuse any request until its window
// resets. The bound is long enough for a window of ten minutes spent just
// after it began, and the pauses of the episode around its boundary; an
// upstream that refuses for good ends the page with a reason that says so.
const RefusalBound = 15 * time.Minute

// pageVerdict says what the answer x to a dispatch of a page (its outcome
// out, the error found in its body) means: the page's end (final), or
// another try for reason, after the own backoff when backoff is set and
// otherwise when the gates admit it.
func pageVerdict(x *exchange, out auditd.Outcome, bodyErr string, rule redact.Rule) (final bool, end pageEnd, reason string, backoff bool) {
	switch {
	case x.err != nil && isDenied(x.err):
		// Nothing left: the policy will refuse every try alike.
		return true, pageFailed, "transport error: " + x.err.Error(), false
	case x.err != nil:
		return false, 0, "transport error: " + x.err.Error(), true
	case out == auditd.OutcomeSuccess:
		return true, pageOK, "", false
	case out == auditd.OutcomeThrottled:
		return false, 0, fmt.Sprintf("throttled (%d)", x.status), false
	case out == auditd.OutcomeServerError:
		return false, 0, fmt.Sprintf("server error (%d)", x.status), true
	case out == auditd.OutcomeBodyError:
		// Grants.gov reports transient failures ("search is temporarily
		// unavailable") inside a 200: try again, paced by the gates,
		// until the attempts are spent.
		return false, 0, fmt.Sprintf("error in a %d body: %s", x.status, bodyErr), false
	case x.status >= 300 && x.status < 400:
		// Not followed: the next hop would be a request no dispatch
		// describes. Location is recorded redacted, as every path is.
		reason := fmt.Sprintf("redirect (%d) not followed", x.status)
		if loc := x.header.Get("Location"); loc != "" {
			reason += ": Location " + strconv.Quote(rule.Text(rule.URL(loc)))
		}
		return true, pageFailed, reason, false
	}
	return true, pageFailed, fmt.Sprintf("client error (%d)", x.status), false
}

// attempt is one dispatch of an item's page.
type attempt struct {
	page   int
	n      uint32          // its number: 1 for the page's first dispatch
	permit *limiter.Permit // the gates' admission
	sent   time.Time       // when its dispatch was recorded
	seq    uint64          // its dispatch's sequence number
	// throttledAt and pause are the time of the throttle that answered
	// it, as recorded, and the pause it asked for; zero otherwise.
	throttledAt time.Time
	pause       time.Duration
	// windowSpent is set when a refusal answered it that showed only a
	// window or quota spent: it spends none of the page's attempts.
	windowSpent bool
}

// exchange is what came back for one dispatch.
type exchange struct {
	body       []byte
	status     int         // 0 for a transport error
	header     http.Header // nil for a transport error
	receivedAt time.Time
	latency    time.Duration // from dispatch to the whole body
	err        error         // a transport error, its text redacted (scrubError)
	n          int64         // the body's size when body does not hold it (a proxied response streamed on)
	rewritten  int           // occurrences of the source's base URL rewritten in what the client got (proxy, rewrite_urls)
}

// size is the size of the response's body.
func (x *exchange) size() int64 { return max(int64(len(x.body)), x.n) }

// settle records how a dispatched request came back (its outcome event,
// breaker transitions) and lets the gates and the registry learn from it.
// It returns the outcome (none for a transport error), the code found in
// the body of a body error, and the wait the gates chose before a retry.
func (l *Loop) settle(ctx context.Context, ar *activeRun, src *auditd.Source, it *auditd.Item, a *attempt, x *exchange) (out auditd.Outcome, bodyErr string, wait time.Duration) {
	hint := hints.Parse(x.header, x.receivedAt)
	// The registry owns what Remaining and Reset teach (a pause of one
	// quota interval); handing them to the limiter as well would pause
	// until Reset on nearly every response of a source paced at its quota.
	gateHint := hint
	gateHint.HasRemaining, gateHint.HasReset = false, false
	// A plain 503 soon after the source's pace rose is nginx limit_req
	// refusing it: the registry says so, and the gates take it for a
	// throttle that pauses the source and leaves the breaker alone.
	refused := x.status == http.StatusServiceUnavailable && x.err == nil &&
		l.cfg.Registry.Refusal(registry.Observation{SourceID: it.SourceID, Status: x.status, Sent: a.sent, Hint: hint})
	v := a.permit.Observe(limiter.Outcome{Status: x.status, Err: x.err, Hint: gateHint, Attempt: int(a.n), Refused: refused})

	buf := l.eventBuf()
	e := &buf[0]
	*e = auditd.Event{SourceID: it.SourceID, ItemKey: it.Key, Page: uint32(a.page), Attempt: a.n, Latency: x.latency}
	switch {
	case x.err != nil:
		e.Type, e.ErrorText = auditd.EventTransportError, x.err.Error()
		l.post(ar, buf, 1, nil, nil)
	default:
		out, bodyErr = classify(x.status, hint.RetryAfterRaw != "", src.BodyError, x.body)
		e.Status, e.Bytes = x.status, x.size()
		if v.Class == limiter.ClassThrottled {
			e.Type = auditd.EventThrottle
			e.RetryAfterRaw, e.RetryAfter, e.Clamped = v.RetryAfterRaw, v.RetryAfter, v.Clamped
			e.Backoff, e.Wait = v.Backoff, v.Wait
			a.throttledAt, a.pause = l.recordThrottle(ctx, ar, *e), e.Wait
			l.freeEventBuf(buf)
			out = auditd.OutcomeThrottled
		} else {
			e.Type, e.Outcome, e.BodyError = auditd.EventResponse, out, bodyErr
			if x.rewritten > 0 {
				e.Detail = fmt.Sprintf(`{"urls_rewritten":%d}`, x.rewritten)
			}
			l.post(ar, buf, 1, nil, nil)
		}
	}
	l.recordBreaker(ctx, ar, it, v.Breaker)
	spent := l.learn(ctx, ar, it.SourceID, x.status, out, a.sent, hint, a.permit.InFlight)
	a.windowSpent = v.Class == limiter.ClassThrottled && (spent || v.HasRetryAfter && !v.Clamped)
	return out, bodyErr, v.Wait
}

// errBreakerOpened and errPausedMeanwhile mean the breaker opened, or a
// throttle paused the source, between a request's admission and its
// dispatch record; the request was not sent, and goes back to the gates.
var (
	errBreakerOpened   = errors.New("breaker opened before dispatch")
	errPausedMeanwhile = errors.New("source paused before dispatch")
)

// dispatch records the dispatch of a of item it, with the recorded path,
// after lead when there is one (events that go in the dispatch's commit: a
// proxied request's item.queued), and sets a.sent to its recorded time
// once it is durable, unless the source's breaker opened or a throttle
// paused it since the admission (then it releases the permit and says
// which). A request on a fleet slot whose record is durable only after
// the slot's time to leave by is not sent (errSlotPassed, slotPassed).
// It waits for the record until ctx ends. When that comes first
// and late is set (a proxied request, whose wait its deadline bounds),
// late is handed the record's future, and dispatch returns
// errDispatchLate: the request was not sent, and late ends it once the
// ledger has decided the record.
func (l *Loop) dispatch(ctx context.Context, ar *activeRun, it *auditd.Item, a *attempt, path string, lead *auditd.Event, late func(auditd.Future)) error {
	buf := l.eventBuf()
	n := 0
	if lead != nil {
		buf[n] = *lead
		n++
	}
	buf[n] = auditd.Event{Type: auditd.EventDispatch, RunID: ar.id, SourceID: it.SourceID, ItemKey: it.Key,
		Page: uint32(a.page), Attempt: a.n, Method: it.Method, Path: path, Probe: a.permit.Probe, Detail: auditd.CostDetail(a.permit.Cost)}
	e := buf[:n+1]
	f, err := l.queueDispatch(ar, it.SourceID, a.permit, e)
	if err != nil {
		l.freeEventBuf(buf)
		return err
	}
	if err := f.Wait(ctx); err != nil {
		a.permit.Release()
		// buf stays out of the pool: the ledger may still hold it.
		if late != nil {
			late(f)
			return errDispatchLate
		}
		return fmt.Errorf("append %s: %w", auditd.EventDispatch, err)
	}
	ar.live.Count(e...)
	a.sent, a.seq = e[n].Time, e[n].Seq
	// The request leaves now, after its record: every window counts it
	// at the time on record (its commit group, or a disk that refused it,
	// may have held it long after the gates admitted it).
	a.permit.Sent(a.sent)
	l.freeEventBuf(buf)
	if by := a.permit.SendBy; !by.IsZero() && l.cfg.Clock.Now().After(by) {
		l.slotPassed(ar, it, a, path, "its fleet slot passed while its record committed")
		return errSlotPassed
	}
	return nil
}

// errSlotPassed means a request admitted on a fleet slot was not sent: its
// dispatch record became durable, or it reached the wire (wireGate), after
// the time its slot allowed it to leave by (limiter.Permit.SendBy). The
// dispatch is on record and closed; the request goes back to the gates for
// a new slot, under a new attempt.
var errSlotPassed = errors.New("fleet slot passed before the request was sent")

// slotPassed closes a's dispatch, durable too late for its fleet slot, with
// dispatch.interrupted (posted: the run records it before anything after),
// and gives back its permit. The slot is spent: sent now, the request could
// reach the upstream in a window the fleet's other slots already fill.
func (l *Loop) slotPassed(ar *activeRun, it *auditd.Item, a *attempt, path, why string) {
	a.permit.Release()
	buf := l.eventBuf()
	buf[0] = auditd.Event{Type: auditd.EventInterrupted, SourceID: it.SourceID, ItemKey: it.Key, Page: uint32(a.page),
		Attempt: a.n, Method: it.Method, Path: path, Reason: auditd.NotSentPrefix + ": " + why}
	l.post(ar, buf, 1, nil, nil)
}

// wireLate is the not-sent reason of a request its wireGate held back.
const wireLate = "its fleet slot passed before it reached the wire"

// send performs one request with the source's secret headers and reads a
// capped body.
func (l *Loop) send(ctx context.Context, src *auditd.Source, rule redact.Rule, it *auditd.Item, pg page, sendBy time.Time) exchange {
	start := l.cfg.Clock.Now()
	var body io.Reader
	if len(pg.body) > 0 {
		body = bytes.NewReader(pg.body)
	}
	req, err := http.NewRequestWithContext(ctx, it.Method, strings.TrimRight(src.BaseURL, "/")+pg.path, body)
	if err != nil {
		return exchange{receivedAt: start, err: scrubError(err, rule)}
	}
	if len(pg.body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	} else {
		// A request with no body is one net/http's transport may resend on
		// its own when a kept-alive connection turns out closed; the upstream
		// would then receive a request the ledger never saw dispatched. A
		// non-nil body without GetBody makes it not replayable.
		req.Body = emptyBody{}
	}
	req.GetBody = nil
	req = gateWire(req, sendBy, l.cfg.Clock.Now)
	req.Header.Set("User-Agent", "auditd")
	headers, err := l.cfg.Registry.RequestHeaders(src.ID)
	if err != nil {
		return exchange{receivedAt: start, err: fmt.Errorf("source headers: %w", err)}
	}
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	failed := func(err error) exchange {
		now := l.cfg.Clock.Now()
		return exchange{receivedAt: now, latency: now.Sub(start), err: err}
	}
	resp, err := l.cfg.Client.Do(req)
	if err != nil {
		return failed(scrubError(err, rule))
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, l.cfg.MaxBodyBytes+1))
	if err != nil {
		return failed(fmt.Errorf("read body: %w", scrubError(err, rule)))
	}
	if int64(len(data)) > l.cfg.MaxBodyBytes {
		return failed(fmt.Errorf("response body larger than %d bytes", l.cfg.MaxBodyBytes))
	}
	now := l.cfg.Clock.Now()
	return exchange{body: data, status: resp.StatusCode, header: resp.Header, receivedAt: now, latency: now.Sub(start)}
}

// emptyBody is the body of a request that has none (see send): not nil,
// and not http.NoBody, which the transport takes for no body at all.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// scrubError returns err with its text built only from redacted URLs:
// net/http quotes the request's URL in its errors (url.Error), re-encoded
// (`Get "http://h/p%201?sq=SECRET": dial tcp ...`), so the path as
// submitted cannot be looked for in it. Every url.Error in the chain has
// its URL redacted before the text is made, and the text is redacted
// again as free text. The result keeps ErrAddressDenied for isDenied.
func scrubError(err error, rule redact.Rule) error {
	for e := err; e != nil; e = errors.Unwrap(e) {
		if ue, ok := e.(*url.Error); ok {
			ue.URL = rule.URL(ue.URL)
		}
	}
	return withText(err, rule.Text(err.Error()))
}

// withText is err's redacted text as an error, still ErrAddressDenied or
// errSlotPassed when err was.
func withText(err error, text string) error {
	switch {
	case isDenied(err):
		return &scrubbed{text: text, wrapped: ErrAddressDenied}
	case errors.Is(err, errSlotPassed):
		return &scrubbed{text: text, wrapped: errSlotPassed}
	}
	return errors.New(text)
}

// scrubbed is a redacted error text that still says what it wraps.
type scrubbed struct {
	text    string
	wrapped error
}

func (e *scrubbed) Error() string { return e.text }
func (e *scrubbed) Unwrap() error { return e.wrapped }

// waitEvent is the record of w, a spell the gates held an attempt of
// page of item it at.
func waitEvent(it *auditd.Item, page int, attempt uint32, w limiter.Wait) auditd.Event {
	return auditd.Event{Type: auditd.EventWait, SourceID: it.SourceID, ItemKey: it.Key, Page: uint32(page), Attempt: attempt,
		Gate: string(w.Gate), Wait: w.Planned, Actual: w.Actual}
}

// breakerEvent is the record of t, a move of the breaker of the item's source.
func breakerEvent(it *auditd.Item, t limiter.Transition) auditd.Event {
	return auditd.Event{Type: auditd.EventBreaker, SourceID: it.SourceID, ItemKey: it.Key,
		From: string(t.From), To: string(t.To), Failures: t.Failures, Threshold: t.Threshold, Cooldown: t.Cooldown}
}

// endItem ends an item: item.finished (preceded, for a success, by
// payload.staged) in one ledger commit group, whose transaction also
// stores a small payload's bytes and the record that makes the payload its
// request's last good copy (lastGood names the request), so the payload is
// on disk, and usable by any run that falls back on it, exactly when the
// ledger says it is staged (staging.Store.LastGoodRecord). It posts them (the worker goes on to its next item at
// once); once they are durable the item's result is kept with the run,
// and stored when it ends (storeEnd); item.finished carries all of the
// result, so a restart rebuilds it.
func (l *Loop) endItem(ar *activeRun, it *job, out auditd.Outcome, reason string, res *auditd.ItemResult, lastGood string, payload *staging.Payload) {
	if res == nil {
		res = &auditd.ItemResult{Advertised: -1}
	}
	res.Outcome, res.Reason = out, reason
	res.Attempts = it.attempts.total
	buf, n := l.eventBuf(), 0
	var puts []auditd.Put
	if payload != nil {
		puts = make([]auditd.Put, 0, 2) // the payload's spool entry, its last-good record
		if rec, ok := payload.Record(); ok {
			puts = append(puts, rec)
		}
		if lastGood != "" {
			puts = append(puts, l.cfg.Staging.LastGoodRecord(lastGood, staging.Copy{Sum: payload.Sum, FetchedAt: l.cfg.Clock.Now().UTC(), Run: ar.id,
				ContentType: it.contentType, ContentEncoding: it.contentEncoding}))
		}
		buf[n] = auditd.Event{Type: auditd.EventPayloadStaged, SourceID: it.SourceID, ItemKey: it.Key,
			PayloadHash: payload.Sum, Bytes: payload.N}
		n++
	}
	buf[n] = finishedEvent(it.Item, res)
	l.post(ar, buf, n+1, puts, res)
}

// finishedEvent is the item.finished event of an item that ended with res:
// the whole result, so that resume can rebuild it (resultOf).
func finishedEvent(it *auditd.Item, res *auditd.ItemResult) auditd.Event {
	e := auditd.Event{Type: auditd.EventItemFinished, SourceID: it.SourceID, ItemKey: it.Key,
		Outcome: res.Outcome, Reason: res.Reason, PayloadHash: res.PayloadHash, Bytes: res.Bytes, Attempts: uint32(res.Attempts)}
	if it.Paging != auditd.PagingNone && res.Pages > 0 {
		d, _ := json.Marshal(pagedDetail{Pages: res.Pages, Records: res.Records, Advertised: res.Advertised})
		e.Detail = string(d)
	}
	return e
}

// pagedDetail is the Detail of a paged item's item.finished.
type pagedDetail struct {
	Pages      int `json:"pages"`
	Records    int `json:"records"`
	Advertised int `json:"advertised"` // -1: the upstream gave no total
}

// resultOf rebuilds an item's result from its item.finished event, e.
func resultOf(it *auditd.Item, e *auditd.Event) (*auditd.ItemResult, error) {
	res := &auditd.ItemResult{Outcome: e.Outcome, Reason: e.Reason, PayloadHash: e.PayloadHash,
		Bytes: e.Bytes, Attempts: int(e.Attempts), Advertised: -1}
	switch {
	case e.Detail != "":
		var d pagedDetail
		if err := json.Unmarshal([]byte(e.Detail), &d); err != nil {
			return nil, fmt.Errorf("item.finished %d of %s: detail: %w", e.Seq, it.Key, err)
		}
		res.Pages, res.Records, res.Advertised = d.Pages, d.Records, d.Advertised
		res.CountMatched = d.Advertised == d.Records
	case e.Outcome == auditd.ItemSucceeded:
		res.Pages = 1
	}
	return res, nil
}

// costRefusal says why a unit of work (an item, a proxied request) of cost
// can never be admitted by its source's budget, or by its fleet's slots at
// the rate now, and how to split it; "" when it can be, or the source is
// unknown (which is refused apart).
func (g *gates) costRefusal(sourceID string, cost int, unit string) string {
	if cost <= 1 {
		return ""
	}
	b, err := g.limiter.Budget(sourceID)
	if err != nil {
		return ""
	}
	var ce *limiter.CostError
	if !errors.As(b.CheckCost(cost), &ce) {
		if err := g.limiter.CheckShared(sourceID, cost); err != nil {
			return fmt.Sprintf("A cost of %d cannot be served by source %s in its fleet: the fleet hands a cost as that many slots within its grace of each other, and at the source's rate they are further apart (%v). Split the %s into %ss of a smaller cost.", cost, sourceID, err, unit, unit)
		}
		return ""
	}
	bound := fmt.Sprintf("its bucket's capacity (burst) of %d", ce.Bound)
	if ce.Window > 0 {
		bound = fmt.Sprintf("its window's limit of %d per %v", ce.Bound, ce.Window)
	}
	return fmt.Sprintf("A cost of %d can never be admitted by source %s: it exceeds %s. Split the %s into %ss of at most %d.", cost, sourceID, bound, unit, unit, ce.Bound)
}
