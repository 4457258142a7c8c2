package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/limiter"
)

// TestFleetCutsOnceAnEpisode drives one node's learning of a key against a
// real etcd, on a fake clock for the spans between spent windows
// (docs/FLEET.md, "Fixed windows"). A refusal no hint explains begins an
// episode and marks the window spent; further refusals with no success
// between them, and refusals the server explained (a Retry-After, a spent
// quota), are no episode. The first mark cuts nothing; a mark with fewer
// than fleet.MinWindowAdmitted answered since the last is the same spent
// window; a mark after enough were answered sets the limit to that pace, the
// window's quota, unless it is below a quarter's cut, which then applies to
// a request sent at a settled pace only, remembering as refused the rate of
// which the pace is a quarter's cut; a mark more than one and a half windows
// after the last cuts nothing, unless the limit is a probe past the rate
// last refused, or the mark is two windows after the last at a settled
// limit the fleet was answered at three quarters of: the limit, the rate
// refused, is then trimmed; a span within a tenth of a common window length
// is that length, and within a fifth once a span within a tenth of it was
// seen; a mark is at the refused request's admission. A limit set by hand on the node becomes
// the fleet's, and a quota the server advertises below it holds the fleet
// to it.
func TestFleetCutsOnceAnEpisode(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	var learned []float64 // per second, as the node applied them
	var causes []string
	store, clk, l := learningOnEtcd(t, func(e fleet.Event) {
		mu.Lock()
		defer mu.Unlock()
		if e.Kind == fleet.EventLearned {
			learned = append(learned, ratePerSecond(e.Limit.Rate))
			causes = append(causes, e.Limit.Cause)
		}
	})

	// applied waits until the node applies a limit of want a second and
	// returns when it did.
	applied := func(want float64) time.Time {
		t.Helper()
		for range 500 {
			l.mu.Lock()
			lim, at := l.limit, l.applied
			l.mu.Unlock()
			if ratePerSecond(lim.Rate) == want {
				return at
			}
			time.Sleep(10 * time.Millisecond)
		}
		lim, _ := l.Limit()
		t.Fatalf("the node never applied %g/s; it holds %+v", want, lim)
		return time.Time{}
	}
	stored := func() fleet.Limit {
		t.Helper()
		return storedLimit(t, store, l)
	}
	// answered reports that the fleet had n more requests answered: this
	// node's own (its counts as they stand) and another node's, the rest.
	var total int64
	answered := func(n int64) {
		t.Helper()
		total += n
		own := fleet.Outcomes{OK: l.ok.Load(), Refused: l.refused.Load()}
		if err := store.Report(ctx, "geo", "n1", own); err != nil {
			t.Fatal(err)
		}
		if err := store.Report(ctx, "geo", "n2", fleet.Outcomes{OK: total - own.OK}); err != nil {
			t.Fatal(err)
		}
	}
	refuse := func(admitted time.Time, h hints.Hint) { l.observed(admitted, limiter.ClassThrottled, h) }
	// spent is a plain refusal span after the last, of a request admitted
	// at admitted (now, when zero), which begins an episode: its mark is
	// read spentRead later.
	var last time.Time
	spent := func(span time.Duration, admitted time.Time) {
		t.Helper()
		clk.Set(last.Add(span))
		last = clk.Now()
		if admitted.IsZero() {
			admitted = last
		}
		refuse(admitted, hints.Hint{})
		clk.WaitForTimers(1)
		clk.Advance(spentRead)
	}
	succeed := func() { l.observed(clk.Now(), limiter.ClassSuccess, hints.Hint{}) }
	holds := func(want float64, why string) {
		t.Helper()
		if got := stored(); ratePerSecond(got.Rate) != want {
			t.Fatalf("%s: the fleet's limit is %+v, want %g/s", why, got, want)
		}
	}

	last = applied(10).Add(fleet.Settle + time.Millisecond)
	spent(0, time.Time{})
	holds(10, "the first spent window")
	refuse(clk.Now(), hints.Hint{})
	holds(10, "a second refusal of one episode")

	succeed()
	refuse(clk.Now(), hints.Hint{RetryAfter: time.Second, HasRetryAfter: true})
	refuse(clk.Now(), hints.Hint{Remaining: 0, HasRemaining: true, Reset: time.Second, HasReset: true})
	holds(10, "refusals the server explained")
	answered(5)
	spent(2*time.Second, time.Time{})
	holds(10, "a window spent again with 5 answered since")

	// Windows of 6 s: within a fifth of 5 s, but their spans are never
	// within a tenth of it, so they are not taken for it.
	succeed()
	answered(48)
	spent(6*time.Second, time.Time{})
	perWindow := fleet.Rate{Limit: 48, Window: 6180 * time.Millisecond} // fleet.WindowMargin longer
	if got := stored(); got.Rate != perWindow || got.Refused != perWindow || got.By != "n1" {
		t.Fatalf("after 48 answered between spent windows 6 s apart the fleet holds %+v, want 48 per 6.18 s, refused at it, by n1", got)
	}
	at := applied(7.767)

	succeed()
	answered(20)
	spent(22*time.Second, time.Time{})
	holds(7.767, "spent windows 22 s apart, three windows of 6 s between them unspent")

	succeed()
	answered(30)
	spent(6*time.Second, at.Add(time.Second)) // 4.85/s, sent before the 7.77/s settled
	holds(7.767, "a pace below a quarter's cut, sent before the limit settled")

	succeed()
	answered(30)
	spent(6*time.Second, time.Time{})
	if got := stored(); ratePerSecond(got.Rate) != 5.825 || got.Refused != (fleet.Rate{Limit: 30, Window: 4635 * time.Millisecond}) {
		t.Fatalf("a settled pace below a quarter's cut left %+v, want a quarter's cut to 5.825/s, refused at 30 per 4.635 s (the pace, 30 per 6.18 s, is its quarter's cut)", got)
	}
	applied(5.825)

	// An operator's limit, set on this node, is the fleet's: written
	// whatever it was, the refusal forgotten.
	l.setByHand(fleet.Rate{Limit: 9, Window: time.Second})
	applied(9)
	if got := stored(); got.Refused != (fleet.Rate{}) || got.By != "n1" {
		t.Errorf("after the operator's limit the fleet holds %+v, want 9/s by n1 and no refusal", got)
	}
	// A quota the server advertises holds the fleet to it; one above the
	// limit in force changes nothing.
	quota := func(n int) hints.Hint {
		return hints.Hint{Limit: n, HasLimit: true, Window: time.Minute, HasWindow: true}
	}
	l.observed(clk.Now(), limiter.ClassSuccess, quota(1200)) // 20/s
	holds(9, "a quota above the limit")
	// Nor does a quota over more than a day, or over a window that
	// saturated parsing (X-RateLimit-Window: 10^20): cut to, it would
	// push the key's arrival time out of reach, or overflow its slots.
	for _, w := range []time.Duration{48 * time.Hour, math.MaxInt64} {
		l.observed(clk.Now(), limiter.ClassSuccess, hints.Hint{Limit: 100, HasLimit: true, Window: w, HasWindow: true})
		holds(9, fmt.Sprintf("a quota of 100 per %v", w))
	}
	l.observed(clk.Now(), limiter.ClassSuccess, quota(300)) // 5/s
	if got := stored(); ratePerSecond(got.Rate) != 5 || got.Refused != (fleet.Rate{Limit: 300, Window: time.Minute}) {
		t.Fatalf("an advertised 5/s left the fleet at %+v", got)
	}
	applied(5)
	if ok, refused := l.ok.Load(), l.refused.Load(); ok != 9 || refused != 9 {
		t.Errorf("counted %d answers and %d refusals, want 9 and 9", ok, refused)
	}

	// A span within a fifth of a common window length is that length
	// once a span within a tenth of it was seen: the windows were spent
	// at different points of them, and on a loaded machine later each
	// window (5.8 s apart for windows of 5 s in CI).
	succeed()
	answered(26)
	spent(5*time.Second, time.Time{})
	holds(5, "26 per 5.15 s, above the limit") // a cut never raises
	succeed()
	answered(25)
	spent(5900*time.Millisecond, time.Time{})
	if got := stored(); got.Rate != (fleet.Rate{Limit: 25, Window: 5150 * time.Millisecond}) || got.Cause != fleet.CauseWindowSpent {
		t.Fatalf("after 25 answered between spent windows 5.9 s apart the fleet holds %+v, want 25 per 5.15 s (a window of 5 s, fleet.WindowMargin longer)", got)
	}
	applied(4.854)

	// A probe past the rate last refused that meets a spent window
	// windows after the last (those between unspent for the last
	// refusal's pause, or the probe's climb) is trimmed under the probe's
	// pace, now the rate refused: not back to the rate refused before,
	// which may be a count read short. Three windows after the last, no
	// settled limit's trim applies.
	l.setByHand(fleet.Rate{Limit: 9, Window: time.Second})
	applied(9)
	if _, _, err := store.Cut(ctx, "geo", fleet.Rate{Limit: 8, Window: time.Second}, fleet.Rate{Limit: 7, Window: time.Second}, fleet.CauseRaise, "n2"); err != nil {
		t.Fatal(err)
	}
	applied(8) // as a probe leaves it: 8/s, 7/s refused
	succeed()
	answered(60)
	spent(16*time.Second, time.Time{})
	if got := stored(); got.Rate != (fleet.Rate{Limit: 98, Window: 13 * time.Second}) || got.Refused != (fleet.Rate{Limit: 8, Window: time.Second}) || got.Cause != fleet.CauseWindowSpent {
		t.Fatalf("a probe at 8/s, 7/s refused, meeting a window spent three windows after the last left %+v, want 98 per 13 s (7.54/s), refused at 8/s", got)
	}
	applied(7.538)

	// A refusal seen late, its request admitted half a second before,
	// marks the window at its admission: its lateness moves neither the
	// span nor the count's read.
	succeed()
	answered(42)
	clk.Set(last.Add(7500 * time.Millisecond))
	refuse(last.Add(7*time.Second), hints.Hint{})
	clk.WaitForTimers(1)
	clk.Advance(spentRead)
	if got := stored(); got.Rate != (fleet.Rate{Limit: 42, Window: 7210 * time.Millisecond}) || got.Cause != fleet.CauseWindowSpent {
		t.Fatalf("42 answered between a mark and a refusal seen 0.5 s late of a request admitted 7 s after it: the fleet holds %+v, want 42 per 7.21 s", got)
	}
	applied(5.825)

	// A window spent every other window at a settled limit, the fleet
	// answered at three quarters of it or more, is a limit just past the
	// quota: each refusal's pause leaves the window after it unspent. The
	// limit is the rate refused, and it is trimmed.
	last = last.Add(7 * time.Second) // the late refusal's mark
	succeed()
	answered(56) // 0.75 * 5.825/s * 12 s is 52.4
	spent(12*time.Second, time.Time{})
	if got := stored(); got.Rate != (fleet.Rate{Limit: 119, Window: 21630 * time.Millisecond}) || got.Refused != (fleet.Rate{Limit: 42, Window: 7210 * time.Millisecond}) || got.Cause != fleet.CauseWindowSpent {
		t.Fatalf("a window spent 12 s after the last (windows of 5 s seen) at a settled 42 per 7.21 s left %+v, want it trimmed to 119 per 21.63 s, refused at 42 per 7.21 s", got)
	}
	trimmed := applied(5.502)
	// Not so before the limit settled, nor when the fleet was answered at
	// less than three quarters of it: the demand left windows unspent.
	succeed()
	answered(50)
	spent(10*time.Second, trimmed.Add(time.Second))
	holds(5.502, "a window spent two windows after the last, sent before the trim settled")
	succeed()
	answered(30) // 0.75 * 5.502/s * 10 s is 41.3
	spent(10*time.Second, time.Time{})
	holds(5.502, "a window spent two windows after the last, the fleet answered at 3/s of 5.5")

	mu.Lock()
	defer mu.Unlock()
	if want := []float64{10, 7.767, 5.825, 9, 5, 4.854, 9, 8, 7.538, 5.825, 5.502}; !slices.Equal(learned, want) {
		t.Errorf("fleet.learned events at %v a second, want %v", learned, want)
	}
	if want := []string{fleet.CauseStart, fleet.CauseWindowSpent, fleet.CauseRefused, fleet.CauseOperator, fleet.CauseQuota, fleet.CauseWindowSpent, fleet.CauseOperator, fleet.CauseRaise, fleet.CauseWindowSpent, fleet.CauseWindowSpent, fleet.CauseWindowSpent}; !slices.Equal(causes, want) {
		t.Errorf("fleet.learned events for %q, want %q", causes, want)
	}
}

