package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
)

// Causes of registry.snapshot events.
const (
	CauseRunStart = "run.start"
	CauseRunEnd   = "run.end"
)

// StartRun appends a registry.snapshot (Cause "run.start") for each of the
// sources run runID uses. Call it after run.started, before the first item.
func (r *Registry) StartRun(ctx context.Context, runID string, sourceIDs []string) error {
	return r.snapshot(ctx, runID, CauseRunStart, sourceIDs)
}

// EndRun appends a registry.snapshot (Cause "run.end") for each of the
// sources run runID used. Call it before run.finished.
func (r *Registry) EndRun(ctx context.Context, runID string, sourceIDs []string) error {
	return r.snapshot(ctx, runID, CauseRunEnd, sourceIDs)
}

// snapshotDetail is the Detail of a registry.snapshot event.
type snapshotDetail struct {
	CeilingLimit     int             `json:"ceiling_limit"`
	CeilingWindow    auditd.Duration `json:"ceiling_window"`
	TaughtBy         string          `json:"taught_by,omitempty"`
	TaughtAt         time.Time       `json:"taught_at,omitzero"`
	AdvertisedLimit  int             `json:"advertised_limit,omitempty"`
	AdvertisedWindow auditd.Duration `json:"advertised_window,omitempty"`
	GroupLimit       int             `json:"group_limit,omitempty"`
	GroupWindow      auditd.Duration `json:"group_window,omitempty"`
	MembersLimit     int             `json:"members_limit,omitempty"`
	Tier             string          `json:"tier,omitempty"`
	// Burst is how many requests the source may send back to back on top
	// of its pace (the limiter's token bucket); reconciliation's R9 allows
	// it on top of the limit in force.
	Burst int `json:"burst"`
	// Concurrency is the requests it may have in flight, when learning
	// moved it from where it starts (its configured, else the default).
	Concurrency int `json:"concurrency,omitempty"`
}

func (r *Registry) snapshot(ctx context.Context, runID, cause string, sourceIDs []string) error {
	ids := make([]string, 0, len(sourceIDs))
	seen := make(map[string]bool, len(sourceIDs))
	for _, id := range sourceIDs {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // a run's snapshots read the same whatever order the caller had
	events := make([]auditd.Event, 0, len(ids))
	for _, id := range ids {
		s, err := r.State(id)
		if err != nil {
			return fmt.Errorf("snapshot %q: %w", id, err)
		}
		detail, err := json.Marshal(snapshotDetail{
			CeilingLimit:     s.CeilingLimit,
			CeilingWindow:    auditd.Duration(s.CeilingWindow),
			TaughtBy:         s.Cause,
			TaughtAt:         s.TaughtAt,
			AdvertisedLimit:  s.AdvertisedLimit,
			AdvertisedWindow: auditd.Duration(s.AdvertisedWindow),
			GroupLimit:       s.GroupLimit,
			GroupWindow:      auditd.Duration(s.GroupWindow),
			MembersLimit:     s.MembersLimit,
			Tier:             s.Source.Tier,
			Burst:            effectiveBurst(s),
			Concurrency:      movedConcurrency(s),
		})
		if err != nil {
			return fmt.Errorf("encode snapshot of %q: %w", id, err)
		}
		events = append(events, auditd.Event{
			Type:      auditd.EventRegistrySnapshot,
			RunID:     runID,
			SourceID:  id,
			NewLimit:  s.Limit,
			NewWindow: s.Window,
			Group:     s.Group,
			Snapshot:  cause,
			Detail:    string(detail),
		})
	}
	// A ledger that takes a batch makes a run's snapshots durable in one
	// commit instead of one per source.
	if b, ok := r.opts.Ledger.(batchAppender); ok {
		if _, err := b.AppendBatch(ctx, events); err != nil {
			return fmt.Errorf("append snapshots: %w", err)
		}
		return nil
	}
	for _, e := range events {
		if _, err := r.opts.Ledger.Append(ctx, e); err != nil {
			return fmt.Errorf("append snapshot of %q: %w", e.SourceID, err)
		}
	}
	return nil
}

// batchAppender is a ledger that appends several events in one commit.
type batchAppender interface {
	AppendBatch(ctx context.Context, events []auditd.Event) ([]auditd.Event, error)
}

// effectiveBurst is the burst the limiter gives a source: its configured
// Burst, the limiter's default when it sets none, and the default for a
// gateway group member (members share one budget, described alike).
func effectiveBurst(s State) int {
	if s.Source.Burst > 0 && s.Group == "" {
		return s.Source.Burst
	}
	return limiter.DefaultBurst
}
