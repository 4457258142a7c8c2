package fetch

import (
	"context"
	"errors"

	"github.com/auditd/auditd/limiter"
)

// admitEnd says how asking the gates for an attempt ended.
type admitEnd int

const (
	admitted    admitEnd = iota // the permit holds the attempt's admission
	admitDown                   // the breaker holds a source known to be down (limiter.DownError)
	admitShed                   // not admitted by the deadline (limiter.ShedError)
	admitGone                   // ctx ended first
	admitFailed                 // the limiter refused the request (unknown source, cost)
)

// admit is the gates' step of every attempt, a batch item's page and a
// proxied request alike: one call, so that both move the breaker's clock
// the same way. A request with a fallback (its last good copy, which the
// caller answers with when the source is down) is not held at an open
// breaker, nor in its backoff once the breaker opens: it is told at once
// (admitDown). Past the cooldown it may be the probe like any other, so a
// source whose callers answer from copies is still probed, and closes
// again. A source whose breaker has been open for OutageBound ends every
// request finding it open at once; until then a request without a
// fallback waits at the breaker, however many probes fail meanwhile.
func (g *gates) admit(ctx context.Context, sourceID string, req limiter.Request, fallback bool) (*limiter.Permit, admitEnd, error) {
	req.Fallback, req.DownFor = fallback, OutageBound
	p, err := g.limiter.Acquire(ctx, sourceID, req)
	var shed *limiter.ShedError
	switch {
	case err == nil:
		return p, admitted, nil
	case errors.Is(err, limiter.ErrSourceDown):
		return p, admitDown, err
	case errors.As(err, &shed):
		return p, admitShed, err
	case ctx.Err() != nil:
		return p, admitGone, err
	}
	return p, admitFailed, err
}
