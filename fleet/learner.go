package fleet

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/auditd/auditd/clock"
)

// Defaults for LearnerConfig.
const (
	DefaultLeaseTTL = 3 // seconds
	DefaultPeriod   = 2 * time.Second
)

// LearnerConfig shapes one key's learner on one node.
type LearnerConfig struct {
	Key  string
	Node string
	// Ceiling is the rate the fleet is told, if any: no raise goes above
	// it. Zero when the limit is not told.
	Ceiling Rate
	// Start is the limit the learner starts from when none is stored.
	Start Rate
	// LeaseTTL is the election session's lease in seconds; default
	// DefaultLeaseTTL. A dead learner is replaced within it.
	LeaseTTL int
	// Period is how often the leader reads the fleet's outcomes and
	// decides; default DefaultPeriod.
	Period time.Duration
}

// Learner campaigns for a key's learning on one node; the node elected
// raises the key's limit from every node's reported outcomes. It never
// cuts: any node cuts at once (Store.Cut) on a refusal it sees.
type Learner struct {
	cfg     LearnerConfig
	store   *Store
	clock   clock.Clock
	leading atomic.Bool
	last    map[string]Outcomes
}

// NewLearner returns the learner of cfg.Key on store.
func NewLearner(store *Store, c clock.Clock, cfg LearnerConfig) *Learner {
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.Period == 0 {
		cfg.Period = DefaultPeriod
	}
	return &Learner{cfg: cfg, store: store, clock: c}
}

// Leading reports whether this node is the key's learner now.
func (l *Learner) Leading() bool { return l.leading.Load() }

// Run campaigns until ctx ends: it waits to be elected, then learns until
// its session's lease is lost or ctx ends, and campaigns again. A learner
// elected starts from the stored limit and from the outcomes as it first
// reads them (the probe of a learner that died is not carried over). A
// campaign cancelled resigns on the etcd client's context
// (concurrency.Election), so without a quorum Run may outlive ctx until
// the client is closed.
func (l *Learner) Run(ctx context.Context) error {
	for ctx.Err() == nil {
		if err := l.term(ctx); err != nil && ctx.Err() == nil {
			if err := clock.Sleep(ctx, l.clock, time.Second); err != nil {
				return nil
			}
		}
	}
	return nil
}

// term is one campaign and, once elected, one term of learning.
func (l *Learner) term(ctx context.Context) error {
	sess, err := concurrency.NewSession(l.store.client, concurrency.WithTTL(l.cfg.LeaseTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("learner %s: session: %w", l.cfg.Key, err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, l.store.leaderKey(l.cfg.Key))
	if err := el.Campaign(ctx, l.cfg.Node); err != nil {
		return fmt.Errorf("learner %s: campaign: %w", l.cfg.Key, err)
	}
	l.leading.Store(true)
	defer l.leading.Store(false)
	l.last = nil
	for {
		t := l.clock.NewTimer(l.cfg.Period)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-sess.Done():
			t.Stop()
			return fmt.Errorf("learner %s: lease lost", l.cfg.Key)
		case <-t.C():
		}
		if err := l.step(ctx); err != nil {
			return err
		}
	}
}

// step reads the fleet's outcomes since the last step and raises the limit
// when the rules say so.
func (l *Learner) step(ctx context.Context) error {
	obs, err := l.store.outcomes(ctx, l.cfg.Key)
	if err != nil {
		return err
	}
	first := l.last == nil
	var d Outcomes
	for node, o := range obs {
		p := l.last[node]
		d.OK += max(o.OK-p.OK, 0)
		d.Refused += max(o.Refused-p.Refused, 0)
	}
	l.last = obs
	if first {
		return nil
	}
	cur, err := l.store.Limit(ctx, l.cfg.Key)
	if err != nil {
		return err
	}
	r := cur.Rate
	if cur.Revision == 0 {
		r = l.cfg.Start
	}
	next, raise := Raise(r, l.cfg.Ceiling, d, l.cfg.Period)
	if !raise {
		return nil
	}
	_, _, err = l.store.swapLimit(ctx, l.cfg.Key, cur, next, l.cfg.Node)
	return err // a cut written meanwhile wins: the swap fails, nothing to do
}

// Raise is the learner's rule: over a period with no refusal anywhere in
// the fleet, in which the fleet used at least four fifths of the limit (it
// is the limit, not the demand, that holds the pace back; slots are spaced
// a little wider than the limit for the skew guard), the limit is
// raised by a tenth (at least one), never above ceiling when one is told.
// A refusal, or demand below the limit, keeps it.
func Raise(cur, ceiling Rate, d Outcomes, period time.Duration) (Rate, bool) {
	if d.Refused > 0 || cur.Limit <= 0 || cur.Window <= 0 {
		return cur, false
	}
	allowed := cur.perSecond() * period.Seconds()
	if float64(d.OK) < 0.8*allowed {
		return cur, false
	}
	next := Rate{Limit: cur.Limit + max(cur.Limit/10, 1), Window: cur.Window}
	if ceiling.Limit > 0 && next.perSecond() > ceiling.perSecond() {
		next = ceiling
	}
	return next, next.perSecond() > cur.perSecond()
}

// CutTo is the rule any node cuts by on a refusal: to three quarters of
// the limit in force, at least one in its window.
func CutTo(cur Rate) Rate {
	return Rate{Limit: max(cur.Limit*3/4, 1), Window: cur.Window}
}
