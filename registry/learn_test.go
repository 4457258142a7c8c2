package registry_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/registry"
)

func TestLearnWithoutHeaders(t *testing.T) {
	t.Run("UnknownSourceStartsConservative", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			opts      registry.Options
			src       auditd.Source
			wantLimit int
			wantWin   time.Duration
		}{
			{"Default", registry.Options{}, auditd.Source{ID: "a"}, 15, time.Minute},
			{"Configured", registry.Options{DefaultLimit: 4, DefaultWindow: 10 * time.Second}, auditd.Source{ID: "a"}, 4, 10 * time.Second},
			{"CeilingBelowDefault", registry.Options{}, auditd.Source{ID: "a", Limit: 5, Window: auditd.Duration(time.Minute)}, 5, time.Minute},
			{"SlowCeiling", registry.Options{}, auditd.Source{ID: "a", Limit: 1, Window: auditd.Duration(10 * time.Minute)}, 1, 10 * time.Minute},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, tc.opts)
				h.put(t, tc.src)
				if l := h.limits(t, "a"); l.Limit != tc.wantLimit || l.Window != tc.wantWin {
					t.Fatalf("limits = %+v, want %d per %v", l, tc.wantLimit, tc.wantWin)
				}
			})
		}
	})

	t.Run("ThrottleDecreasesMultiplicatively", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Group: "gw"})
		var got []int
		for range 4 {
			h.clk.Advance(time.Minute) // past the hold-off of the previous cut
			d := h.observe(t, auditd.OutcomeThrottled, "a")
			if !d.Changed || d.GroupChanged {
				t.Fatalf("decision = %+v, want only the source changed", d)
			}
			got = append(got, d.Limit)
		}
		if want := []int{10, 7, 4, 2}; !equalInts(got, want) {
			t.Fatalf("limits after throttles = %v, want %v", got, want)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if len(evs) != 4 {
			t.Fatalf("%d registry.changed events, want 4", len(evs))
		}
		e := evs[0]
		if e.Cause != registry.CauseThrottle || e.OldLimit != 15 || e.NewLimit != 10 || e.OldWindow != time.Minute ||
			e.NewWindow != time.Minute || e.RunID != "run-1" || e.SourceID != "a" || e.Group != "gw" || e.Detail != `{"scope":"source"}` {
			t.Fatalf("first event = %+v", e)
		}
		if s, _ := h.reg.State("a"); s.Cause != registry.CauseThrottle || s.TaughtRun != "run-1" || !s.TaughtAt.Equal(h.clk.Now()) {
			t.Fatalf("state = %+v", s)
		}
	})

	t.Run("AtOneTheWindowStretches", func(t *testing.T) {
		h := newHarness(t, registry.Options{DefaultLimit: 1})
		h.put(t, auditd.Source{ID: "a"})
		h.observe(t, auditd.OutcomeThrottled, "a")
		h.clk.Advance(3 * time.Minute)
		h.observe(t, auditd.OutcomeThrottled, "a")
		if l := h.limits(t, "a"); l.Limit != 1 || l.Window != 4*time.Minute {
			t.Fatalf("limits = %+v, want 1 per 4m", l)
		}
		// A run needs ProbeAfter successes, so at one per window each halving
		// of the window takes ProbeAfter windows.
		h.paceAtLimit(t, "a", 2*registry.DefaultProbeAfter)
		if l := h.limits(t, "a"); l.Limit != 1 || l.Window != time.Minute {
			t.Fatalf("after probes limits = %+v, want 1 per 1m", l)
		}
	})

	t.Run("ThrottlesPacedAtTheOldLimitCutOnce", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		sent := h.clk.Now()
		h.clk.Advance(time.Second)
		for range 5 { // five requests in flight when the first 429 came back
			h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeThrottled, Sent: sent})
		}
		if l := h.limits(t, "a"); l.Limit != 10 {
			t.Fatalf("limit = %d, want one cut to 10", l.Limit)
		}
		h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeThrottled, Sent: h.clk.Now()})
		if l := h.limits(t, "a"); l.Limit != 7 {
			t.Fatalf("limit = %d, want a second cut to 7 for a request paced at 10", l.Limit)
		}
	})

	t.Run("WithoutSentTheCutIsHeldOffOneInterval", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		h.observe(t, auditd.OutcomeThrottled, "a") // 15 -> 10: one request per 6s
		h.clk.Advance(5 * time.Second)
		h.observe(t, auditd.OutcomeThrottled, "a")
		if l := h.limits(t, "a"); l.Limit != 10 {
			t.Fatalf("limit = %d, want 10 within the hold-off", l.Limit)
		}
		h.clk.Advance(time.Second)
		h.observe(t, auditd.OutcomeThrottled, "a")
		if l := h.limits(t, "a"); l.Limit != 7 {
			t.Fatalf("limit = %d, want 7 after the hold-off", l.Limit)
		}
	})

	t.Run("SustainedSuccessProbesUp", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		var got []int
		for range 5 {
			h.paceAtLimit(t, "a", 1)
			got = append(got, h.limits(t, "a").Limit)
		}
		// Before any refusal the step doubles from 1 while probes stay clean.
		if want := []int{16, 18, 22, 30, 46}; !equalInts(got, want) {
			t.Fatalf("limits after each window = %v, want %v", got, want)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if len(evs) != 5 || evs[0].Cause != registry.CauseProbeUp || evs[0].OldLimit != 15 || evs[0].NewLimit != 16 {
			t.Fatalf("events = %+v", evs)
		}
	})

	t.Run("ProbeRecoversTowardTheRefusedLimit", func(t *testing.T) {
		h := newHarness(t, registry.Options{DefaultLimit: 60})
		h.put(t, auditd.Source{ID: "a"})
		h.observe(t, auditd.OutcomeThrottled, "a") // 60 refused -> 42
		var got []int
		for range 10 {
			h.paceAtLimit(t, "a", 1)
			got = append(got, h.limits(t, "a").Limit)
		}
		// Half the distance to 60 each probe, three windows held just below
		// it, then past it with a doubling step.
		if want := []int{51, 55, 57, 58, 59, 59, 59, 60, 61, 63}; !equalInts(got, want) {
			t.Fatalf("limits after each window = %v, want %v", got, want)
		}
	})

	t.Run("UnderusedLimitIsNotProbed", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		h.succeed(t, "a", 100, 10*time.Second) // 6 a minute against a limit of 15
		if l := h.limits(t, "a"); l.Limit != 15 {
			t.Fatalf("limit = %d, want 15: the limit was never tried", l.Limit)
		}
		if n := len(h.led.ofType(auditd.EventRegistryChanged)); n != 0 {
			t.Fatalf("%d registry.changed events", n)
		}
	})

	t.Run("ProbeNeverPassesTheCeiling", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Limit: 40, Window: auditd.Duration(time.Minute)})
		h.paceAtLimit(t, "a", 20)
		if l := h.limits(t, "a"); l.Limit != 40 {
			t.Fatalf("limit = %d, want the ceiling 40", l.Limit)
		}
		for _, e := range h.led.ofType(auditd.EventRegistryChanged) {
			if e.NewLimit > 40 {
				t.Fatalf("event above the ceiling: %+v", e)
			}
		}
	})

	t.Run("RefusalsAreThrottlesAnd503s", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			obs  registry.Observation
		}{
			{"Throttled", registry.Observation{Outcome: auditd.OutcomeThrottled}},
			{"Status429", registry.Observation{Status: 429}},
			{"Plain503FromNginx", registry.Observation{Status: 503, Outcome: auditd.OutcomeServerError}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				h.put(t, auditd.Source{ID: "a"})
				obs := tc.obs
				obs.SourceID = "a"
				if d := h.observeWith(t, obs); !d.Changed || !d.Retune || d.Limit != 10 {
					t.Fatalf("decision = %+v, want cut to 10", d)
				}
			})
		}
	})

	t.Run("StatusAloneCountsSuccess", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for range 16 {
			h.clk.Advance(4 * time.Second)
			h.observeWith(t, registry.Observation{SourceID: "a", Status: 204})
		}
		if l := h.limits(t, "a"); l.Limit != 16 {
			t.Fatalf("limit = %d, want a probe to 16", l.Limit)
		}
	})

	t.Run("OtherOutcomesTeachNothing", func(t *testing.T) {
		for _, out := range []auditd.Outcome{auditd.OutcomeServerError, auditd.OutcomeClientError, auditd.OutcomeBodyError, ""} {
			t.Run(string(out), func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				h.put(t, auditd.Source{ID: "a"})
				for range 50 {
					h.clk.Advance(time.Second)
					if d := h.observe(t, out, "a"); d.Changed || d.Limit != 15 {
						t.Fatalf("decision = %+v", d)
					}
				}
			})
		}
	})
}

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
		{"NoWindowMeansDefault", auditd.Source{}, 40, 0, 40, time.Minute},
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
			if len(evs) != 1 || evs[0].Cause != registry.CauseHeader || evs[0].NewLimit != tc.wantLimit || evs[0].RunID != "r" {
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

	t.Run("ThrottleWithHeaderCorrectsAtOnce", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		d := h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeThrottled, Hint: adv(8, time.Minute)})
		// The header sets 8; the throttle, for a request paced at 15, cuts 8.
		if d.Limit != 5 {
			t.Fatalf("limit = %d, want 5", d.Limit)
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
		h.observe(t, auditd.OutcomeThrottled, "a") // 20 -> 14
		h.paceAtLimit(t, "a", 10)
		if l := h.limits(t, "a"); l.Limit != 20 {
			t.Fatalf("limit = %d, want back at the advertised 20 and no higher", l.Limit)
		}
	})

	t.Run("RepeatedAdvertisementKeepsACut", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		same := registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(50, time.Minute)}
		h.observeWith(t, same)
		h.observe(t, auditd.OutcomeThrottled, "a") // 50 -> 35
		h.clk.Advance(time.Second)
		if d := h.observeWith(t, same); d.Limit != 35 || d.Changed {
			t.Fatalf("decision = %+v: an unchanged advertisement must not undo a throttle", d)
		}
	})

	t.Run("RemainingOnlySlowsDown", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			obs       registry.Observation
			wantPause time.Duration
		}{
			{"ZeroPausesUntilReset", registry.Observation{Hint: left(0, 30*time.Second)}, 30 * time.Second},
			{"ZeroOnAThrottle", registry.Observation{Outcome: auditd.OutcomeThrottled, Hint: left(0, 5*time.Second)}, 5 * time.Second},
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

	t.Run("CorrelatedThrottlesActOnTheGroup", func(t *testing.T) {
		h := setup(t)
		d := h.observe(t, auditd.OutcomeThrottled, "a")
		if !d.Changed || d.GroupChanged || d.Limit != 10 || d.GroupLimit != 15 {
			t.Fatalf("first throttle: %+v", d)
		}
		h.clk.Advance(20 * time.Second)
		d = h.observe(t, auditd.OutcomeThrottled, "b")
		if d.Changed || !d.GroupChanged || d.Limit != 15 || d.GroupLimit != 10 || d.Group != "gw" {
			t.Fatalf("correlated throttle: %+v", d)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		last := evs[len(evs)-1]
		if last.Group != "gw" || last.SourceID != "b" || last.Detail != `{"scope":"group"}` || last.OldLimit != 15 || last.NewLimit != 10 {
			t.Fatalf("group event = %+v", last)
		}
		if l := h.limits(t, "c"); l.Limit != 15 || l.GroupLimit != 0 {
			t.Fatalf("a source outside the group moved: %+v", l)
		}
	})

	t.Run("UncorrelatedThrottlesActOnTheMember", func(t *testing.T) {
		h := setup(t)
		h.observe(t, auditd.OutcomeThrottled, "a")
		h.clk.Advance(2 * time.Minute)
		d := h.observe(t, auditd.OutcomeThrottled, "b")
		if !d.Changed || d.GroupChanged || d.Limit != 10 || d.GroupLimit != 15 {
			t.Fatalf("second, late throttle: %+v", d)
		}
		h.clk.Advance(2 * time.Minute)
		if d := h.observe(t, auditd.OutcomeThrottled, "b"); d.GroupChanged || d.Limit != 7 {
			t.Fatalf("same member again: %+v", d)
		}
	})

	t.Run("MembersProbeTheGroupUpToTheHighestCeiling", func(t *testing.T) {
		h := setup(t)
		// Alternate the two members at the group's limit for many windows.
		for range 30 {
			l := h.limits(t, "a")
			gap := l.GroupWindow / time.Duration(l.GroupLimit)
			for i := range l.GroupLimit {
				h.clk.Advance(gap)
				h.observe(t, auditd.OutcomeSuccess, []string{"a", "b"}[i%2])
			}
		}
		if l := h.limits(t, "a"); l.GroupLimit != 120 {
			t.Fatalf("group limit = %d, want the highest member ceiling 120", l.GroupLimit)
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

func TestLedgerFailureUndoesTheChange(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "a"})
	h.led.fail = errors.New("ledger closed")
	d, err := h.reg.Observe(context.Background(), registry.Observation{SourceID: "a", Outcome: auditd.OutcomeThrottled})
	if err == nil {
		t.Fatal("observe succeeded though the change could not be recorded")
	}
	if d.Changed || d.Limit != 15 {
		t.Fatalf("decision = %+v", d)
	}
	if l := h.limits(t, "a"); l.Limit != 15 {
		t.Fatalf("limit = %d: an unrecorded change took effect", l.Limit)
	}
	h.led.fail = nil
	if d := h.observe(t, auditd.OutcomeThrottled, "a"); d.Limit != 10 {
		t.Fatalf("after recovery limit = %d, want 10", d.Limit)
	}
}

// adv is a hint advertising limit per window (no window when window is 0).
func adv(limit int, window time.Duration) hints.Hint {
	return hints.Hint{Limit: limit, HasLimit: true, Window: window, HasWindow: window > 0}
}

// left is a hint of remaining requests until reset.
func left(remaining int, reset time.Duration) hints.Hint {
	return hints.Hint{Remaining: remaining, HasRemaining: true, Reset: reset, HasReset: true}
}

func withQuota(h hints.Hint, limit int, window time.Duration) hints.Hint {
	h.Limit, h.HasLimit, h.Window, h.HasWindow = limit, true, window, true
	return h
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPace(t *testing.T) {
	for _, tc := range []struct {
		name       string
		l          registry.Limits
		wantLimit  int
		wantWindow time.Duration
	}{
		{"OwnWithoutGroup", registry.Limits{Limit: 20, Window: time.Minute}, 20, time.Minute},
		{"GroupBelowMembers", registry.Limits{Limit: 20, Window: time.Minute, Group: "g", GroupLimit: 30, GroupWindow: 10 * time.Second, MembersLimit: 40}, 30, 10 * time.Second},
		{"MembersBelowGroup", registry.Limits{Limit: 20, Window: time.Minute, Group: "g", GroupLimit: 30, GroupWindow: 10 * time.Second, MembersLimit: 12}, 12, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if l, w := tc.l.Pace(); l != tc.wantLimit || w != tc.wantWindow {
				t.Fatalf("Pace() = %d per %v, want %d per %v", l, w, tc.wantLimit, tc.wantWindow)
			}
		})
	}
}

func TestGroupMembership(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "a", Group: "gw"})
	h.put(t, auditd.Source{ID: "b", Group: "gw"})
	if l := h.limits(t, "a"); l.MembersLimit != 30 || l.GroupLimit != 15 {
		t.Fatalf("two members: %+v, want members' sum 30 and group 15", l)
	}
	// An isolated throttle cuts the member, and through the sum the pace.
	h.observe(t, auditd.OutcomeThrottled, "a")
	h.observe(t, auditd.OutcomeThrottled, "a") // same member again, within the hold-off: no cut
	if l := h.limits(t, "b"); l.MembersLimit != 25 || l.GroupLimit != 15 {
		t.Fatalf("after a's throttle: %+v, want members' sum 10+15", l)
	}
	h.put(t, auditd.Source{ID: "b"}) // b leaves the group
	if l := h.limits(t, "a"); l.MembersLimit != 10 {
		t.Fatalf("after b left: %+v, want members' sum 10", l)
	}
	if l := h.limits(t, "b"); l.Group != "" || l.GroupLimit != 0 {
		t.Fatalf("b after leaving: %+v", l)
	}
}

// TestConcurrentObserve drives grouped and ungrouped sources from many
// goroutines (run it with -race) and checks that each entry's registry.changed
// events form one unbroken chain: every OldLimit is the NewLimit before it.
func TestConcurrentObserve(t *testing.T) {
	h := newHarness(t, registry.Options{})
	ids := []string{"a", "b", "c"}
	h.put(t, auditd.Source{ID: "a", Group: "gw", Limit: 100, Window: auditd.Duration(time.Minute)})
	h.put(t, auditd.Source{ID: "b", Group: "gw", Limit: 100, Window: auditd.Duration(time.Minute)})
	h.put(t, auditd.Source{ID: "c", Limit: 100, Window: auditd.Duration(time.Minute)})

	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 400 {
				obs := registry.Observation{SourceID: ids[(w+i)%3], Status: 200}
				if i%37 == 0 {
					obs.Status = 429
				}
				if i%50 == 0 {
					obs.Hint = adv(40+i%3, time.Minute)
				}
				if _, err := h.reg.Observe(context.Background(), obs); err != nil {
					t.Error(err)
					return
				}
				h.clk.Advance(50 * time.Millisecond)
			}
		}()
	}
	wg.Wait()

	last := map[string]int{}
	changes := h.led.ofType(auditd.EventRegistryChanged)
	if len(changes) == 0 {
		t.Fatal("no changes: the check below proves nothing")
	}
	for _, e := range changes {
		key := e.SourceID
		if e.Detail == `{"scope":"group"}` {
			key = "group " + e.Group
		}
		if prev, ok := last[key]; ok && prev != e.OldLimit {
			t.Fatalf("%s: change %+v does not continue from %d", key, e, prev)
		}
		if e.NewLimit > 100 {
			t.Fatalf("change above the ceiling: %+v", e)
		}
		last[key] = e.NewLimit
	}
	for key, l := range last {
		if key == "group gw" {
			continue
		}
		if got := h.limits(t, key); got.Limit != l {
			t.Fatalf("%s: limit %d, last event says %d", key, got.Limit, l)
		}
	}
}
