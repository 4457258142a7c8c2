package fleet

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limit is a key's learned limit as etcd holds it.
type Limit struct {
	Key  string
	Rate Rate // zero when nothing was learned yet
	// Refused is the rate in force when a node last saw a refusal that cut
	// it, at RefusedAt; zero when none is remembered. The learner raises
	// toward it quickly and probes past it slowly (Raise).
	Refused   Rate
	RefusedAt time.Time
	// By names the node that wrote it, and Cause why (Cause*; empty in a
	// value written by an older build).
	By    string
	Cause string
	// Revision is the etcd revision it was written at; 0 when never written.
	Revision int64
	// SpentAt is when a node last marked the key's window spent
	// (Store.Spent), as the learner read it; not part of the stored
	// limit. A spent window is a refusal too, whether or not it cut.
	SpentAt time.Time
}

// What changed a learned limit (Limit.Cause): the cause of its
// fleet.learned records.
const (
	CauseStart       = "start"        // the first node to share the key wrote where learning starts
	CauseOperator    = "operator"     // set by hand on a node
	CauseRefused     = "refused"      // cut by a quarter for a refusal no hint explained
	CauseWindowSpent = "window_spent" // a fixed window's quota over its length (WindowRate)
	CauseQuota       = "quota"        // held to a quota the server advertised
	CauseRaise       = "raise"        // raised by the key's learner (Raise)
)

// knownCause reports whether c is one of the Cause constants.
func knownCause(c string) bool {
	switch c {
	case CauseStart, CauseOperator, CauseRefused, CauseWindowSpent, CauseQuota, CauseRaise:
		return true
	}
	return false
}

// Outcomes are one node's counts of a key's responses since it began
// sharing the key: cumulative, so a report lost or read twice costs nothing.
type Outcomes struct {
	OK      int64 // answered, not refused
	Refused int64 // 429, or a spent quota
}

// MaxWindow is the longest window a rate of the fleet is counted over, the
// limiter's (limiter.MaxWindow). A longer one (a window of 10^20 seconds
// that parses to the longest time.Duration) would overflow the slots'
// spacing, and every reservation of the key would fail on every node.
const MaxWindow = 366 * 24 * time.Hour

// Valid reports whether r can be the fleet's rate: a positive limit over a
// window of at most MaxWindow.
func (r Rate) Valid() bool {
	return r.Limit > 0 && r.Window > 0 && r.Window <= MaxWindow
}

// PerSecond is r's limit a second, to order and show rates.
func (r Rate) PerSecond() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Limit) / r.Window.Seconds()
}

func (s *Store) limitKey(key string) string  { return s.prefix + "learn/" + key + "/limit" }
func (s *Store) leaderKey(key string) string { return s.prefix + "learn/" + key + "/leader" }
func (s *Store) obsPrefix(key string) string { return s.prefix + "learn/" + key + "/obs/" }
func (s *Store) spentKey(key string) string  { return s.prefix + "learn/" + key + "/spent" }

// Limit reads key's learned limit.
func (s *Store) Limit(ctx context.Context, key string) (Limit, error) {
	resp, err := s.client.Get(ctx, s.limitKey(key))
	if err != nil {
		return Limit{}, fmt.Errorf("limit %s: %w", key, err)
	}
	return limitOf(key, resp.Kvs)
}

// Start writes r as key's learned limit when none is stored yet, and
// returns the limit in force: the first node to share a key sets where
// the fleet's learning starts.
func (s *Store) Start(ctx context.Context, key string, r Rate, by string) (Limit, error) {
	l, _, err := s.swapLimit(ctx, key, Limit{}, Limit{Rate: r, Cause: CauseStart}, by)
	if err != nil {
		return Limit{}, fmt.Errorf("start %s: %w", key, err)
	}
	return l, nil
}

