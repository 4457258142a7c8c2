package registry_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/registry"
)

func TestLearnFromHeaders(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ceiling   auditd.Source
		limit     int
		window    time.Duration
		wantLimit int
		wantWin   time.Duration
	}{
		{"SetsLimitAndWindow", auditd.Source{}, 100, time.Minute, 100, time.Minute},
		{"LowersTheLimit", auditd.Source{}, 5, time.Minute, 5, time.Minute},
		{"WindowFromHeader", auditd.Source{}, 1000, time.Hour, 1000, time.Hour},
		{"NeverAboveCeiling", auditd.Source{Limit: 60, Window: auditd.Duration(time.Minute)}, 1000, time.Minute, 60, time.Minute},
		{"CeilingScaledToAdvertisedWindow", auditd.Source{Limit: 60, Window: auditd.Duration(time.Minute)}, 10, time.Second, 1, time.Second},
		{"CeilingWhenScaledBelowOne", auditd.Source{Limit: 120, Window: auditd.Duration(time.Hour)}, 10, time.Second, 120, time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, registry.Options{})
			src := tc.ceiling
			src.ID = "a"
			h.put(t, src)
			d := h.observeWith(t, registry.Observation{SourceID: "a", RunID: "r", Outcome: auditd.OutcomeSuccess, Hint: adv(tc.limit, tc.window)})
			if !d.Changed || d.Limit != tc.wantLimit || d.Window != tc.wantWin {
				t.Fatalf("decision = %+v, want changed to %d per %v", d, tc.wantLimit, tc.wantWin)
			}
			evs := h.led.ofType(auditd.EventRegistryChanged)
			if len(evs) != 1 || evs[0].Cause != registry.CauseHeader || evs[0].NewLimit != tc.wantLimit || evs[0].RunID != "r" ||
				!strings.Contains(evs[0].Detail, `"window_from":"advertised"`) {
				t.Fatalf("events = %+v", evs)
			}
			// The same advertisement again changes nothing and writes nothing.
			if d := h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(tc.limit, tc.window)}); d.Changed {
				t.Fatalf("repeated advertisement changed %+v", d)
			}
			if n := len(h.led.ofType(auditd.EventRegistryChanged)); n != 1 {
				t.Fatalf("%d events after a repeated advertisement", n)
			}
		})
	}

	t.Run("WindowLearned", func(t *testing.T) {
		for _, tc := range []struct {
			name    string
			hints   []hints.Hint
			limit   int
			window  time.Duration
			from    string
			inStart bool // still in slow start
		}{
			// A fixed window: the longest Reset, rounded up to a common
			// length, is its length.
			// A Reset that counts down is a window's, whose quota caps the pace.
			{"FromReset", []hints.Hint{withLeft(adv(120, 0), 119, 58*time.Second), withLeft(adv(120, 0), 118, 57*time.Second), withLeft(adv(120, 0), 117, 56*time.Second)}, 120, time.Minute, registry.WindowReset, false},
			// One Reset, or one that does not move, seeds slow start.
			{"FromOneReset", []hints.Hint{withLeft(adv(120, 0), 119, 58*time.Second)}, 120, time.Minute, registry.WindowStatic, true},
			// The demo geocoder: 5 with a bucket of 10; Reset is the time to
			// refill whole. A starting point for slow start, not a pace.
			{"FromABucket", []hints.Hint{withLeft(adv(5, 0), 9, time.Second), withLeft(adv(5, 0), 7, 2*time.Second)}, 5, time.Second, registry.WindowBucket, true},
			// Nothing but a limit: a minute, as an assumption.
			{"Assumed", []hints.Hint{adv(40, 0)}, 40, time.Minute, registry.WindowAssumed, true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				h.put(t, auditd.Source{ID: "a"})
				for _, hint := range tc.hints {
					h.clk.Advance(time.Second)
					h.observeWith(t, registry.Observation{SourceID: "a", Status: 200, Hint: hint})
				}
				s, _ := h.reg.State("a")
				if s.Limit != tc.limit || s.Window != tc.window || s.WindowFrom != tc.from || (s.Phase == registry.PhaseStart) != tc.inStart {
					t.Fatalf("state = %+v, want %d per %v from %s (slow start %v)", s, tc.limit, tc.window, tc.from, tc.inStart)
				}
				// The change the first advertisement made says how its window
				// was known then.
				if evs := h.led.ofType(auditd.EventRegistryChanged); len(evs) == 0 || evs[0].Cause != registry.CauseHeader || !strings.Contains(evs[0].Detail, `"window_from":`) {
					t.Fatalf("events = %+v", evs)
				}
			})
		}
	})

	t.Run("RemainingZeroEndsSlowStart", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for range 3 { // 2 a second
			h.startRound(t, "a")
		}
		d := h.observeWith(t, registry.Observation{SourceID: "a", Status: 200, Hint: left(0, 3*time.Second)})
		if !d.Changed || perSecond(d.Limits) != 1 || d.Pause != 3*time.Second {
			t.Fatalf("decision = %+v, want back to 1 a second and a pause", d)
		}
		if s, _ := h.reg.State("a"); s.Phase != registry.PhaseSteady || s.Cause != registry.CauseHeader {
			t.Fatalf("state = %+v", s)
		}
	})

	t.Run("ThrottleWithHeaderCorrectsAtOnce", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		d := h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeThrottled, Hint: adv(8, time.Minute)})
		// The header sets 8 a minute; the throttle of a request paced at
		// 15 cuts to 90% of 15, which is above 8: 90% of 8.
		if d.Limit != 7 || d.Window != time.Minute {
			t.Fatalf("decision = %+v, want 7 a minute", d)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if len(evs) != 2 || evs[0].Cause != registry.CauseHeader || evs[1].Cause != registry.CauseThrottle {
			t.Fatalf("events = %+v", evs)
		}
	})

	t.Run("AdvertisedQuotaCapsProbing", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(20, time.Minute)})
		h.clk.Advance(time.Minute)
		h.refuse(t, "a") // 20 -> 18
		for range 40 {
			h.round(t, "a", registry.DefaultProbeAfter)
		}
		if l := h.limits(t, "a"); l.Limit != 20 || l.Window != time.Minute {
			t.Fatalf("limits = %+v, want back at the advertised 20 a minute and no higher", l)
		}
	})

	t.Run("RepeatedAdvertisementKeepsACut", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		same := registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(50, time.Minute)}
		h.observeWith(t, same)
		h.refuse(t, "a") // 50 -> 45
		h.clk.Advance(time.Second)
		if d := h.observeWith(t, same); d.Limit != 45 || d.Changed {
			t.Fatalf("decision = %+v: an unchanged advertisement must not undo a throttle", d)
		}
	})

	t.Run("CountdownQuotaIsACap", func(t *testing.T) {
		// 1000 per two minutes, read off a Reset that counts down: the
		// pace is the quota spread over its window, never probed past; a
		// 429 with nothing left waits for the Reset and cuts nothing.
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for i := range 3 {
			h.clk.Advance(time.Second)
			h.observeWith(t, registry.Observation{SourceID: "a", Status: 200,
				Hint: withLeft(adv(1000, 0), 999-i, time.Duration(119-i)*time.Second)})
		}
		want := 1000 / 120.0
		if got := perSecond(h.limits(t, "a")); math.Abs(got-want) > 0.01 {
			t.Fatalf("pace %.3g/s, want the quota over its window, %.3g/s", got, want)
		}
		for range 30 {
			h.round(t, "a", registry.DefaultProbeAfter)
		}
		if got := perSecond(h.limits(t, "a")); got > want+0.01 {
			t.Fatalf("pace %.3g/s after clean rounds, want at most %.3g/s", got, want)
		}
		d := h.observeWith(t, registry.Observation{SourceID: "a", Status: 429, Sent: h.clk.Now(),
			Hint: withLeft(adv(1000, 0), 0, 14*time.Second)})
		if d.Changed || d.Pause != 14*time.Second {
			t.Fatalf("decision = %+v, want no cut and a pause until the Reset", d)
		}
	})

	t.Run("RemainingOnlySlowsDown", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			obs       registry.Observation
			wantPause time.Duration
		}{
			{"ZeroPausesUntilReset", registry.Observation{Hint: left(0, 30*time.Second)}, 30 * time.Second},
			// A refusal with nothing left and no Retry-After waits until the
			// Reset, with the quota known or not.
			{"ZeroOnAThrottle", registry.Observation{Outcome: auditd.OutcomeThrottled, Hint: left(0, 4*time.Second)}, 4 * time.Second},
			{"ZeroOnAThrottleWithKnownQuota", registry.Observation{Status: 429, Outcome: auditd.OutcomeThrottled, Hint: withQuota(left(0, 14*time.Second), 1000, 2*time.Minute)}, 14 * time.Second},
			// A refusal that says nothing of when to come back: two
			// intervals of the new pace, at most five seconds, for the
			// server's bucket to drain a little.
			{"RefusedWithoutHint", registry.Observation{Outcome: auditd.OutcomeThrottled}, 5 * time.Second},
			{"ZeroWithKnownQuotaWaitsOneInterval", registry.Observation{Hint: withQuota(left(0, 10*time.Second), 30, 10*time.Second)}, 10 * time.Second / 30},
			{"ZeroWithoutReset", registry.Observation{Hint: hints.Hint{HasRemaining: true}}, 0},
			{"Left", registry.Observation{Hint: left(100, time.Second)}, 0},
			{"Absent", registry.Observation{Hint: hints.Hint{Reset: time.Second, HasReset: true}}, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				h.put(t, auditd.Source{ID: "a"})
				obs := tc.obs
				obs.SourceID = "a"
				if obs.Outcome == "" {
					obs.Outcome = auditd.OutcomeSuccess
				}
				d := h.observeWith(t, obs)
				if d.Pause != tc.wantPause {
					t.Fatalf("pause = %v, want %v", d.Pause, tc.wantPause)
				}
				if !obs.Hint.HasLimit && d.Limit > 15 {
					t.Fatalf("limit rose to %d on Remaining/Reset", d.Limit)
				}
			})
		}
	})
}

