package fetch

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// PutSource creates or replaces a source on behalf of principal: the
// registry validates and stores it (and records source.changed), and the
// gates are reconfigured at once.
func (l *Loop) PutSource(ctx context.Context, principal string, src auditd.Source) (created bool, err error) {
	created, err = l.cfg.Registry.Put(ctx, principal, src)
	if err != nil {
		return false, err
	}
	stored, err := l.cfg.Registry.GetSource(src.ID)
	if err != nil {
		return false, err
	}
	return created, l.configureGates(stored)
}

// minBackoffBase is the shortest own backoff after a failure.
const minBackoffBase = 50 * time.Millisecond

// configureGates sets a source's gates from its configuration (the ceiling)
// and what the registry has learned (the pace).
func (l *Loop) configureGates(src auditd.Source) error {
	st, err := l.cfg.Registry.State(src.ID)
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
	if err := l.cfg.Limiter.Configure(src.ID, cfg); err != nil {
		return fmt.Errorf("configure limiter: %w", err)
	}
	if err := l.cfg.Limiter.SetConcurrency(src.ID, st.Concurrency); err != nil {
		return fmt.Errorf("configure limiter: %w", err)
	}
	lim, err := l.cfg.Registry.Limits(src.ID)
	if err != nil {
		return err
	}
	limit, window := lim.Pace()
	return l.cfg.Limiter.SetLimit(src.ID, limit, window)
}

// sendLock returns the lock that orders a source's dispatch, throttle and
// breaker records: a request admitted just before another worker opens the
// breaker or pauses the source must not be recorded as dispatched after it.
// Members of a gateway group share one lock, as they share one pause.
func (l *Loop) sendLock(sourceID string) *sync.Mutex {
	key := sourceID
	if lim, err := l.cfg.Registry.Limits(sourceID); err == nil && lim.Group != "" {
		key = "group:" + lim.Group
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.sendLocks[key]
	if m == nil {
		m = &sync.Mutex{}
		l.sendLocks[key] = m
	}
	return m
}

// SetLimit sets a source's learned limit by hand on behalf of principal
// (recorded as registry.changed, cause operator) and retunes its gates.
func (l *Loop) SetLimit(ctx context.Context, principal, id string, limit int, window time.Duration) (registry.Limits, error) {
	lim, err := l.cfg.Registry.SetLimit(ctx, principal, id, limit, window)
	if err != nil {
		return lim, err
	}
	pl, pw := lim.Pace()
	return lim, l.cfg.Limiter.SetLimit(id, pl, pw)
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