// Set writes r as key's learned limit whatever it was, by a
// compare-and-swap retried on conflict, forgetting any refusal remembered:
// an operator set it.
func (s *Store) Set(ctx context.Context, key string, r Rate, by string) (Limit, error) {
	cur, err := s.Limit(ctx, key)
	for err == nil || errors.Is(err, errBadLimit) {
		// A malformed limit (another writer's, or a window past MaxWindow
		// an older build let through) is written over at its revision: an
		// operator's limit is the way out of it.
		var ok bool
		if cur, ok, err = s.swapLimit(ctx, key, cur, Limit{Rate: r, Cause: CauseOperator}, by); ok {
			return cur, nil
		}
	}
	return Limit{}, fmt.Errorf("set %s: %w", key, err)
}

// Cut lowers key's learned limit to to, fleet-wide, by a compare-and-swap
// on the key's revision, retried on conflict, and remembers refused (the
// rate the refusal was seen at) for the learner, and cause (CauseRefused,
// CauseWindowSpent or CauseQuota). It never raises it, so a
// cut by any node wins over a raise written meanwhile, and a second node
// cutting for the same refusals finds the limit already low enough. It
// returns the limit in force and whether this call wrote it.
func (s *Store) Cut(ctx context.Context, key string, to, refused Rate, cause, by string) (Limit, bool, error) {
	cur, err := s.Limit(ctx, key)
	for err == nil {
		if cur.Revision != 0 && cur.Rate.PerSecond() <= to.PerSecond() {
			return cur, false, nil
		}
		var ok bool
		next := Limit{Rate: to, Refused: refused, RefusedAt: s.clock.Now(), Cause: cause}
		if cur, ok, err = s.swapLimit(ctx, key, cur, next, by); ok {
			return cur, true, nil
		}
	}
	return Limit{}, false, fmt.Errorf("cut %s: %w", key, err)
}

// swapLimit writes next (its Rate, Refused, RefusedAt and Cause) over from when
// key's limit is still at from's revision and every guard holds; otherwise
// it returns the limit found and false. A rate that is not Valid is never
// written: every write of a learned limit comes here.
func (s *Store) swapLimit(ctx context.Context, key string, from Limit, next Limit, by string, guard ...clientv3.Cmp) (Limit, bool, error) {
	if !next.Rate.Valid() {
		return Limit{}, false, fmt.Errorf("%d per %v: %w", next.Rate.Limit, next.Rate.Window, ErrInvalidRate)
	}
	rev, now, err := s.putAt(ctx, s.limitKey(key), from.Revision, limitValue(next, by), guard...)
	if err != nil {
		return Limit{}, false, err
	}
	if rev != 0 {
		next.Key, next.By, next.Revision = key, by, rev
		return next, true, nil
	}
	cur, err := limitOf(key, now)
	return cur, false, err
}

// Report puts node's outcomes of key, for the key's learner to read.
func (s *Store) Report(ctx context.Context, key, node string, o Outcomes) error {
	_, err := s.client.Put(ctx, s.obsPrefix(key)+node, fmt.Sprintf("%d %d", o.OK, o.Refused))
	if err != nil {
		return fmt.Errorf("report %s: %w", key, err)
	}
	return nil
}

// outcomes reads every node's reported outcomes of key.
func (s *Store) outcomes(ctx context.Context, key string) (map[string]Outcomes, error) {
	p := s.obsPrefix(key)
	resp, err := s.client.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("outcomes %s: %w", key, err)
	}
	out := make(map[string]Outcomes, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var o Outcomes
		if _, err := fmt.Sscanf(string(kv.Value), "%d %d", &o.OK, &o.Refused); err != nil {
			return nil, fmt.Errorf("outcomes %s: %q: %w", kv.Key, kv.Value, err)
		}
		out[strings.TrimPrefix(string(kv.Key), p)] = o
	}
	return out, nil
}

// WatchLimit sends key's learned limit to ch, first as it stands and then
// at every change, until ctx ends.
func (s *Store) WatchLimit(ctx context.Context, key string, ch chan<- Limit) error {
	resp, err := s.client.Get(ctx, s.limitKey(key))
	if err != nil {
		return fmt.Errorf("limit %s: %w", key, err)
	}
	cur, err := limitOf(key, resp.Kvs)
	if err != nil {
		return err
	}
	if !sendLimit(ctx, ch, cur) {
		return ctx.Err()
	}
	// From the read's revision, not the limit's: with none stored yet that
	// is 0, and a watch from revision 1 fails on a compacted etcd.
	wc := s.client.Watch(clientv3.WithRequireLeader(ctx), s.limitKey(key), clientv3.WithRev(resp.Header.Revision+1))
	for resp := range wc {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch limit %s: %w", key, err)
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			l, err := limitOf(key, []*mvccpb.KeyValue{ev.Kv})
			if err != nil {
				return err
			}
			if !sendLimit(ctx, ch, l) {
				return ctx.Err()
			}
		}
	}
	return ctx.Err()
}

