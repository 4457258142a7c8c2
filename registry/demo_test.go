package registry_test

import (
	"cmp"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/sim"
)

// TestDemoShowsWhatIsAllowed: every source of make run's demo that sends 30
// requests or more shows, once learned, a pace within 20% of what the
// simulator allows it, in both directions. Each source (a gateway group's
// members together) runs on its own pacer at the demo's ceiling, so one
// slow source does not set the pace of the others; maple-county, whose
// limit the demo's operator sets and whose outages teach nothing, and the
// geocoder's key and Grants.gov's search (a POST), which the pacer does not
// send, are left out.
func TestDemoShowsWhatIsAllowed(t *testing.T) {
	if testing.Short() {
		t.Skip("sends thousands of requests")
	}
	cases := []struct {
		ids     []string
		ceiling int     // a minute, as demoSources sets it
		allowed float64 // a second, what the scenario's limit lets through
		run     time.Duration
		// within is how near to allowed the pace must be shown: 20%, and
		// 10% for a fixed window, which is used whole.
		within float64
	}{
		{ids: []string{"harris-county"}, ceiling: 300, allowed: 2, run: 2 * time.Minute},
		{ids: []string{"travis-county"}, ceiling: 30, allowed: 10.0 / 60, run: 6 * time.Minute, within: 0.1},
		{ids: []string{"north-county", "south-county"}, ceiling: 240, allowed: 2, run: 2 * time.Minute},
		{ids: []string{"cedar-county"}, ceiling: 180, allowed: 1, run: 2 * time.Minute},
		{ids: []string{"grants-gov"}, ceiling: 180, allowed: 1, run: 2 * time.Minute},
		{ids: []string{"county-geocoder"}, ceiling: 600, allowed: 5, run: 2 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.ids[0], func(t *testing.T) {
			t.Parallel()
			sc, err := sim.LoadScenario(filepath.Join("..", "testdata", "scenarios", "demo.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			sc.Upstreams = slices.DeleteFunc(sc.Upstreams, func(u sim.Upstream) bool { return !slices.Contains(tc.ids, u.Name) })
			sc.Groups = slices.DeleteFunc(sc.Groups, func(g sim.Group) bool {
				return !slices.ContainsFunc(sc.Upstreams, func(u sim.Upstream) bool { return u.Group == g.Name })
			})
			for i := range sc.Upstreams {
				sc.Upstreams[i].RequiredHeader = nil
				if c := sc.Upstreams[i].Collection; c != nil && c.Kind == sim.CollectionGrantsGov {
					sc.Upstreams[i].Collection = nil // answers POST alone; its limit is what is learned
				}
			}
			p := newPacer(t, sc, tc.ceiling)
			p.runUntil(tc.run)
			if sent := p.between(0, tc.run).requests; sent < 30 {
				t.Fatalf("%d requests sent, want 30 or more to judge", sent)
			}
			l, err := p.reg.Limits(tc.ids[0])
			if err != nil {
				t.Fatal(err)
			}
			limit, window := l.Pace()
			shown := float64(limit) / window.Seconds()
			t.Logf("%s: shows %d/%v (%.3g/s), allowed %.3g/s; %s", tc.ids[0], limit, window, shown, tc.allowed, p.between(0, tc.run))
			within := cmp.Or(tc.within, 0.2)
			if shown > (1+within)*tc.allowed || shown < (1-within)*tc.allowed {
				t.Errorf("shows %.3g/s, want within %.0f%% of the %.3g/s allowed\n%s", shown, 100*within, tc.allowed, p.trace())
			}
		})
	}
}
