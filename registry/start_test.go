package registry_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/sim"
)

// TestSlowStartOvershootIsNoDrop: a sliding window of 2 a second that
// rises to 8 a second. Slow start resumes after the rise and overshoots;
// its first refusal cuts back to the pace of its last clean round, and a
// refusal soon after, while the window still holds the faster pace, is
// that pace at the limit, not a drop: it cuts by Decrease, not to the
// short spell's admitted rate (which the window's leftovers and the drain
// pause blur low).
func TestSlowStartOvershootIsNoDrop(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "rising.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	convergeCase{factor: 4}.reshape(sc)
	_, final := rescale(sc, 2)
	p := newPacer(t, sc, 1800)
	rise := 2 * time.Minute
	p.runUntil(rise + time.Minute)
	// The refusals after the last slow start past the rise: the first
	// ends it, the second is the one judged.
	var cuts []auditd.Event
	for _, e := range p.led.ofType(auditd.EventRegistryChanged) {
		switch {
		case e.Time.Sub(p.start) < rise:
		case e.Cause == registry.CauseSlowStart:
			cuts = nil
		case e.Cause == registry.CauseThrottle:
			cuts = append(cuts, e)
		}
	}
	if len(cuts) < 2 {
		t.Fatalf("%d cuts after the last slow start past the rise, want two or more\n%s", len(cuts), p.trace())
	}
	c := cuts[1]
	from, to := float64(c.OldLimit)/c.OldWindow.Seconds(), float64(c.NewLimit)/c.NewWindow.Seconds()
	if to < 0.85*from || to < 0.8*final {
		t.Fatalf("the refusal after slow start's end cut %.3g/s to %.3g/s, want Decrease (%.3g/s allowed)\n%s", from, to, final, p.trace())
	}
}

// TestSlowStartFromCold: from the conservative 15 a minute, against a
// server that allows 20 a second, slow start reaches 8 a second within 10
// seconds of the first request: at a second or more a request, the success
// before opens each round, so a doubling takes one interval, not two.
func TestSlowStartFromCold(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "leaky_bucket.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rescale(sc, 20)
	p := newPacer(t, sc, 1800)
	p.runUntil(20 * time.Second)
	for _, e := range p.led.ofType(auditd.EventRegistryChanged) {
		if float64(e.NewLimit)/e.NewWindow.Seconds() < 8 {
			continue
		}
		if at := e.Time.Sub(p.start); at > 10*time.Second {
			t.Fatalf("8/s reached %v after the first request, want within 10s\n%s", at, p.trace())
		}
		return
	}
	t.Fatalf("8/s never reached\n%s", p.trace())
}

// TestSlowStartIdleSourceHolds: a source used now and then (a success a
// minute at 15 a minute) never grows: the success before a round's first
// opens it only to show whether the pace was used, and a minute's gap
// does not use a pace of one request in four seconds.
func TestSlowStartIdleSourceHolds(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "a"})
	h.succeed(t, "a", 10, time.Minute)
	if l := h.limits(t, "a"); l.Limit != registry.DefaultLimit || l.Window != registry.DefaultWindow {
		t.Fatalf("limits after a success a minute = %+v, want the default %d per %v", l, registry.DefaultLimit, registry.DefaultWindow)
	}
}

// TestRefusalAfterRefusedProbeIsNoDrop: a probe past the rate last refused
// is refused, and the source goes back to the pace it held clean. A refusal
// of that pace a few seconds later, before a round proved it again, with
// the server admitting most of it (a request that met the server early: in
// real time, jitter at a pace near the limit), cuts by Decrease; it is not
// a drop to the short spell's admitted rate, which the drain pause blurs
// low.
func TestRefusalAfterRefusedProbeIsNoDrop(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "a", Limit: 6000, Window: auditd.Duration(time.Minute)})
	for range 6 { // 16 a second
		h.startRound(t, "a")
	}
	h.refuse(t, "a") // 8 a second; 16 refused
	for range 6 {    // back to 15, held, then the probe at 16.5
		h.round(t, "a", registry.DefaultProbeAfter)
	}
	if evs := h.led.ofType(auditd.EventRegistryChanged); evs[len(evs)-1].Cause != registry.CauseProbeUp {
		t.Fatalf("last cause = %q, want a probe", evs[len(evs)-1].Cause)
	}
	h.clk.Advance(time.Second)
	h.refuse(t, "a") // the probe: back to 15
	held := perSecond(h.limits(t, "a"))
	// The drain pause, then 25 successes at the pace: fewer than a round.
	h.clk.Advance(time.Second)
	h.succeed(t, "a", 25, time.Second/15)
	h.refuse(t, "a")
	if got := perSecond(h.limits(t, "a")); got < 0.85*held {
		t.Fatalf("a refusal of the pace held clean cut %.3g/s to %.3g/s, want Decrease", held, got)
	}
}

// TestRiseFromTwoFoundSoon: a sliding window of 2 a second that rises to 8
// a second is found again within 20 seconds of the rise. A refusal within
// ten seconds of a cut compares what the server admitted with the pace
// offered, auditd's own drain pause left out: a second of nothing sent
// does not make the server look behind, and cut under the pace it admits.
func TestRiseFromTwoFoundSoon(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "rising.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	convergeCase{factor: 4}.reshape(sc)
	window, final := rescale(sc, 2)
	p := newPacer(t, sc, 1800)
	rise := 2 * time.Minute
	p.runUntil(rise + time.Minute)
	if at := p.reached(rise, final, window); at < 0 || at > 20*time.Second {
		t.Fatalf("90%% of %.3g/s reached %v after the rise, want within 20s\n%s", final, at, p.trace())
	}
}
