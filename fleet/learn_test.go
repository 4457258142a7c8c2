package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

func TestRaiseRule(t *testing.T) {
	perSec := func(n float64) fleet.Rate { return fleet.Rate{Limit: int(n * 10), Window: 10 * time.Second} }
	const period = 2 * time.Second
	now := time.Unix(1e9, 0)
	refused := func(r fleet.Rate, ago time.Duration) fleet.Limit {
		return fleet.Limit{Refused: r, RefusedAt: now.Add(-ago)}
	}
	at := func(l fleet.Limit, r fleet.Rate) fleet.Limit { l.Rate = r; return l }
	for _, c := range []struct {
		name  string
		cur   fleet.Limit
		ceil  fleet.Rate
		d     fleet.Outcomes
		want  fleet.Rate
		raise bool
	}{
		{"used and never refused: half more", at(fleet.Limit{}, perSec(10)), fleet.Rate{}, fleet.Outcomes{OK: 16}, perSec(15), true},
		{"one refusal anywhere keeps it", at(fleet.Limit{}, perSec(10)), fleet.Rate{}, fleet.Outcomes{OK: 20, Refused: 1}, perSec(10), false},
		{"demand below seven tenths keeps it", at(fleet.Limit{}, perSec(10)), fleet.Rate{}, fleet.Outcomes{OK: 13}, perSec(10), false},
		{"never above the told ceiling", at(fleet.Limit{}, perSec(10)), perSec(10), fleet.Outcomes{OK: 20}, perSec(10), false},
		{"capped at the told ceiling", at(fleet.Limit{}, perSec(10)), perSec(12), fleet.Outcomes{OK: 20}, perSec(12), true},
		{"no raise just after a cut", at(refused(perSec(8), 4*time.Second), perSec(6)), fleet.Rate{}, fleet.Outcomes{OK: 12}, perSec(6), false},
		{"after a cut, a quarter more", at(refused(perSec(8), 5*time.Second), perSec(6)), fleet.Rate{}, fleet.Outcomes{OK: 12}, perSec(7.2), true},
		{"to nine tenths of the refused rate", at(refused(perSec(8), 6*time.Second), perSec(7)), fleet.Rate{}, fleet.Outcomes{OK: 14}, perSec(7.2), true},
		{"held there until the probe hold ends", at(refused(perSec(8), 29*time.Second), perSec(7.2)), fleet.Rate{}, fleet.Outcomes{OK: 15}, perSec(7.2), false},
		{"then probed by 3%", at(refused(perSec(8), 30*time.Second), perSec(7.2)), fleet.Rate{}, fleet.Outcomes{OK: 15}, fleet.Rate{Limit: 148, Window: 20 * time.Second}, true},
		{"a window spent at its quota: held there", at(refused(perSec(6), 10*time.Second), perSec(6)), fleet.Rate{}, fleet.Outcomes{OK: 12}, perSec(6), false},
		{"and probed only after the probe hold", at(refused(perSec(6), 30*time.Second), perSec(6)), fleet.Rate{}, fleet.Outcomes{OK: 12}, fleet.Rate{Limit: 123, Window: 20 * time.Second}, true},
		{"a limit that rose: slow start again", at(refused(perSec(6), time.Minute), perSec(7)), fleet.Rate{}, fleet.Outcomes{OK: 14}, perSec(10.5), true},
		{"a window spent within the probe hold: no probe", at(fleet.Limit{Refused: perSec(8), RefusedAt: now.Add(-time.Minute), SpentAt: now.Add(-29 * time.Second)}, perSec(7.2)), fleet.Rate{}, fleet.Outcomes{OK: 15}, perSec(7.2), false},
		{"not answered near the refused rate: no probe", at(refused(perSec(8), 30*time.Second), perSec(7.2)), fleet.Rate{}, fleet.Outcomes{OK: 13}, perSec(7.2), false},
		{"probes past it never sent at the refused rate: held", at(refused(perSec(6), time.Minute), perSec(7)), fleet.Rate{}, fleet.Outcomes{OK: 11}, perSec(7), false},
	} {
		got, raise := fleet.Raise(c.cur, c.ceil, c.d, period, now)
		if ps(got.Rate) != ps(c.want) || raise != c.raise {
			t.Errorf("%s: Raise = %v %v, want %v %v", c.name, got.Rate, raise, c.want, c.raise)
		}
		if c.name == "a limit that rose: slow start again" && (got.Refused != fleet.Rate{}) {
			t.Errorf("%s: the refusal is still remembered: %+v", c.name, got)
		}
	}
	// A probe that reaches the told ceiling is the ceiling itself, counted
	// over its own window, not the probe's longer one (200 per 20 s).
	ceiling := fleet.Rate{Limit: 10, Window: time.Second}
	probing := at(refused(ceiling, time.Minute), fleet.Rate{Limit: 195, Window: 20 * time.Second})
	if got, raise := fleet.Raise(probing, ceiling, fleet.Outcomes{OK: 20}, period, now); got.Rate != ceiling || !raise {
		t.Errorf("a probe reaching the ceiling: Raise = %v %v, want %v true", got.Rate, raise, ceiling)
	}
	for _, c := range []struct{ cur, want fleet.Rate }{
		{fleet.Rate{Limit: 1, Window: time.Second}, fleet.Rate{Limit: 75, Window: 100 * time.Second}},
		{fleet.Rate{Limit: 200, Window: time.Second}, fleet.Rate{Limit: 150, Window: time.Second}},
		{fleet.Rate{Limit: 1, Window: 24 * time.Hour}, fleet.Rate{Limit: 1, Window: 24 * time.Hour}},
	} {
		if got := fleet.CutTo(c.cur); got != c.want {
			t.Errorf("CutTo(%v) = %v, want %v", c.cur, got, c.want)
		}
	}
	for _, c := range []struct{ cur, want fleet.Rate }{
		{fleet.Rate{Limit: 126, Window: 20 * time.Second}, fleet.Rate{Limit: 119, Window: 20 * time.Second}},
		{fleet.Rate{Limit: 6, Window: time.Second}, fleet.Rate{Limit: 96, Window: 17 * time.Second}},
	} {
		if got := fleet.TrimTo(c.cur); got != c.want {
			t.Errorf("TrimTo(%v) = %v, want %v", c.cur, got, c.want)
		}
	}
}

