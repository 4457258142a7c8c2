package registry_test

import (
	"context"
	"errors"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/registry"
)

// perSecond is a limit per window in requests per second.
func perSecond(l registry.Limits) float64 { return float64(l.Limit) / l.Window.Seconds() }

// round sends a round of source id at its current pace: n successes, or as
// many as two seconds hold, if more.
func (h *harness) round(tb testing.TB, id string, n int) {
	tb.Helper()
	l := h.limits(tb, id)
	iv := l.Window / time.Duration(l.Limit)
	// A round lasts two seconds at least, however many successes that is.
	h.succeed(tb, id, max(n, int(math.Ceil(float64(2*time.Second)/float64(iv)))), iv)
}

// startRound sends source id a round of slow start: DefaultStartRound
// successes at its pace, or as many as a second holds, if more.
func (h *harness) startRound(tb testing.TB, id string) {
	tb.Helper()
	l := h.limits(tb, id)
	iv := l.Window / time.Duration(l.Limit)
	h.succeed(tb, id, max(registry.DefaultStartRound, int(math.Ceil(float64(time.Second)/float64(iv)))), iv)
}

// refuse observes a 429 of source id for a request sent now.
func (h *harness) refuse(tb testing.TB, id string) registry.Decision {
	tb.Helper()
	return h.observeWith(tb, registry.Observation{SourceID: id, RunID: "run-1", Status: 429, Sent: h.clk.Now()})
}

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
				if s, _ := h.reg.State("a"); s.Phase != registry.PhaseStart {
					t.Fatalf("phase = %q, want slow start", s.Phase)
				}
			})
		}
	})

	t.Run("SlowStartDoublesEachCleanRound", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Limit: 6000, Window: auditd.Duration(time.Minute)})
		var got []float64
		for range 6 {
			h.startRound(t, "a")
			got = append(got, perSecond(h.limits(t, "a")))
		}
		// From 15 a minute, doubling every two successes, or every second
		// once a second holds more: 8+4+2+1+1+1 = 17 seconds to reach 16 a
		// second.
		if want := []float64{0.5, 1, 2, 4, 8, 16}; !equalFloats(got, want) {
			t.Fatalf("pace after each round = %v per second, want %v", got, want)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if len(evs) != 6 || evs[0].Cause != registry.CauseSlowStart || evs[0].OldLimit != 15 || evs[0].NewLimit != 30 {
			t.Fatalf("events = %+v", evs)
		}
		// Short windows (about 20 requests each) keep steps fine and the
		// limiter's strict window short.
		if l := h.limits(t, "a"); l.Window > 2*time.Second || l.Limit < 20 {
			t.Fatalf("16 a second is expressed as %d per %v", l.Limit, l.Window)
		}
		if h.clk.Now().Sub(epoch) > 17*time.Second {
			t.Fatalf("slow start took %v", h.clk.Now().Sub(epoch))
		}
	})

	t.Run("FirstRefusalEndsSlowStartAtTheLastCleanPace", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for range 3 { // 0.5, 1, 2 a second
			h.startRound(t, "a")
		}
		d := h.refuse(t, "a")
		if !d.Changed || perSecond(d.Limits) != 1 {
			t.Fatalf("decision = %+v, want back to 1 a second", d)
		}
		s, _ := h.reg.State("a")
		if s.Phase != registry.PhaseSteady || s.Cause != registry.CauseThrottle {
			t.Fatalf("state = %+v", s)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		last := evs[len(evs)-1]
		if last.Detail != `{"scope":"source","phase":"steady","status":429,"refused_per_second":2}` {
			t.Fatalf("event detail = %s", last.Detail)
		}
	})

	t.Run("RefusalsOfTheOldPaceCutOnce", func(t *testing.T) {
		h := newHarness(t, registry.Options{DefaultLimit: 60})
		h.put(t, auditd.Source{ID: "a"})
		sent := h.clk.Now()
		h.clk.Advance(100 * time.Millisecond)
		for range 4 { // four requests in flight when the first 429 came back
			h.observeWith(t, registry.Observation{SourceID: "a", Status: 429, Sent: sent})
		}
		if l := h.limits(t, "a"); l.Limit != 30 || l.Window != time.Minute {
			t.Fatalf("limits = %+v, want one cut to 30 a minute", l)
		}
		// Sent just after the cut, at a server still full of the faster
		// pace: no cut either.
		h.observeWith(t, registry.Observation{SourceID: "a", Status: 429, Sent: h.clk.Now()})
		if l := h.limits(t, "a"); l.Limit != 30 {
			t.Fatalf("limit = %d, want no cut within the settling time", l.Limit)
		}
	})

	t.Run("RefusedAgainBeforeAProvenRoundHalves", func(t *testing.T) {
		h := newHarness(t, registry.Options{DefaultLimit: 60})
		h.put(t, auditd.Source{ID: "a"})
		h.refuse(t, "a") // slow start ends: 60 -> 30 a minute
		h.succeed(t, "a", 1, 2*time.Second)
		h.clk.Advance(3 * time.Second)
		if d := h.refuse(t, "a"); d.Limit != 15 || d.Window != time.Minute {
			t.Fatalf("decision = %+v, want halved to 15 a minute", d)
		}
	})

	t.Run("ACapThatBlocksAProbeIsNoProbe", func(t *testing.T) {
		// At the ceiling, each hold ends in a probe the cap blocks. A
		// refusal then is not a refused probe: the hold stays ProbeHold
		// rounds, and the pace is back at the ceiling as soon as the
		// recovery and one hold allow.
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Limit: 120, Window: auditd.Duration(time.Minute)})
		if _, err := h.reg.SetLimit(context.Background(), "op", "a", 120, time.Minute); err != nil {
			t.Fatal(err)
		}
		for range 2*registry.DefaultProbeHold + 2 {
			h.round(t, "a", registry.DefaultProbeAfter)
		}
		h.refuse(t, "a")
		rounds := 0
		for ; perSecond(h.limits(t, "a")) < 2 && rounds < 100; rounds++ {
			h.round(t, "a", registry.DefaultProbeAfter)
		}
		// Cut to 1.8 a second, just under the refused 2: held for
		// ProbeHold rounds, then the probe, which the ceiling bounds.
		if want := registry.DefaultProbeHold; rounds != want {
			t.Fatalf("back at the ceiling after %d rounds, want %d", rounds, want)
		}
	})

	t.Run("RefusalsWithoutASuccessAreOneEpisode", func(t *testing.T) {
		// A spent window refuses every request until it resets: the
		// first refusal cuts, the others neither cut, nor lower the rate
		// last refused, nor double the probe hold; the pause grows.
		h := newHarness(t, registry.Options{DefaultLimit: 60})
		h.put(t, auditd.Source{ID: "a"})
		first := h.refuse(t, "a") // slow start ends: 60 -> 30 a minute
		before, _ := h.reg.State("a")
		pause := first.Pause
		for range 12 {
			h.clk.Advance(pause)
			d := h.refuse(t, "a")
			if d.Changed || d.Limit != 30 {
				t.Fatalf("a refusal within the episode moved the pace: %+v", d)
			}
			if d.Pause < pause {
				t.Fatalf("pause %v after %v, want it never to shrink", d.Pause, pause)
			}
			pause = d.Pause
		}
		if pause <= first.Pause {
			t.Fatalf("pause %v after a long episode, want longer than the first, %v", pause, first.Pause)
		}
		if s, _ := h.reg.State("a"); s.ThrottledAt != before.ThrottledAt {
			t.Fatalf("refused rate %d per %v, want %d as after the first refusal", s.ThrottledAt, s.Window, before.ThrottledAt)
		}
		if n := len(h.led.ofType(auditd.EventRegistryChanged)); n != 1 {
			t.Fatalf("%d registry.changed events, want the one cut", n)
		}
	})

	t.Run("RecoversHoldsThenProbes", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Limit: 6000, Window: auditd.Duration(time.Minute)})
		for range 6 { // 16 a second
			h.startRound(t, "a")
		}
		h.refuse(t, "a") // 8 a second; 16 refused
		var got []float64
		for range 8 {
			h.round(t, "a", registry.DefaultProbeAfter)
			got = append(got, perSecond(h.limits(t, "a")))
		}
		// Half the way back to 16 (a second) each round, up to 5% below
		// it (15.2, 15 in whole requests per window): held there for
		// ProbeHold rounds; then a probe 5% past it (16.8, 16.5 in whole
		// requests per window), which must hold for ProbeHold rounds and
		// ten seconds.
		if want := []float64{12, 14, 15, 15, 15, 16.5, 16.5, 16.5}; !equalFloats(got, want) {
			t.Fatalf("pace after each round = %v, want %v", got, want)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if c := evs[len(evs)-1].Cause; c != registry.CauseProbeUp {
			t.Fatalf("last cause = %q, want a probe", c)
		}
		// The probe is refused: the next one waits twice as long.
		h.clk.Advance(time.Second)
		h.refuse(t, "a")
		held := 0
		for range 20 {
			before := perSecond(h.limits(t, "a"))
			h.round(t, "a", registry.DefaultProbeAfter)
			if after := perSecond(h.limits(t, "a")); after == before {
				held++
			} else if after > 16.5 {
				break
			}
		}
		// Twice ProbeHold rounds at the top, the last of which probes.
		if held < 2*registry.DefaultProbeHold-1 {
			t.Fatalf("held %d rounds before the next probe, want at least %d", held, 2*registry.DefaultProbeHold-1)
		}
	})

	t.Run("UnderusedPaceIsNotRaised", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		h.succeed(t, "a", 100, 10*time.Second) // 6 a minute against 15
		if l := h.limits(t, "a"); l.Limit != 15 {
			t.Fatalf("limit = %d, want 15: the pace was never tried", l.Limit)
		}
		if n := len(h.led.ofType(auditd.EventRegistryChanged)); n != 0 {
			t.Fatalf("%d registry.changed events", n)
		}
	})

	t.Run("NeverPassesTheCeiling", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Limit: 40, Window: auditd.Duration(time.Minute)})
		for range 20 {
			h.round(t, "a", registry.DefaultProbeAfter)
		}
		if l := h.limits(t, "a"); perSecond(l) != 40.0/60 {
			t.Fatalf("limits = %+v, want the ceiling of 40 a minute", l)
		}
		for _, e := range h.led.ofType(auditd.EventRegistryChanged) {
			if float64(e.NewLimit)/e.NewWindow.Minutes() > 40 {
				t.Fatalf("event above the ceiling: %+v", e)
			}
		}
	})

	t.Run("AtTheFloorTheWindowStretches", func(t *testing.T) {
		h := newHarness(t, registry.Options{DefaultLimit: 1})
		h.put(t, auditd.Source{ID: "a"})
		h.refuse(t, "a")
		if l := h.limits(t, "a"); l.Limit != 1 || l.Window != 2*time.Minute {
			t.Fatalf("limits = %+v, want 1 per 2m", l)
		}
	})

	t.Run("Refusals", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			obs  registry.Observation
			cut  bool
		}{
			{"Throttled", registry.Observation{Outcome: auditd.OutcomeThrottled}, true},
			{"Status429", registry.Observation{Status: 429}, true},
			{"Status503WithRetryAfter", registry.Observation{Status: 503, Hint: hints.Hint{RetryAfter: time.Second, HasRetryAfter: true, RetryAfterRaw: "1"}}, true},
			// A plain 503 to a source whose pace has not risen is what an
			// outage answers: the breaker's business.
			{"Plain503", registry.Observation{Status: 503, Outcome: auditd.OutcomeServerError}, false},
			{"Status500", registry.Observation{Status: 500}, false},
			{"TransportError", registry.Observation{Status: 0, Outcome: auditd.OutcomeServerError}, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				h.put(t, auditd.Source{ID: "a"})
				obs := tc.obs
				obs.SourceID = "a"
				if got := h.reg.Refusal(obs); got != tc.cut {
					t.Fatalf("Refusal = %v, want %v", got, tc.cut)
				}
				if d := h.observeWith(t, obs); d.Changed != tc.cut || (tc.cut && d.Limit != 7) {
					t.Fatalf("decision = %+v, want cut %v (to 7 a minute)", d, tc.cut)
				}
			})
		}
	})

	t.Run("StatusAloneCountsSuccess", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for range 2 {
			h.clk.Advance(4 * time.Second)
			h.observeWith(t, registry.Observation{SourceID: "a", Status: 204})
		}
		if l := h.limits(t, "a"); l.Limit != 30 {
			t.Fatalf("limit = %d, want slow start to 30", l.Limit)
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

// TestPlain503 is how a 503 without Retry-After is told apart: nginx
// limit_req's refusal, or an outage.
func TestPlain503(t *testing.T) {
	plain := func(h *harness, id string) registry.Observation {
		return registry.Observation{SourceID: id, RunID: "run-1", Status: 503, Sent: h.clk.Now()}
	}
	// rising puts source a in slow start at 2 a second, just risen.
	rising := func(t *testing.T) *harness {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		for range 3 {
			h.startRound(t, "a")
		}
		return h
	}

	t.Run("AfterARiseItIsARefusal", func(t *testing.T) {
		h := rising(t)
		obs := plain(h, "a")
		if !h.reg.Refusal(obs) {
			t.Fatal("a plain 503 just after a rise is not taken for a refusal")
		}
		obs.Outcome = auditd.OutcomeThrottled // as the fetch loop passes it on
		if d := h.observeWith(t, obs); !d.Changed || perSecond(d.Limits) != 1 {
			t.Fatalf("decision = %+v, want back to 1 a second", d)
		}
	})

	t.Run("LongAfterARiseItIsNot", func(t *testing.T) {
		h := rising(t)
		h.succeed(t, "a", 200, time.Second) // a minute and more at a steady pace below it
		if h.reg.Refusal(plain(h, "a")) {
			t.Fatal("a plain 503 long after the last rise taken for a refusal")
		}
	})

	t.Run("BetweenSuccessesItIsARefusal", func(t *testing.T) {
		h := rising(t)
		h.succeed(t, "a", 200, time.Second)
		before := h.limits(t, "a")
		obs := plain(h, "a")
		obs.Outcome = auditd.OutcomeServerError
		if d := h.observeWith(t, obs); d.Changed {
			t.Fatalf("a lone plain 503 changed %+v", d)
		}
		h.clk.Advance(time.Second)
		d := h.observeWith(t, registry.Observation{SourceID: "a", RunID: "run-1", Status: 200})
		if !d.Changed || !(perSecond(d.Limits) < perSecond(before)) {
			t.Fatalf("the success after a plain 503: %+v, want a cut from %+v", d, before)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if !strings.Contains(evs[len(evs)-1].Detail, `"status":503`) {
			t.Fatalf("cut recorded as %s", evs[len(evs)-1].Detail)
		}
	})

	t.Run("AnOutageTeachesNothing", func(t *testing.T) {
		h := rising(t)
		h.succeed(t, "a", 200, time.Second)
		before := h.limits(t, "a")
		n := len(h.led.ofType(auditd.EventRegistryChanged))
		for range 60 { // a minute of maintenance
			h.clk.Advance(time.Second)
			obs := plain(h, "a")
			if h.reg.Refusal(obs) {
				t.Fatal("an outage's 503 taken for a refusal")
			}
			obs.Outcome = auditd.OutcomeServerError
			h.observeWith(t, obs)
		}
		h.clk.Advance(time.Second)
		h.observeWith(t, registry.Observation{SourceID: "a", Status: 200})
		if got := h.limits(t, "a"); got != before || len(h.led.ofType(auditd.EventRegistryChanged)) != n {
			t.Fatalf("after the outage %+v, want %+v and no change", got, before)
		}
	})

	t.Run("AnOutageUndoesTheCutsOfItsFirst503s", func(t *testing.T) {
		h := rising(t)
		before := h.limits(t, "a")
		down := -1
		for i := range 30 { // the maintenance begins just after a rise
			obs := plain(h, "a")
			if h.reg.Refusal(obs) {
				obs.Outcome = auditd.OutcomeThrottled
				if down >= 0 {
					t.Fatalf("503 %d taken for a refusal after 503 %d was not", i, down)
				}
			} else {
				obs.Outcome = auditd.OutcomeServerError
				if down < 0 {
					down = i
				}
			}
			h.observeWith(t, obs)
			h.clk.Advance(time.Second)
		}
		// Ten seconds of nothing but 503s: the source is down.
		if down < 1 || down > 11 {
			t.Fatalf("503s stopped counting as refusals at %d", down)
		}
		if got := h.limits(t, "a"); got != before {
			t.Fatalf("after the outage %+v, want the pace before it, %+v", got, before)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if c := evs[len(evs)-1].Cause; c != registry.CauseOutage {
			t.Fatalf("last change %q, want the outage's undo", c)
		}
	})
}

// TestStoredStateWithoutPhase is a data directory written before learning had
// phases: an outage's 503s there cut a source to a crawl ("429", throttled at
// a limit). It recovers on its own, in slow start.
func TestStoredStateWithoutPhase(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auditd.db")
	db := mustOpenDBAt(t, path)
	h := &harness{db: db, clk: clock.NewFake(epoch), led: &memLedger{}}
	reg, err := registry.Open(db, registry.Options{Ledger: h.led, Clock: h.clk})
	if err != nil {
		t.Fatal(err)
	}
	h.reg = reg
	h.put(t, auditd.Source{ID: "a"})
	old := `{"limit":4,"window":"1m0s","base_window":"1m0s","cause":"429","taught_at":"2026-03-01T09:00:00Z","throttled_at":6}`
	if err := db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket([]byte("registry")).Bucket([]byte("learned")).Put([]byte("a"), []byte(old))
	}); err != nil {
		t.Fatal(err)
	}
	if h.reg, err = registry.Open(db, registry.Options{Ledger: h.led, Clock: h.clk}); err != nil {
		t.Fatal(err)
	}
	s, _ := h.reg.State("a")
	if s.Limit != 4 || s.Phase != registry.PhaseStart || s.ThrottledAt != 0 {
		t.Fatalf("old state read as %+v", s)
	}
	for range 4 {
		h.startRound(t, "a")
	}
	if l := h.limits(t, "a"); perSecond(l) < 1 {
		t.Fatalf("after four rounds %+v, want recovered past 1 a second", l)
	}
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
	h.clk.Advance(time.Minute)
	if d := h.refuse(t, "a"); d.Limit != 7 {
		t.Fatalf("after recovery limit = %d, want 7", d.Limit)
	}
}

func equalFloats(a, b []float64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Abs(a[i]-b[i]) > 1e-9 {
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
	h.put(t, auditd.Source{ID: "b"}) // b leaves the group
	if l := h.limits(t, "a"); l.MembersLimit != 15 {
		t.Fatalf("after b left: %+v, want members' sum 15", l)
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
		if strings.HasPrefix(e.Detail, `{"scope":"group"`) {
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
