package telemetry

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/registry"
)

// logEvent writes e's lifecycle line, if it has one.
func (t *Telemetry) logEvent(e *auditd.Event) {
	log := t.Log
	if log == nil {
		log = slog.Default()
	}
	switch e.Type {
	case auditd.EventRunStarted:
		var d struct {
			Name        string `json:"name"`
			Items       int    `json:"items"`
			InitiatedBy string `json:"initiated_by"`
		}
		json.Unmarshal([]byte(e.Detail), &d) // best effort: the line names the run either way
		log.Info("run started", "run", e.RunID, "name", d.Name, "items", d.Items, "by", d.InitiatedBy)
	case auditd.EventRunResumed:
		log.Info("run resumed", "run", e.RunID, "reason", e.Reason)
	case auditd.EventRunFinished:
		if runs := t.wired().runs; runs != nil {
			go logFinished(log, runs, e.RunID, string(e.Outcome))
		} else {
			log.Info("run finished", "run", e.RunID, "status", string(e.Outcome))
		}
	case auditd.EventBreaker:
		level := slog.LevelInfo
		if e.To == "open" {
			level = slog.LevelWarn
		}
		log.Log(context.Background(), level, "breaker "+e.To, "source", e.SourceID, "from", e.From,
			"failures", e.Failures, "threshold", e.Threshold, "cooldown", e.Cooldown)
	case auditd.EventThrottle:
		log.Info("refused", "source", e.SourceID, "run", e.RunID, "status", e.Status,
			"retry_after", e.RetryAfterRaw, "clamped", e.Clamped, "wait", e.Wait)
	case auditd.EventRegistryChanged:
		args := []any{"source", e.SourceID, "cause", e.Cause,
			"from_per_second", round(perSecond(e.OldLimit, e.OldWindow)), "to_per_second", round(perSecond(e.NewLimit, e.NewWindow))}
		if e.Group != "" {
			// A member's change and its group's are two events: the line
			// says which this is.
			var d struct {
				Scope string `json:"scope"`
			}
			json.Unmarshal([]byte(e.Detail), &d) // best effort: without it the line names the group only
			args = append(args, "group", e.Group)
			if d.Scope != "" {
				args = append(args, "scope", d.Scope)
			}
		}
		if e.Principal != "" {
			args = append(args, "by", e.Principal)
		}
		if e.Cause == registry.CauseConcurrency {
			// The slots moved, not the pace: the line says how many.
			var d struct {
				Old int `json:"old_concurrency"`
				New int `json:"concurrency"`
			}
			json.Unmarshal([]byte(e.Detail), &d) // best effort, as above
			args = append(args, "from_in_flight", d.Old, "to_in_flight", d.New)
		}
		log.Info("learned limit changed", args...)
	case auditd.EventShed:
		log.Warn("shed", "source", e.SourceID, "run", e.RunID, "gate", e.Gate)
	}
}

// logFinished logs run id's end with its counts and verdict, read once the
// commit that finished it is durable and the store has the run's end.
func logFinished(log *slog.Logger, runs Runs, id, status string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	args := []any{"run", id, "status", status}
	if v, err := waitEnded(ctx, runs, id); err == nil {
		c := v.Counts
		args = append(args, "items", c.Items, "succeeded", c.Succeeded, "cached", c.Cached, "failed", c.Failed,
			"shed", c.Shed, "pending", c.Pending, "dispatches", c.Dispatches, "status_429", c.Status429, "status_5xx", c.Status5xx)
	}
	balanced, failing, err := runs.Reconciled(ctx, id)
	if err != nil {
		log.Error("run finished; reconciliation failed", append(args, "err", err)...)
		return
	}
	args = append(args, "balanced", balanced)
	if !balanced {
		args = append(args, "failing", failing)
	}
	log.Info("run finished", args...)
}

// waitEnded returns run id's view once the store has its end, or the view
// it has after endWait. The store has the end a moment after run.finished
// is durable (the loop compacts staging first); read before it, the counts
// are not the last and the verdict is a running run's, which the reports
// service computes afresh for every request, so that a client asking right
// after the end would recount a large run a second time.
func waitEnded(ctx context.Context, runs Runs, id string) (auditd.RunView, error) {
	give := time.NewTimer(endWait)
	defer give.Stop()
	tick := time.NewTicker(endPoll)
	defer tick.Stop()
	for {
		v, err := runs.Run(ctx, id)
		if err != nil || v.Status.Terminal() {
			return v, err
		}
		select {
		case <-tick.C:
		case <-give.C:
			return v, nil
		case <-ctx.Done():
			return v, nil
		}
	}
}

// endWait bounds how long the finished run's log line waits for the store
// to have the run's end; endPoll is how often it looks.
const (
	endWait = 30 * time.Second
	endPoll = 20 * time.Millisecond
)

func round(v float64) float64 { return math.Round(v*1000) / 1000 }
