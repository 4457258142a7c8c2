package registry_test

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/auditd/auditd/sim"
)

// TestDropIsFoundAgain: a sliding window of 20 a second that drops to 5 a
// second. Right after the drop the window still holds the faster pace, so
// what the server admits over the first seconds is a fraction of the new
// limit; recovery must not take that for the limit, and the source is back
// at 90% of the new limit within a minute of the drop.
func TestDropIsFoundAgain(t *testing.T) {
	sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "rising.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	convergeCase{factor: 0.25}.reshape(sc)
	_, final := rescale(sc, 20)
	p := newPacer(t, sc, 1800)
	drop, found := 2*time.Minute, 3*time.Minute
	p.runUntil(found + 3*time.Minute)
	if after := p.between(found, found+3*time.Minute); after.rate() < 0.9*final || after.refusedShare() > 0.02 {
		t.Fatalf("%s from a minute after the drop to %.3g/s at %v, want 90%% of it and at most 2%% refused\n%s", after, final, drop, p.trace())
	}
}
