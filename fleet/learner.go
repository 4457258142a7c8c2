package fleet

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/auditd/auditd/clock"
)

// Defaults for LearnerConfig.
const (
	DefaultLeaseTTL = 3 // seconds
	DefaultPeriod   = 2 * time.Second
)

// The learning rules' constants (Raise, CutTo).
const (
	// ProbeHold is how long after a refusal the learner holds the limit
	// just under the rate that was refused before it probes past it.
	ProbeHold = 30 * time.Second
	// Regain is how long after a cut the learner waits before it raises
	// again: the nodes' outcomes reach it a report late, and the cut must
	// show in them first.
	Regain = 5 * time.Second
	// Settle is how long a cut takes to reach the upstream's count: the
	// blocks a node already holds keep their spacing, up to a Block's
	// worth, and an upstream that counts over a sliding window of a
	// second or two still holds the requests sent before the cut. A
	// refusal of a request admitted sooner after the cut reached the node
	// is part of the episode the cut answered, and cuts nothing more.
	Settle = 3 * time.Second
	// Busy is the share of the limit the fleet's successes must reach in a
	// period for the limit, not the demand, to be what held them back: the
	// slots are spaced wider than the limit for the skew guard (some 7%
	// at a window of a second), and a node wastes a few at the ends of
	// its blocks.
	Busy = 0.7
	// ProbeBusy is the share of the rate last refused the fleet's
	// successes must reach in a period for the learner to probe past it.
	ProbeBusy = 0.85
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
	// DefaultLeaseTTL. A dead learner is replaced within it. The keys of
	// one Store with one TTL campaign on one session (one lease).
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
	lastAt  time.Time // when last was read
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
// the client is closed; a term that ends tries to resign for up to
// resignTries times DefaultTimeout (and DefaultRetry between tries).
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
	done, err := l.store.campaign(ctx, l.cfg.Key)
	if err != nil {
		return nil // ctx ended
	}
	defer done()
	sess, err := l.store.session(ctx, l.cfg.LeaseTTL)
	if err != nil {
		return fmt.Errorf("learner %s: %w", l.cfg.Key, err)
	}
	el := concurrency.NewElection(sess, l.store.leaderKey(l.cfg.Key))
	if err := el.Campaign(ctx, l.cfg.Node); err != nil {
		return fmt.Errorf("learner %s: campaign: %w", l.cfg.Key, err)
	}
	l.leading.Store(true)
	defer func() {
		l.leading.Store(false)
		rctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
		defer cancel()
		_ = l.resign(rctx, sess, el) // a failure: the key goes with the lease
	}()
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
		if err := l.step(ctx, el); err != nil {
			return err
		}
	}
}

// resignTries is how many times a term's end tries to delete its leader
// key (resign): Resign, then the same guarded delete again.
const resignTries = 3

// resign ends el's leadership at a term's end, so that another node is
// elected at once: sess is the node's, shared by its keys, and outlives
// the term. ctx bounds the first Resign. When it fails (etcd slow, a
// transient error), the leader key would live on with the node's lease,
// and no node could win the key's election while this one runs: a key
// dropped here but shared by other nodes would never be raised again.
// Resign forgets the key even when it fails, so the term's election is
// resumed (its key and create revision, which guards the delete: a later
// term's key is never deleted for this one's) and resigned again, up to
// resignTries in all, each within DefaultTimeout.
func (l *Learner) resign(ctx context.Context, sess *concurrency.Session, el *concurrency.Election) error {
	key, rev := el.Key(), el.Rev()
	err := el.Resign(ctx)
	for try := 1; err != nil && try < resignTries; try++ {
		// A short wait first: an error that comes back at once (no
		// connection) would use up every try in a moment.
		_ = clock.Sleep(context.Background(), l.clock, DefaultRetry)
		err = resignAgain(sess, key, rev)
	}
	return err
}

// resignAgain resigns the election whose leader key was key, created at
// rev, within DefaultTimeout.
func resignAgain(sess *concurrency.Session, key string, rev int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), DefaultTimeout)
	defer cancel()
	if err := concurrency.ResumeElection(sess, "", key, rev).Resign(ctx); err != nil {
		return fmt.Errorf("resign %s: %w", key, err)
	}
	return nil
}