func sendLimit(ctx context.Context, ch chan<- Limit, l Limit) bool {
	select {
	case ch <- l:
		return true
	case <-ctx.Done():
		return false
	}
}

var errBadLimit = errors.New("malformed learned limit")

// limitValue is l, written by by, as learn/<key>/limit holds it: "limit
// window refused refused_window refused_at cause by", the durations and
// the time in nanoseconds, the cause left out when l has none.
func limitValue(l Limit, by string) string {
	var at int64
	if !l.RefusedAt.IsZero() {
		at = l.RefusedAt.UnixNano()
	}
	if l.Cause != "" {
		by = l.Cause + " " + by
	}
	return fmt.Sprintf("%d %d %d %d %d %s", l.Rate.Limit, l.Rate.Window.Nanoseconds(),
		l.Refused.Limit, l.Refused.Window.Nanoseconds(), at, by)
}

func limitOf(key string, kvs []*mvccpb.KeyValue) (Limit, error) {
	if len(kvs) == 0 {
		return Limit{Key: key}, nil
	}
	bad := fmt.Errorf("%s: %q: %w", key, kvs[0].Value, errBadLimit)
	malformed := Limit{Key: key, Revision: kvs[0].ModRevision} // for Set to write over
	f := strings.SplitN(string(kvs[0].Value), " ", 6)
	if len(f) != 6 {
		return malformed, bad
	}
	// As limitValue writes it; an older build wrote no cause.
	var cause string
	if c, by, ok := strings.Cut(f[5], " "); ok && knownCause(c) {
		cause, f[5] = c, by
	}
	var n [5]int64
	for i := range n {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil || v < 0 {
			return malformed, bad
		}
		n[i] = v
	}
	r := Rate{Limit: int(n[0]), Window: time.Duration(n[1])} // n[0] checked below before r is used
	if n[0] > math.MaxInt32 || !r.Valid() {
		return malformed, bad
	}
	l := Limit{Key: key, Rate: r, By: f[5], Cause: cause, Revision: kvs[0].ModRevision}
	if n[2] > 0 && n[3] > 0 && n[2] <= math.MaxInt32 {
		l.Refused, l.RefusedAt = Rate{Limit: int(n[2]), Window: time.Duration(n[3])}, time.Unix(0, n[4])
	}
	return l, nil
}

// SetRate makes r the rate of the slots this node reserves from its next
// block, never above the told ceiling (the Config's Rate): the rate a
// key's learner, or a cut, agreed on. quota is a quota the upstream
// advertises, zero when none: the slots are never spaced closer than its
// Interval either (guarded). Held blocks keep their spacing. It returns
// the rate applied.
func (s *Slots) SetRate(r, quota Rate) Rate {
	if !r.Valid() || r.PerSecond() > s.cfg.Rate.PerSecond() {
		r = s.cfg.Rate
	}
	iv := guarded(r, s.cfg.Rate, quota, s.cfg.Grace, s.cfg.MaxSkew).Nanoseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interval = iv
	s.max = max(1, int(s.cfg.Block.Nanoseconds()/iv))
	return r
}

// guarded is the spacing of r's slots (Interval), never closer than the
// ceiling's own, nor than an advertised quota's when it is Valid: a
// learned rate is often counted over a longer window than theirs (scale:
// 200 per 20 s, not 10 per second), which spreads the guard over it, and
// slots spaced by it alone could put 11 takes in a second of a told, or
// advertised, 10 per second. Their spacing holds each limit in every
// window of its length, whatever r's window.
func guarded(r, ceiling, quota Rate, grace, skew time.Duration) time.Duration {
	iv := max(Interval(r, grace, skew), Interval(ceiling, grace, skew))
	if quota.Valid() {
		iv = max(iv, Interval(quota, grace, skew))
	}
	return iv
}

