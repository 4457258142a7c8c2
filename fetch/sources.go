package fetch

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// gates set each source's gates (package limiter) from the registry:
// from its configuration when it is put, from what the registry learns
// of each response, and from what the ledger shows was sent before a
// start (seedGates).
type gates struct {
	registry *registry.Registry
	limiter  *limiter.Limiter
	ledger   Ledger
	clock    clock.Clock
	log      *slog.Logger
}

// PutSource creates or replaces a source on behalf of principal: the
// registry validates and stores it (and records source.changed), and the
// gates are reconfigured at once.
func (g *gates) PutSource(ctx context.Context, principal string, src auditd.Source) (created bool, err error) {
	created, err = g.registry.Put(ctx, principal, src)
	if err != nil {
		return false, err
	}
	stored, err := g.registry.GetSource(src.ID)
	if err != nil {
		return false, err
	}
	return created, g.configureGates(stored)
}

// minBackoffBase is the shortest own backoff after a failure.
const minBackoffBase = 50 * time.Millisecond

// configureGates sets a source's gates from its configuration (the ceiling)
// and what the registry has learned (the pace).
func (g *gates) configureGates(src auditd.Source) error {
	st, err := g.registry.State(src.ID)
	if err != nil {
		return err
	}
	cfg := limiter.ConfigFromSource(src)
	cfg.Limit, cfg.Window = st.CeilingLimit, st.CeilingWindow
	if st.Group != "" {
		// Members share one budget, so they must describe it alike: the
		// group's ceiling, and the default burst.
		cfg.Limit, cfg.Window, cfg.Burst = st.GroupCeilingLimit, st.GroupCeilingWindow, 0
	}
	// The own backoff starts at one request interval of the ceiling, not at
	// a fixed second: a 429 without Retry-After from a 10 r/s gateway should
	// cost about one slot, and the registry's cut does the slowing down.
	if cfg.Limit > 0 && cfg.Window > 0 {
		cfg.BackoffBase = min(max(cfg.Window/time.Duration(cfg.Limit), minBackoffBase), limiter.DefaultBackoffMax)
	}
	if err := g.limiter.Configure(src.ID, cfg); err != nil {
		return fmt.Errorf("configure limiter: %w", err)
	}
	if err := g.limiter.SetConcurrency(src.ID, st.Concurrency); err != nil {
		return fmt.Errorf("configure limiter: %w", err)
	}
	lim, err := g.registry.Limits(src.ID)
	if err != nil {
		return err
	}
	limit, window := lim.Pace()
	return g.limiter.SetLimit(src.ID, limit, window)
}

// SetLimit sets a source's learned limit by hand on behalf of principal
// (recorded as registry.changed, cause operator) and retunes its gates.
func (g *gates) SetLimit(ctx context.Context, principal, id string, limit int, window time.Duration) (registry.Limits, error) {
	lim, err := g.registry.SetLimit(ctx, principal, id, limit, window)
	if err != nil {
		return lim, err
	}
	pl, pw := lim.Pace()
	return lim, g.limiter.SetLimitByHand(id, pl, pw)
}

// Pace returns a function that reports the pace a source of reg runs at
// now, the registry's limits as the loop sets the gates to them: what the
// runs store estimates a run's finish from (runs.Options.Pace).
func Pace(reg *registry.Registry) func(sourceID string) (limit int, window time.Duration, err error) {
	return func(sourceID string) (int, time.Duration, error) {
		lim, err := reg.Peek(sourceID) // for views: never waits on a change in progress
		if err != nil {
			return 0, 0, err
		}
		limit, window := lim.Pace()
		return limit, window, nil
	}
}

// learn hands a response to the registry and applies what it decided: a new
// pace or concurrency for the source's gates, or a pause the server asked for.
// It reports whether the response was a refusal that showed only a window
// or quota spent (registry.Decision.Spent).
func (g *gates) learn(ctx context.Context, ar *activeRun, sourceID string, status int, out auditd.Outcome, sent time.Time, h hints.Hint, inFlight int) (spent bool) {
	d, err := g.registry.Observe(ctx, registry.Observation{
		RunID: ar.id, SourceID: sourceID, Status: status, Outcome: out, Sent: sent, Hint: h, InFlight: inFlight,
	})
	if err != nil {
		g.log.Error("registry observe", "source", sourceID, "err", err)
		return false
	}
	if d.Retune {
		limit, window := d.Pace()
		if err := g.limiter.SetLimit(sourceID, limit, window); err != nil {
			g.log.Error("retune limiter", "source", sourceID, "err", err)
		}
	}
	if d.ConcurrencyChanged {
		if err := g.limiter.SetConcurrency(sourceID, d.Concurrency); err != nil {
			g.log.Error("set concurrency", "source", sourceID, "err", err)
		}
	}
	if d.Pause > 0 {
		g.limiter.Pause(sourceID, g.clock.Now().Add(d.Pause))
	}
	return d.Spent
}