// step reads the fleet's outcomes since the last step and raises the limit
// when the rules say so. It takes at most DefaultTimeout, and its raise is
// written only while el is still the key's leader: a learner whose lease
// ran out during a stalled step writes nothing over its successor's.
func (l *Learner) step(ctx context.Context, el *concurrency.Election) error {
	ctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	obs, err := l.store.outcomes(ctx, l.cfg.Key)
	if err != nil {
		return err
	}
	// Outcomes over more than a period and a half (a step that stalled,
	// or a term's first) are not one period's: the rules' thresholds are
	// a period's, and any long spell passes them. Start counting again.
	now := l.clock.Now()
	first := l.last == nil || now.Sub(l.lastAt) > l.cfg.Period*3/2
	l.lastAt = now
	var d Outcomes
	for node, o := range obs {
		p := l.last[node]
		d.OK += max(o.OK-p.OK, 0)
		d.Refused += max(o.Refused-p.Refused, 0)
	}
	l.last = obs
	cur, err := l.store.Limit(ctx, l.cfg.Key)
	if err != nil {
		return err
	}
	if cur.Revision == 0 {
		_, err = l.store.Start(ctx, l.cfg.Key, l.cfg.Start, l.cfg.Node)
		return err
	}
	if first {
		return nil
	}
	if cur.SpentAt, err = l.store.SpentAt(ctx, l.cfg.Key); err != nil {
		return err
	}
	next, raise := Raise(cur, l.cfg.Ceiling, d, l.cfg.Period, now)
	next.SpentAt = time.Time{}
	if !raise {
		return nil
	}
	next.Cause = CauseRaise
	leader := clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())
	got, ok, err := l.store.swapLimit(ctx, l.cfg.Key, cur, next, l.cfg.Node, leader)
	if err == nil && !ok && got.Revision == cur.Revision {
		// The limit is as read, so the leader guard failed: this term is
		// over (its key gone with a lapsed lease, or deleted). Campaign
		// again rather than lead on, raising nothing.
		return fmt.Errorf("learner %s: no longer the leader", l.cfg.Key)
	}
	return err // a cut written meanwhile wins: the swap fails, nothing to do
}

// Raise is the learner's rule, applied each period to the fleet's
// outcomes d over it. A refusal anywhere in the fleet keeps the limit (the
// node that saw it cuts), and so does demand that used less than Busy of
// it (the demand, not the limit, held the pace back). Otherwise:
//   - with no refusal remembered, the limit grows by half a period (slow
//     start);
//   - below nine tenths of the rate last refused, from Regain after the
//     cut, by up to a quarter, to nine tenths of it: a cut's three
//     quarters is regained in a period or two;
//   - there it holds until ProbeHold after the refusal, and after the last
//     window seen spent (Limit.SpentAt: at the quota, whether or not the
//     mark cut), then probes by 3% a period, each probe a refusal's risk,
//     in periods the fleet was answered at ProbeBusy of the refused rate
//     or more;
//   - once probes have gone a sixth past the refused rate with none
//     refused, and the fleet was answered at more than the refused rate in
//     the period, the limit has risen: the refusal is forgotten and slow
//     start resumes. Answered at less, the probes were never sent at the
//     rate, and the limit holds.
//
// It never goes above ceiling when one is told.
func Raise(cur Limit, ceiling Rate, d Outcomes, period time.Duration, now time.Time) (Limit, bool) {
	r := cur.Rate
	if d.Refused > 0 || r.Limit <= 0 || r.Window <= 0 {
		return cur, false
	}
	if float64(d.OK) < Busy*r.PerSecond()*period.Seconds() {
		return cur, false
	}
	next, ref := cur, cur.Refused.PerSecond()
	switch {
	case ref == 0:
		next.Rate = scale(r, 1.5)
	case now.Sub(cur.RefusedAt) < Regain:
		return cur, false
	case r.PerSecond() < 0.9*ref:
		next.Rate = scale(r, min(1.25, 0.9*ref/r.PerSecond()))
	case now.Sub(cur.RefusedAt) < ProbeHold || now.Sub(cur.SpentAt) < ProbeHold:
		return cur, false
	case float64(d.OK) < ProbeBusy*ref*period.Seconds():
		// Not answered near the rate refused: a probe past it would not
		// be sent at it (slots wasted, a window's count reached at a
		// lower pace), and would raise a limit the fleet does not act
		// on.
		return cur, false
	case r.PerSecond() >= ref*7/6 && float64(d.OK) < ref*period.Seconds():
		// The probes went past the refused rate, but the fleet was not
		// answered at it: they were never sent at it (slots wasted, a
		// fixed window's count reached at the same pace) and tell nothing.
		return cur, false
	case r.PerSecond() >= ref*7/6:
		next.Refused, next.RefusedAt = Rate{}, time.Time{}
		next.Rate = scale(r, 1.5)
	default:
		next.Rate = scale(r, 1.03)
	}
	if ceiling.Limit > 0 && next.Rate.PerSecond() >= ceiling.PerSecond() {
		next.Rate = ceiling // at the ceiling, counted over its window
	}
	return next, next.Rate.PerSecond() > r.PerSecond()
}