// TestFleetRefusalMeetingACutInFlight: a refusal that comes while another
// cut is on its way (a quota's, or the last episode's mark) is not lost
// with that cut: it begins no episode, so the next refusal begins one and
// marks the window spent.
func TestFleetRefusalMeetingACutInFlight(t *testing.T) {
	ctx := context.Background()
	store, clk, l := learningOnEtcd(t, func(fleet.Event) {})
	for range 500 {
		if lim, _ := l.Limit(); lim.Revision != 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.cutting.Store(true) // a cut on its way
	l.observed(clk.Now(), limiter.ClassThrottled, hints.Hint{})
	l.cutting.Store(false)
	l.observed(clk.Now(), limiter.ClassThrottled, hints.Hint{})
	if !l.cutting.Load() {
		t.Fatal("the refusal after a cut in flight began no episode")
	}
	clk.WaitForTimers(1) // the mark, read spentRead after the refusal
	clk.Advance(spentRead)
	for l.cutting.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	if _, _, _, marked, err := store.Spent(ctx, "geo", clk.Now()); err != nil || !marked {
		t.Fatalf("the refusal after a cut in flight marked no spent window (%v)", err)
	}
}

// TestFleetRefusalAtAnAdvertisedQuota: a plain refusal whose response
// advertises the quota the fleet is held to is the quota's edge, not a
// window spent: it marks nothing and cuts nothing while such refusals are
// at most 2% of the node's answers since the last cut; past that share the
// server does not keep the quota it advertises, and the limit is cut by a
// quarter, remembering the rate in force as refused. Refusals with a
// Retry-After, and answers to requests sent before the limit in force
// settled, count toward neither. A refusal advertising a quota far above
// the fleet's limit is no refusal at the quota: it marks a window spent.
func TestFleetRefusalAtAnAdvertisedQuota(t *testing.T) {
	ctx := context.Background()
	store, clk, l := learningOnEtcd(t, func(fleet.Event) {})
	quota := hints.Hint{Limit: 16, HasLimit: true, Window: 2 * time.Second, HasWindow: true}
	told := fleet.Rate{Limit: 16, Window: 2 * time.Second}
	for range 500 {
		if lim, _ := l.Limit(); lim.Revision != 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	l.observed(clk.Now(), limiter.ClassSuccess, quota)
	// applied waits until the node applies want with no cut on its way,
	// and returns when it applied it.
	applied := func(want fleet.Rate) time.Time {
		t.Helper()
		for range 500 {
			l.mu.Lock()
			lim, at := l.limit, l.applied
			l.mu.Unlock()
			if lim.Rate == want && !l.cutting.Load() {
				return at
			}
			time.Sleep(10 * time.Millisecond)
		}
		lim, _ := l.Limit()
		t.Fatalf("the node holds %+v, want %v", lim, want)
		return time.Time{}
	}
	holds := func(want fleet.Rate, why string) {
		t.Helper()
		for i := 0; l.cutting.Load(); i++ {
			if i == 500 {
				t.Fatalf("%s: a cut is still on its way (a window's mark waits on the fake clock)", why)
			}
			time.Sleep(5 * time.Millisecond)
		}
		if lim, err := store.Limit(ctx, "geo"); err != nil || lim.Rate != want {
			t.Fatalf("%s: the fleet holds %+v (%v), want %v", why, lim, err, want)
		}
	}
	at := applied(told)
	settled := at.Add(fleet.Settle + time.Millisecond)
	clk.Set(settled)

	// Two refusals in 100 answers, and refusals the server explained or
	// that were sent before the limit settled: the quota's edge.
	retry := quota
	retry.RetryAfter, retry.HasRetryAfter = time.Second, true
	for i := range 100 {
		c := limiter.ClassSuccess
		if i == 30 || i == 70 {
			c = limiter.ClassThrottled
			l.observed(settled, limiter.ClassThrottled, retry)
			l.observed(at, limiter.ClassThrottled, quota)
		}
		l.observed(settled, c, quota)
	}
	holds(told, "two refusals at the advertised quota in 100 answers")
	if _, _, _, marked, err := store.Spent(ctx, "geo", clk.Now()); err != nil || marked {
		t.Fatalf("a refusal at the advertised quota marked a window spent (%v, %v)", marked, err)
	}

	// A third: more than 2% refused.
	l.observed(settled, limiter.ClassThrottled, quota)
	want := fleet.CutTo(told)
	at = applied(want)
	lim, err := store.Limit(ctx, "geo")
	if err != nil || lim.Refused != told || lim.Cause != fleet.CauseRefused || lim.By != "n1" {
		t.Fatalf("3 refusals in 101 answers at the advertised quota left %+v (%v), want %v, %v refused, cause %s, by n1", lim, err, want, told, fleet.CauseRefused)
	}
	l.mu.Lock()
	if l.atQuota != (quotaShare{}) {
		t.Errorf("the cut left %+v counted toward the next share, want nothing", l.atQuota)
	}
	l.mu.Unlock()

	// Refusals of requests sent before the cut settled count for nothing,
	// whatever their share.
	l.observed(clk.Now(), limiter.ClassSuccess, quota)
	l.mu.Lock()
	l.limit.Rate = fleet.Rate{Limit: 15, Window: 2 * time.Second} // as the learner regains it: 0.94 of the quota
	l.mu.Unlock()
	for range 5 {
		l.observed(at, limiter.ClassThrottled, quota)
		l.observed(at, limiter.ClassSuccess, quota)
	}
	holds(want, "refusals of requests sent before the cut settled")

	// A refusal advertising a quota four times the limit in force is not
	// at the quota: it marks the window spent.
	clk.Set(at.Add(fleet.Settle + time.Millisecond))
	l.observed(clk.Now(), limiter.ClassThrottled, hints.Hint{Limit: 64, HasLimit: true, Window: 2 * time.Second, HasWindow: true})
	clk.WaitForTimers(1)
	clk.Advance(spentRead)
	holds(want, "the first spent window")
	if _, _, _, marked, err := store.Spent(ctx, "geo", clk.Now()); err != nil || !marked {
		t.Fatalf("a refusal advertising a quota far above the limit marked no window spent (%v, %v)", marked, err)
	}
}

// learningOnEtcd starts node n1's learning of key "geo" against a real
// etcd member, on a fake clock, its events told to notify: the fleet's
// limit stored at 10/s (100 per 10 s, by another node), the ceiling 20/s.
func learningOnEtcd(t *testing.T, notify func(fleet.Event)) (*fleet.Store, *clock.Fake, *fleetLearning) {
	t.Helper()
	cluster := etcdtest.Start(t, 1)
	store := fleet.NewStore(etcdtest.NewClient(t, cluster.Endpoints()...), clock.Real{}, "")
	start, ceiling := fleet.Rate{Limit: 100, Window: 10 * time.Second}, fleet.Rate{Limit: 20, Window: time.Second}
	if _, err := store.Start(context.Background(), "geo", start, "other"); err != nil {
		t.Fatal(err)
	}
	slots, err := fleet.NewSlots(store, clock.Real{}, fleet.Config{Key: "geo", Rate: ceiling})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewFake(time.Now())
	l := startLearning(store, slots, clk, "geo", "n1", start, ceiling, notify)
	t.Cleanup(func() { l.stop(context.Background()) })
	return store, clk, l
}

// storedLimit returns the fleet's learned limit of l's key, "geo", once no
// cut of l's is on its way.
func storedLimit(t *testing.T, store *fleet.Store, l *fleetLearning) fleet.Limit {
	t.Helper()
	for l.cutting.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	lim, err := store.Limit(context.Background(), "geo")
	if err != nil {
		t.Fatal(err)
	}
	return lim
}

// ratePerSecond is r a second, to the thousandth.
func ratePerSecond(r fleet.Rate) float64 {
	return math.Round(1000*r.PerSecond()) / 1000
}

// TestFleetLearnedRecordsItsCause: a fleet.learned record carries what
// changed the limit as the event's cause, beside the limit in its Detail.
func TestFleetLearnedRecordsItsCause(t *testing.T) {
	n := &fleetNode{node: "n1"}
	lim := fleet.Limit{Key: "geo", Rate: fleet.Rate{Limit: 30, Window: 5 * time.Second}, By: "n2", Cause: fleet.CauseWindowSpent, Revision: 12}
	ev := n.event(fleet.Event{Kind: fleet.EventLearned, Key: "geo", At: time.Now(), Limit: lim})
	if err := ev.CheckShared(); err != nil {
		t.Fatal(err)
	}
	if _, cause := ev.Shared(); ev.Type != auditd.EventFleetLearned || cause != fleet.CauseWindowSpent || ev.SourceID != "geo" {
		t.Fatalf("recorded %s for %q with the cause %q, want fleet.learned for geo, window_spent", ev.Type, ev.SourceID, cause)
	}
	var d fleetDetail
	if err := json.Unmarshal([]byte(ev.Detail), &d); err != nil || d.Limit != 30 || d.Window != "5s" || d.By != "n2" || d.Revision != 12 || d.Node != "n1" {
		t.Fatalf("Detail %s (%v)", ev.Detail, err)
	}
}