// ps is r per second, to the thousandth.
func ps(r fleet.Rate) float64 {
	return math.Round(1000*r.PerSecond()) / 1000
}

// TestCutLowersOnly has two nodes cut one key's limit: a cut never raises
// it, whoever writes it.
// TestWindowRate: the pace admitted between two spent windows is the
// quota over the window, whole windows counted; too few admitted tell
// nothing.
func TestWindowRate(t *testing.T) {
	for _, c := range []struct {
		admitted int64
		span     time.Duration
		want     fleet.Rate
		ok       bool
	}{
		{30, 5 * time.Second, fleet.Rate{Limit: 30, Window: 5150 * time.Millisecond}, true},
		{60, 10*time.Second + 400*time.Microsecond, fleet.Rate{Limit: 60, Window: 10300 * time.Millisecond}, true},
		{fleet.MinWindowAdmitted - 1, 5 * time.Second, fleet.Rate{}, false},
		{30, 0, fleet.Rate{}, false},
	} {
		got, ok := fleet.WindowRate(c.admitted, c.span)
		if got != c.want || ok != c.ok {
			t.Errorf("WindowRate(%d, %v) = %v %v, want %v %v", c.admitted, c.span, got, ok, c.want, c.ok)
		}
	}
}

func TestCutLowersOnly(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	refused := fleet.Rate{Limit: 100, Window: time.Second}
	l, wrote, err := a.Cut(ctx, "geo", fleet.Rate{Limit: 50, Window: time.Second}, refused, fleet.CauseRefused, "a")
	if err != nil || !wrote || l.Rate.Limit != 50 || l.Revision == 0 {
		t.Fatalf("first cut = %+v %v %v", l, wrote, err)
	}
	if l, wrote, err = b.Cut(ctx, "geo", fleet.Rate{Limit: 80, Window: time.Second}, refused, fleet.CauseRefused, "b"); err != nil || wrote || l.Rate.Limit != 50 {
		t.Fatalf("cut above = %+v %v %v, want 50 kept", l, wrote, err)
	}
	if l, wrote, err = b.Cut(ctx, "geo", fleet.Rate{Limit: 30, Window: time.Second}, refused, fleet.CauseWindowSpent, "b"); err != nil || !wrote || l.By != "b" {
		t.Fatalf("cut below = %+v %v %v", l, wrote, err)
	}
	if got, err := a.Limit(ctx, "geo"); err != nil || got.Rate.Limit != 30 || got.Revision != l.Revision || got.Refused != refused || got.RefusedAt.IsZero() || got.Cause != fleet.CauseWindowSpent || got.By != "b" {
		t.Fatalf("Limit = %+v %v, want 30 at %d, window_spent by b", got, err, l.Revision)
	}
	// A rate over a window past fleet.MaxWindow is lower than any, and
	// would stop the key on every node: no write takes it.
	huge := fleet.Rate{Limit: 100, Window: math.MaxInt64}
	if _, _, err := a.Cut(ctx, "geo", huge, refused, fleet.CauseQuota, "a"); !errors.Is(err, fleet.ErrInvalidRate) {
		t.Fatalf("cut to %v: %v, want ErrInvalidRate", huge, err)
	}
	if _, err := a.Set(ctx, "geo", huge, "a"); !errors.Is(err, fleet.ErrInvalidRate) {
		t.Fatalf("set to %v: %v, want ErrInvalidRate", huge, err)
	}
	if got, err := a.Limit(ctx, "geo"); err != nil || got.Rate.Limit != 30 {
		t.Fatalf("Limit = %+v %v after the refused writes, want 30 kept", got, err)
	}
	// One already stored (an older build let it through) reads as
	// malformed, and an operator's limit is written over it.
	client := etcdtest.NewClient(t, c.Endpoints()...)
	if _, err := client.Put(ctx, fleet.DefaultPrefix+"learn/geo/limit", fmt.Sprintf("100 %d 0 0 0 quota a", int64(math.MaxInt64))); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Limit(ctx, "geo"); err == nil {
		t.Fatal("a window past MaxWindow read as a limit")
	}
	if got, err := b.Set(ctx, "geo", fleet.Rate{Limit: 20, Window: time.Second}, "b"); err != nil || got.Rate.Limit != 20 {
		t.Fatalf("set over a malformed limit = %+v %v, want 20/s", got, err)
	}
}

