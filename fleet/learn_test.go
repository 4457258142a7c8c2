package fleet_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

func TestRaiseRule(t *testing.T) {
	perSec := func(n int) fleet.Rate { return fleet.Rate{Limit: n, Window: time.Second} }
	period := 2 * time.Second
	for _, c := range []struct {
		name      string
		cur, ceil fleet.Rate
		d         fleet.Outcomes
		want      fleet.Rate
		raise     bool
	}{
		{"used and never refused: a tenth more", perSec(10), fleet.Rate{}, fleet.Outcomes{OK: 20}, perSec(11), true},
		{"a small limit still grows by one", perSec(3), fleet.Rate{}, fleet.Outcomes{OK: 6}, perSec(4), true},
		{"one refusal anywhere keeps it", perSec(10), fleet.Rate{}, fleet.Outcomes{OK: 20, Refused: 1}, perSec(10), false},
		{"demand below the limit keeps it", perSec(10), fleet.Rate{}, fleet.Outcomes{OK: 15}, perSec(10), false},
		{"never above the told ceiling", perSec(10), perSec(10), fleet.Outcomes{OK: 20}, perSec(10), false},
		{"capped at the told ceiling", perSec(10), fleet.Rate{Limit: 21, Window: 2 * time.Second}, fleet.Outcomes{OK: 20}, fleet.Rate{Limit: 21, Window: 2 * time.Second}, true},
	} {
		got, raise := fleet.Raise(c.cur, c.ceil, c.d, period)
		if got != c.want || raise != c.raise {
			t.Errorf("%s: Raise = %v %v, want %v %v", c.name, got, raise, c.want, c.raise)
		}
	}
	if got := fleet.CutTo(fleet.Rate{Limit: 1, Window: time.Second}); got.Limit != 1 {
		t.Errorf("CutTo(1/s) = %v, want at least 1", got)
	}
	if got := fleet.CutTo(fleet.Rate{Limit: 20, Window: time.Second}); got.Limit != 15 {
		t.Errorf("CutTo(20/s) = %v, want 15/s", got)
	}
}

// TestCutLowersOnly has two nodes cut one key's limit: a cut never raises
// it, whoever writes it.
func TestCutLowersOnly(t *testing.T) {
	c := etcdtest.Start(t, 1)
	a := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	b := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()...), clock.Real{}, "")
	ctx := context.Background()
	l, wrote, err := a.Cut(ctx, "geo", fleet.Rate{Limit: 50, Window: time.Second}, "a")
	if err != nil || !wrote || l.Rate.Limit != 50 || l.Revision == 0 {
		t.Fatalf("first cut = %+v %v %v", l, wrote, err)
	}
	if l, wrote, err = b.Cut(ctx, "geo", fleet.Rate{Limit: 80, Window: time.Second}, "b"); err != nil || wrote || l.Rate.Limit != 50 {
		t.Fatalf("cut above = %+v %v %v, want 50 kept", l, wrote, err)
	}
	if l, wrote, err = b.Cut(ctx, "geo", fleet.Rate{Limit: 30, Window: time.Second}, "b"); err != nil || !wrote || l.By != "b" {
		t.Fatalf("cut below = %+v %v %v", l, wrote, err)
	}
	if got, err := a.Limit(ctx, "geo"); err != nil || got.Rate.Limit != 30 || got.Revision != l.Revision {
		t.Fatalf("Limit = %+v %v, want 30 at %d", got, err, l.Revision)
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
	if _, _, err := nodes[0].store.Cut(ctx, "geo", start, "a"); err != nil {
		t.Fatal(err)
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
	if err != nil || got.Rate.Limit != 11 || got.By != []string{"a", "b"}[leader] {
		t.Fatalf("after a full period the limit is %+v %v, want 11/s by the leader", got, err)
	}
	nodes[leader].close()
	if waitLeader(t, nodes[other].l) != 0 {
		t.Fatal("unreachable")
	}
	next := nodes[other]
	step(next, 0)
	step(next, 12) // 24 in 2 s at 11/s
	if got, err = next.store.Limit(ctx, "geo"); err != nil || got.Rate.Limit != 12 || got.By != []string{"a", "b"}[other] {
		t.Fatalf("after the failover the limit is %+v %v, want 12/s (11 stored, raised) by the new learner", got, err)
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
