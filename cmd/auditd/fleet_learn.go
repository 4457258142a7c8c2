package main

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
)

// fleetCause is the Cause of a registry.changed event that applies a
// limit the fleet learned (a node's cut, or the key's learner's raise).
const fleetCause = "fleet"

// fleetLearn is one shared key's learning on this node: its campaign for
// the key's learner, the watch that applies the learned limit to the key's
// slots, and the report of this node's outcomes. Any node cuts on a
// refusal it sees (cut); only the elected learner raises.
type fleetLearn struct {
	n       *fleetNode
	key     string
	share   *fleetShare
	rate    atomic.Pointer[fleet.Rate] // the rate applied to the slots
	refused atomic.Int64
	cancel  context.CancelFunc
	wg      sync.WaitGroup
}

// startLearn starts the shared learning of key, whose slots are s.
func (n *fleetNode) startLearn(key string, s *fleetShare) *fleetLearn {
	ctx, cancel := context.WithCancel(context.Background())
	fl := &fleetLearn{n: n, key: key, share: s, cancel: cancel}
	r := s.rate
	fl.rate.Store(&r)
	l := fleet.NewLearner(n.store, clock.Real{}, fleet.LearnerConfig{Key: key, Node: n.node, Ceiling: s.rate, Start: s.rate})
	// Not waited for: a campaign cancelled resigns on the client's own
	// context (concurrency.Election), which without a quorum ends only
	// when the node closes its etcd client.
	go func() { _ = l.Run(ctx) }()
	fl.wg.Go(func() { fl.apply(ctx) })
	fl.wg.Go(func() { fl.report(ctx) })
	return fl
}

func (fl *fleetLearn) stop() {
	fl.cancel()
	fl.wg.Wait()
}

// cut lowers the key's limit fleet-wide after a refusal this node saw. It
// runs apart from the caller, bounded by fleet.DefaultTimeout: etcd may be
// slow or cut off.
func (fl *fleetLearn) cut() {
	fl.refused.Add(1)
	next := fleet.CutTo(*fl.rate.Load())
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), fleet.DefaultTimeout)
		defer cancel()
		if _, _, err := fl.n.store.Cut(ctx, fl.key, next, fl.n.node); err != nil {
			fl.n.log.Warn("fleet: cut learned limit", "key", fl.key, "err", err)
		}
	}()
}

// apply follows the key's learned limit and makes it the rate of the
// key's slots from their next block, recording each change it applies.
func (fl *fleetLearn) apply(ctx context.Context) {
	ch := make(chan fleet.Limit)
	go func() {
		for ctx.Err() == nil {
			if err := fl.n.store.WatchLimit(ctx, fl.key, ch); err != nil && ctx.Err() == nil {
				fl.n.log.Warn("fleet: watch learned limit", "key", fl.key, "err", err)
				_ = clock.Sleep(ctx, clock.Real{}, time.Second)
			}
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case l := <-ch:
			if l.Revision == 0 {
				continue // nothing learned yet: the slots keep the ceiling
			}
			old := *fl.rate.Load()
			applied := fl.share.SetRate(l.Rate)
			if applied == old {
				continue
			}
			fl.rate.Store(&applied)
			fl.record(ctx, old, applied, l)
		}
	}
}

// record writes the applied change as registry.changed, with the etcd
// revision the limit was written at and the node that wrote it.
func (fl *fleetLearn) record(ctx context.Context, old, applied fleet.Rate, l fleet.Limit) {
	detail, _ := json.Marshal(fleetDetail{Node: fl.n.node, Revision: l.Revision, By: l.By})
	ev := auditd.Event{Type: auditd.EventRegistryChanged, Cause: fleetCause,
		OldLimit: old.Limit, OldWindow: old.Window, NewLimit: applied.Limit, NewWindow: applied.Window, Detail: string(detail)}
	if fl.share.member != fl.key {
		ev.Group = fl.key
	} else {
		ev.SourceID = fl.key
	}
	if _, err := fl.n.led.Append(ctx, ev); err != nil {
		fl.n.log.Error("fleet: record learned limit", "key", fl.key, "err", err)
	}
}

// report puts this node's outcomes of the key for its learner, once a
// learner period: the slots it used, and the refusals it saw.
func (fl *fleetLearn) report(ctx context.Context) {
	tick := time.NewTicker(fleet.DefaultPeriod / 2)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		o := fleet.Outcomes{OK: fl.share.Stats().Used, Refused: fl.refused.Load()}
		rctx, cancel := context.WithTimeout(ctx, fleet.DefaultTimeout)
		if err := fl.n.store.Report(rctx, fl.key, fl.n.node, o); err != nil && ctx.Err() == nil {
			fl.n.log.Debug("fleet: report outcomes", "key", fl.key, "err", err)
		}
		cancel()
	}
}