// TestLearnerFailover has two nodes campaign for one key on a three-member
// cluster: the one elected raises the limit from both nodes' outcomes; when
// it dies (its client closed, its lease left to expire) the other is
// elected and raises from the stored limit.
func TestLearnerFailover(t *testing.T) {
	c := etcdtest.Start(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const period = 2 * time.Second
	start := fleet.Rate{Limit: 10, Window: time.Second}
	type node struct {
		store *fleet.Store
		clk   *clock.Fake
		l     *fleet.Learner
		close func()
	}
	var nodes [2]node
	for i, name := range []string{"a", "b"} {
		cli := etcdtest.NewClient(t, c.Endpoints()[i])
		clk := clock.NewFake(time.Unix(1e9, 0))
		st := fleet.NewStore(cli, clk, "")
		l := fleet.NewLearner(st, clk, fleet.LearnerConfig{Key: "geo", Node: name, Start: start, LeaseTTL: 1, Period: period})
		nodes[i] = node{st, clk, l, func() { cli.Close() }}
		go l.Run(ctx) //nolint:errcheck // Run returns nil when ctx ends
	}
	if l, err := nodes[0].store.Start(ctx, "geo", start, "a"); err != nil || l.Cause != fleet.CauseStart {
		t.Fatalf("start = %+v %v, want the cause start", l, err)
	}
	leader := waitLeader(t, nodes[0].l, nodes[1].l)
	other := 1 - leader
	ok := [2]int64{}
	// step reports both nodes' outcomes and lets the leader decide once.
	step := func(n node, each int64) {
		for i := range nodes {
			ok[i] += each
			if err := nodes[other].store.Report(ctx, "geo", []string{"a", "b"}[i], fleet.Outcomes{OK: ok[i]}); err != nil {
				t.Fatal(err)
			}
		}
		n.clk.WaitForTimers(1)
		n.clk.Advance(period)
		n.clk.WaitForTimers(1) // the next term's timer: the step is done
	}
	step(nodes[leader], 0)  // the first read is the baseline
	step(nodes[leader], 10) // 20 in 2 s at 10/s: the limit held the pace
	got, err := nodes[other].store.Limit(ctx, "geo")
	if err != nil || got.Rate != (fleet.Rate{Limit: 150, Window: 10 * time.Second}) || got.By != []string{"a", "b"}[leader] || got.Cause != fleet.CauseRaise {
		t.Fatalf("after a full period the limit is %+v %v, want 15/s raised by the leader", got, err)
	}
	nodes[leader].close()
	if waitLeader(t, nodes[other].l) != 0 {
		t.Fatal("unreachable")
	}
	next := nodes[other]
	step(next, 0)
	step(next, 15) // 30 in 2 s at 15/s
	if got, err = next.store.Limit(ctx, "geo"); err != nil || got.Rate != (fleet.Rate{Limit: 225, Window: 10 * time.Second}) || got.By != []string{"a", "b"}[other] {
		t.Fatalf("after the failover the limit is %+v %v, want 22.5/s (15 stored, raised) by the new learner", got, err)
	}
	if nodes[leader].l.Leading() {
		t.Fatal("the dead learner still leads")
	}
}

// waitLeader waits until one of ls leads and returns its index. It waits,
// on real time, for etcd's election; it asserts nothing about how long.
func waitLeader(t *testing.T, ls ...*fleet.Learner) int {
	t.Helper()
	for range 1500 {
		for i, l := range ls {
			if l.Leading() {
				return i
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("no learner elected in 15 s")
	return -1
}

// TestSpentMarks: the fleet's marks of a spent window, by any node, count
// the answers every node reported between them, and keep the shortest span
// of 2 s or more as the window's length.
func TestSpentMarks(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	at := time.Unix(1e9, 0)
	report := func(s *fleet.Store, node string, ok int64) {
		if err := s.Report(ctx, "geo", node, fleet.Outcomes{OK: ok}); err != nil {
			t.Fatal(err)
		}
	}
	report(a, "a", 10)
	if _, _, _, seen, err := a.Spent(ctx, "geo", at); err != nil || seen {
		t.Fatalf("first mark: seen %v, %v; want none before", seen, err)
	}
	report(a, "a", 30)
	report(b, "b", 10)
	for _, c := range []struct {
		s         *fleet.Store
		after     time.Duration
		span, win time.Duration
		admitted  int64
	}{
		{b, 10 * time.Second, 10 * time.Second, 0, 30},              // 20 from a, 10 from b
		{a, 15 * time.Second, 5 * time.Second, 10 * time.Second, 0}, // nothing answered since
		{a, 20 * time.Second, 5 * time.Second, 10 * time.Second, 0}, // too few answered: the length kept
	} {
		span, n, win, seen, err := c.s.Spent(ctx, "geo", at.Add(c.after))
		if err != nil || !seen || span != c.span || n != c.admitted || win != c.win {
			t.Errorf("mark at %v: %v %d %v %v %v, want %v %d %v", c.after, span, n, win, seen, err, c.span, c.admitted, c.win)
		}
	}
}

// TestSpentMarksAtOnce: nodes marking one key's window spent at once each
// measure from the mark before theirs: exactly one finds no mark before.
func TestSpentMarksAtOnce(t *testing.T) {
	c := etcdtest.Start(t, 1)
	stores := []*fleet.Store{
		fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, ""),
		fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, ""),
	}
	var wg sync.WaitGroup
	var first atomic.Int32
	for i := range 8 {
		wg.Go(func() {
			_, _, _, seen, err := stores[i%2].Spent(context.Background(), "geo", time.Unix(1e9, int64(i)))
			if err != nil {
				t.Error(err)
			}
			if !seen {
				first.Add(1)
			}
		})
	}
	wg.Wait()
	if n := first.Load(); n != 1 {
		t.Errorf("%d of 8 marks made at once found no mark before, want 1", n)
	}
}

// TestLearnersShareOneSession: the learners of a node's keys campaign on
// one etcd lease, which is replaced when it is lost.
func TestLearnersShareOneSession(t *testing.T) {
	c := etcdtest.Start(t, 1)
	cli := etcdtest.NewClient(t, c.Endpoints()...)
	x := fleet.NewStore(cli, clock.Real{}, "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var xs []*fleet.Learner
	for _, key := range []string{"geo", "parcels", "grants"} {
		xs = append(xs, runLearner(ctx, x, key, "x", 2))
	}
	leading := func() bool {
		for _, l := range xs {
			if !l.Leading() {
				return false
			}
		}
		return true
	}
	waitUntil(t, "x learned all three keys", leading)
	if ls := leases(t, cli); len(ls) != 1 {
		t.Fatalf("one node learning three keys holds %d leases, want 1", len(ls))
	}

	// A lost lease: every key campaigns again, on one new lease.
	lost := leases(t, cli)[0]
	if _, err := cli.Revoke(ctx, lost); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "x learned all three keys on a new lease", func() bool {
		ls := leases(t, cli)
		return len(ls) == 1 && ls[0] != lost && leading()
	})
}

// TestLearnerHandsOverOnRelease: a node that stops (its learners ended,
// Store.Release) hands its keys to another node at once, not a lease's TTL
// (here a minute) later.
func TestLearnerHandsOverOnRelease(t *testing.T) {
	ctx := t.Context()
	l := xLeadsYWaits(t)
	x, ly, cli, stopX := l.x, l.ly, l.cli, l.stopX
	if ly.Leading() {
		t.Fatal("y leads geo while x does")
	}
	stopX()
	if err := x.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "y learned geo after x stopped", ly.Leading)
	if n := len(leases(t, cli)); n != 1 {
		t.Errorf("after x stopped the cluster holds %d leases, want y's 1", n)
	}
}

// TestLearnerOfAKeyRemadeWaitsForTheOld: a node remakes a key's share (its
// ceiling changed) and starts a new learner of the key while the old one
// still leads. They share the node's session, so the new one would be
// elected at once on the old one's election key, and the old one's resign
// would then elect another node too. The new one campaigns only once the
// old one has resigned, behind the node that was waiting.
func TestLearnerOfAKeyRemadeWaitsForTheOld(t *testing.T) {
	l := xLeadsYWaits(t)
	ly, stopOld := l.ly, l.stopX
	newX := runLearner(t.Context(), l.x, "geo", "x", 60)
	time.Sleep(200 * time.Millisecond) // time for the new learner to campaign, were it let
	if newX.Leading() {
		t.Fatal("the new learner of x leads geo beside the old one")
	}
	stopOld()
	waitUntil(t, "y learned geo after x's old learner stopped", ly.Leading)
	if newX.Leading() {
		t.Fatal("x's new learner and y both lead geo")
	}
}

// leadAndWait is two nodes' learners of "geo" on one etcd member, each on
// a lease of a minute: x's elected, y's campaigning behind it.
type leadAndWait struct {
	cli   *clientv3.Client // x's
	x     *fleet.Store
	ly    *fleet.Learner
	stopX context.CancelFunc // ends x's learner
}

func xLeadsYWaits(t *testing.T) leadAndWait {
	t.Helper()
	c := etcdtest.Start(t, 1)
	l := leadAndWait{cli: etcdtest.NewClient(t, c.Endpoints()...)}
	l.x = fleet.NewStore(l.cli, clock.Real{}, "")
	y := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	xctx, stopX := context.WithCancel(t.Context())
	l.stopX = stopX
	lx := runLearner(xctx, l.x, "geo", "x", 60)
	waitUntil(t, "x learned geo", lx.Leading)
	l.ly = runLearner(t.Context(), y, "geo", "y", 60)
	waitUntil(t, "y campaigned", func() bool { return len(leases(t, l.cli)) == 2 })
	return l
}

// runLearner runs key's learner on store as node, with a lease of ttl
// seconds, until ctx ends.
func runLearner(ctx context.Context, store *fleet.Store, key, node string, ttl int) *fleet.Learner {
	l := fleet.NewLearner(store, clock.Real{}, fleet.LearnerConfig{Key: key, Node: node, Start: fleet.Rate{Limit: 10, Window: time.Second}, LeaseTTL: ttl})
	go l.Run(ctx) //nolint:errcheck // Run returns nil when ctx ends
	return l
}

// waitUntil waits up to 10 s for cond.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 1000 {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("never %s", what)
}