// Spent marks, fleet-wide, that key's window was seen spent at at: the
// first plain refusal of an episode on any node. It returns the time since
// the mark before it, the requests the fleet had answered between the two
// (as every node last reported them, once a second), and the shortest such
// span seen before (0 when none); ok false when there was no mark before.
// The shortest span of minWindow or more is kept as the window's length.
// The mark replaces the one it was measured from by compare-and-swap: of
// two nodes marking at once, the second is measured from the first's.
func (s *Store) Spent(ctx context.Context, key string, at time.Time) (span time.Duration, admitted int64, window time.Duration, ok bool, err error) {
	obs, err := s.outcomes(ctx, key)
	if err != nil {
		return 0, 0, 0, false, err
	}
	var n int64
	for _, o := range obs {
		n += o.OK
	}
	k := s.spentKey(key)
	resp, err := s.client.Get(ctx, k)
	if err != nil {
		return 0, 0, 0, false, fmt.Errorf("spent %s: %w", key, err)
	}
	for kvs := resp.Kvs; ; {
		var last spentMark
		var rev int64
		span = 0
		if len(kvs) > 0 {
			if last, err = parseSpent(string(kvs[0].Value)); err != nil {
				return 0, 0, 0, false, fmt.Errorf("spent %s: %w", key, err)
			}
			span, rev = at.Sub(time.Unix(0, last.At)), kvs[0].ModRevision
		}
		next := spentMark{At: at.UnixNano(), Answered: n, Window: last.Window}
		if rev != 0 && n-last.Answered >= MinWindowAdmitted && span >= minWindow && (last.Window == 0 || span.Nanoseconds() < last.Window) {
			next.Window = span.Nanoseconds()
		}
		var wrote int64
		if wrote, kvs, err = s.putAt(ctx, k, rev, next.String()); err != nil {
			return 0, 0, 0, false, fmt.Errorf("spent %s: %w", key, err)
		}
		if wrote != 0 {
			return span, n - last.Answered, time.Duration(last.Window), rev != 0, nil
		}
	}
}

// SpentAt returns when a node last marked key's window spent (zero when
// none has).
func (s *Store) SpentAt(ctx context.Context, key string) (time.Time, error) {
	resp, err := s.client.Get(ctx, s.spentKey(key))
	if err != nil {
		return time.Time{}, fmt.Errorf("spent %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return time.Time{}, nil
	}
	m, err := parseSpent(string(resp.Kvs[0].Value))
	if err != nil {
		return time.Time{}, fmt.Errorf("spent %s: %w", key, err)
	}
	return time.Unix(0, m.At), nil
}

// spentMark is the value of learn/<key>/spent: when a window was last seen
// spent, the fleet's answered count then, and the window's length (the
// shortest span between marks kept, 0 when none), in nanoseconds.
type spentMark struct {
	At, Answered, Window int64
}

func (m spentMark) String() string { return fmt.Sprintf("%d %d %d", m.At, m.Answered, m.Window) }

// parseSpent reads a spentMark as String writes it, written by another
// node: three integers, the count and the window not negative.
func parseSpent(v string) (spentMark, error) {
	f := strings.Fields(v)
	if len(f) != 3 {
		return spentMark{}, fmt.Errorf("spent mark %q: want 3 fields", v)
	}
	var m spentMark
	for i, p := range []*int64{&m.At, &m.Answered, &m.Window} {
		x, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return spentMark{}, fmt.Errorf("spent mark %q: %w", v, err)
		}
		*p = x
	}
	if m.Answered < 0 || m.Window < 0 {
		return spentMark{}, fmt.Errorf("spent mark %q: a negative count or window", v)
	}
	return m, nil
}

// minWindow is the shortest span between marks taken as a window's length
// (Spent): two nodes marking one spent window, a second or less apart, may
// read more than MinWindowAdmitted between them from reports a second late.
const minWindow = 2 * time.Second
