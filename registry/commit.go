package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
)

// Causes: what taught a change, as recorded in registry.changed events.
const (
	CauseHeader    = "header"     // an advertised quota
	CauseThrottle  = "throttle"   // a refusal: 429, 503 with Retry-After, a plain 503 between successes
	CauseSlowStart = "slow_start" // a clean round before any refusal
	CauseRecover   = "recover"    // a clean round on the way back toward the rate last refused
	CauseProbeUp   = "probe_up"   // a probe past the rate last refused
	CauseOutage    = "outage"     // a plain 503's cut undone: an outage followed
	// CauseWindowSpent: a window that refused whatever the pace until it
	// reset, its quota spread evenly over its length.
	CauseWindowSpent = "window_spent"
	// CauseConcurrency: the slots (requests in flight) moved, cut by a
	// refusal that came only with more in flight, or grown at full use.
	CauseConcurrency = "concurrency"
	CauseOperator    = "operator"
)

// Scopes of a registry.changed event, in its Detail.
const (
	ScopeSource = "source"
	ScopeGroup  = "group"
)

// change says who and what taught a change.
type change struct {
	cause     string
	runID     string
	sourceID  string
	principal string
	status    int    // a refusal's status
	window    string // how an advertised window was learned
	remaining bool   // a Remaining of 0 taught it
}

// move sets e to l per w, taught by c, from state old, and reports whether
// the limit or window moved. Such a move is committed (ledger, then bbolt);
// a change of other state only (a new advertisement that leaves the limit
// where it was) is only persisted. Callers hold e.mu.
func (r *Registry) move(ctx context.Context, e *entry, old state, l int, w time.Duration, c change, now time.Time) (bool, error) {
	if l == old.Limit && w == old.Window.D() {
		if e.st == old {
			return false, nil
		}
		return false, r.persist(e)
	}
	e.set(l, w, c, now)
	return true, r.commit(ctx, e, old, c)
}

// changeDetail is the Detail of a registry.changed event.
type changeDetail struct {
	Scope string `json:"scope"`
	// Phase is the learning phase after the change.
	Phase string `json:"phase,omitempty"`
	// Status is the refusal's HTTP status, for a throttle.
	Status int `json:"status,omitempty"`
	// Refused is the rate last refused, in requests per second.
	Refused float64 `json:"refused_per_second,omitempty"`
	// Window says how the advertised window was learned, for a header.
	Window string `json:"window_from,omitempty"`
	// Remaining is set when a Remaining of 0 ended slow start.
	Remaining *int `json:"remaining,omitempty"`
	// OldConcurrency and Concurrency are the slots before and after a
	// concurrency change.
	OldConcurrency int `json:"old_concurrency,omitempty"`
	Concurrency    int `json:"concurrency,omitempty"`
}

// commit appends the registry.changed event for e's move from old, then
// persists e. An append error restores old.
func (r *Registry) commit(ctx context.Context, e *entry, old state, c change) error {
	ev := auditd.Event{
		Type:      auditd.EventRegistryChanged,
		RunID:     c.runID,
		SourceID:  c.sourceID,
		OldLimit:  old.Limit,
		NewLimit:  e.st.Limit,
		OldWindow: old.Window.D(),
		NewWindow: e.st.Window.D(),
		Cause:     c.cause,
		Principal: c.principal,
	}
	det := changeDetail{Scope: ScopeSource, Phase: e.st.Phase, Status: c.status, Window: c.window}
	if c.remaining {
		det.Remaining = new(int)
	}
	if c.cause == CauseConcurrency {
		det.OldConcurrency, det.Concurrency = e.concChange(old)
	}
	if c.cause == CauseThrottle {
		det.Refused = math.Round(e.st.Refused*1e4) / 1e4
	}
	if e.group {
		ev.Group, det.Scope = e.id, ScopeGroup
	} else {
		ev.Group = e.src.Group
	}
	detail, err := json.Marshal(det)
	if err != nil {
		return fmt.Errorf("encode registry.changed detail for %q: %w", e.id, err)
	}
	ev.Detail = string(detail)
	if _, err := r.opts.Ledger.Append(ctx, ev); err != nil {
		e.st = old
		if e.group {
			e.resum()
		}
		return fmt.Errorf("append registry.changed for %q: %w", e.id, err)
	}
	return r.persist(e)
}

// persist writes e's state. Callers hold e.mu.
func (r *Registry) persist(e *entry) error {
	v, err := json.Marshal(e.st)
	if err != nil {
		return fmt.Errorf("encode state of %q: %w", e.id, err)
	}
	name := bucketLearned
	if e.group {
		name = bucketGroups
	}
	if err := r.db.Update(func(tx *bolt.Tx) error {
		return bucket(tx, name).Put([]byte(e.id), v)
	}); err != nil {
		return fmt.Errorf("store state of %q: %w", e.id, err)
	}
	return nil
}