// leases lists the cluster's leases.
func leases(t *testing.T, cli *clientv3.Client) []clientv3.LeaseID {
	t.Helper()
	resp, err := cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []clientv3.LeaseID
	for _, l := range resp.Leases {
		ids = append(ids, l.ID)
	}
	return ids
}

// TestWatchLimitOnACompactedStore: a key with no learned limit yet is
// watched from the revision it was read at, not from revision 1, which a
// compacted etcd no longer holds: the first limit written reaches the
// watcher.
func TestWatchLimitOnACompactedStore(t *testing.T) {
	c := etcdtest.Start(t, 1)
	client := etcdtest.NewClient(t, c.Endpoints()...)
	store := fleet.NewStore(client, clock.Real{}, "")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var rev int64
	for i := range 5 {
		resp, err := client.Put(ctx, fmt.Sprintf("other/%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := client.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	ch := make(chan fleet.Limit)
	errc := make(chan error, 1)
	go func() { errc <- store.WatchLimit(ctx, "geo", ch) }()
	if l := <-ch; l.Revision != 0 {
		t.Fatalf("first limit %+v, want none stored", l)
	}
	start := fleet.Rate{Limit: 100, Window: 10 * time.Second}
	if _, err := store.Start(ctx, "geo", start, "n1"); err != nil {
		t.Fatal(err)
	}
	select {
	case l := <-ch:
		if l.Rate != start {
			t.Fatalf("watched %+v, want %v", l, start)
		}
	case err := <-errc:
		t.Fatalf("the watch ended: %v", err)
	case <-ctx.Done():
		t.Fatal("the limit written never reached the watcher")
	}
}