// CutTo is the rule any node cuts by on a refusal that no hint explains: to
// three quarters of the limit in force.
func CutTo(cur Rate) Rate { return scale(cur, 0.75) }

// TrimTo is the rule a node cuts by when a fixed window is seen spent
// after one or more went unspent, at a probe past the rate refused or at
// a settled limit every other window: to nineteen twentieths of the limit
// in force, rounded down (126 per 20 s to 119). The limit is just past the
// quota; the refusal's pause leaves the window after it unspent, so no
// two marks are a window apart to measure the quota by.
func TrimTo(cur Rate) Rate { return scale(cur, 0.95) }

// scale returns r times f. A small limit is first counted over a longer
// window (60 a minute, not 1 a second), so that a step of a twentieth is
// not rounded to nothing or to a doubling; a step up is at least one.
func scale(r Rate, f float64) Rate {
	if r.Limit <= 0 || r.Window <= 0 {
		return r
	}
	if r.Limit < 100 {
		k := min((100+r.Limit-1)/r.Limit, max(int(24*time.Hour/r.Window), 1))
		r = Rate{Limit: r.Limit * k, Window: r.Window * time.Duration(k)}
	}
	n := int(float64(r.Limit) * f)
	if f > 1 {
		n = max(n, r.Limit+1)
	}
	return Rate{Limit: max(n, 1), Window: r.Window}
}

// MinWindowAdmitted is the fewest requests the fleet must have had
// admitted between two spent windows for their pace to be taken as the
// quota (WindowRate).
const MinWindowAdmitted = 10

// WindowRate is the rule for a window seen spent twice: admitted requests
// were answered between the two refusals that began the episodes, span
// apart. A fixed window refuses at about the same point of each window it
// is spent in, so span is about whole windows and admitted their quota:
// the rate is admitted over span, WindowMargin longer, and it is not cut
// for the refusal. It returns false when too few were admitted to tell.
func WindowRate(admitted int64, span time.Duration) (Rate, bool) {
	if admitted < MinWindowAdmitted || span <= 0 || admitted > math.MaxInt32 {
		return Rate{}, false
	}
	return Rate{Limit: int(admitted), Window: (span + time.Duration(WindowMargin*float64(span))).Round(time.Millisecond)}, true
}

// WindowMargin is how much longer than the span between two spent windows
// WindowRate spreads their quota over. The point a window is spent at moves
// with the pace, so the span errs by a few percent either way (4.88 to
// 5.12 s between windows of 5 s in TestFleetUsesAFixedWindow); a pace just
// past the quota meets a refusal in every window, and each pauses the key
// for a backoff that may run into the next window (24 of 30 seen), where a
// pace just under it leaves a few percent unused.
const WindowMargin = 0.03