func TestLearnInGroup(t *testing.T) {
	setup := func(t *testing.T) *harness {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Group: "gw", Limit: 120, Window: auditd.Duration(time.Minute)})
		h.put(t, auditd.Source{ID: "b", Group: "gw", Limit: 60, Window: auditd.Duration(time.Minute)})
		h.put(t, auditd.Source{ID: "c"})
		return h
	}

	t.Run("ThrottlesActOnTheGroup", func(t *testing.T) {
		h := setup(t)
		d := h.refuse(t, "a")
		if d.Changed || !d.GroupChanged || d.Limit != 15 || d.GroupLimit != 7 {
			t.Fatalf("throttle: %+v", d)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		last := evs[len(evs)-1]
		if last.Group != "gw" || last.SourceID != "a" || !strings.HasPrefix(last.Detail, `{"scope":"group"`) || last.OldLimit != 15 || last.NewLimit != 7 {
			t.Fatalf("group event = %+v", last)
		}
		h.clk.Advance(2 * time.Minute)
		h.observe(t, auditd.OutcomeSuccess, "b") // the episode ends
		if d := h.refuse(t, "b"); d.Changed || !d.GroupChanged || d.Limit != 15 || d.GroupLimit >= 7 {
			t.Fatalf("another member's throttle: %+v", d)
		}
		if l := h.limits(t, "c"); l.Limit != 15 || l.GroupLimit != 0 {
			t.Fatalf("a source outside the group moved: %+v", l)
		}
	})

	t.Run("MembersProbeTheGroupUpToTheHighestCeiling", func(t *testing.T) {
		h := setup(t)
		// Alternate the two members at the group's pace for many rounds.
		for range 60 {
			l := h.limits(t, "a")
			limit, window := l.Pace()
			gap := window / time.Duration(limit)
			for i := range limit {
				h.clk.Advance(gap)
				h.observe(t, auditd.OutcomeSuccess, []string{"a", "b"}[i%2])
			}
		}
		if l := h.limits(t, "a"); perSecond(registry.Limits{Limit: l.GroupLimit, Window: l.GroupWindow}) != 2 {
			t.Fatalf("group limit = %d per %v, want the highest member ceiling, 2 a second", l.GroupLimit, l.GroupWindow)
		}
	})

	t.Run("AdvertisedQuotaIsShared", func(t *testing.T) {
		h := setup(t)
		d := h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(40, time.Minute)})
		if !d.Changed || !d.GroupChanged || d.Limit != 40 || d.GroupLimit != 40 {
			t.Fatalf("decision = %+v", d)
		}
		if l := h.limits(t, "b"); l.Limit != 15 || l.GroupLimit != 40 {
			t.Fatalf("b = %+v: another member's own limit moved", l)
		}
	})
}

// adv is a hint advertising limit per window (no window when window is 0).
func adv(limit int, window time.Duration) hints.Hint {
	return hints.Hint{Limit: limit, HasLimit: true, Window: window, HasWindow: window > 0}
}

// left is a hint of remaining requests until reset.
func left(remaining int, reset time.Duration) hints.Hint {
	return hints.Hint{Remaining: remaining, HasRemaining: true, Reset: reset, HasReset: true}
}

// withLeft adds Remaining and Reset to h.
func withLeft(h hints.Hint, remaining int, reset time.Duration) hints.Hint {
	h.Remaining, h.HasRemaining, h.Reset, h.HasReset = remaining, true, reset, true
	return h
}

func withQuota(h hints.Hint, limit int, window time.Duration) hints.Hint {
	h.Limit, h.HasLimit, h.Window, h.HasWindow = limit, true, window, true
	return h
}
