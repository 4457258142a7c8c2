package registry

import (
	"testing"
	"time"

	"github.com/auditd/auditd/hints"
)

var t0 = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

func TestAdmitted(t *testing.T) {
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

	t.Run("SinceTheLastCutLessThePausesAsked", func(t *testing.T) {
		var h history
		for i := range 20 { // one a second after a cut at t0, with a 10s pause in the middle
			s := float64(i + 1)
			if i >= 10 {
				s += 10
			}
			h.add(at(s), time.Second)
		}
		// 20 successes in 30s, 10s of which the server asked to wait.
		got, ok := h.admitted(at(30), t0, 10*time.Second)
		if !ok || got != 1 {
			t.Fatalf("admitted = %v, %v; want 1 a second", got, ok)
		}
		got, _ = h.admitted(at(30), t0, 0)
		if want := 20.0 / 30; got != want {
			t.Fatalf("admitted without the pause left out = %v, want %v", got, want)
		}
	})

	t.Run("WithoutARecentCutTheBusySpell", func(t *testing.T) {
		var h history
		for i := range 10 {
			h.add(at(float64(i)), time.Second) // an earlier spell
		}
		for i := range 10 {
			h.add(at(100+float64(i)/2), 500*time.Millisecond) // two a second after an idle gap
		}
		got, ok := h.admitted(at(104.5), time.Time{}, 0)
		if !ok || got != 2 {
			t.Fatalf("admitted = %v, %v; want the last spell's 2 a second", got, ok)
		}
	})

	t.Run("TooFewOrTooShortSaysNothing", func(t *testing.T) {
		var h history
		for i := range 3 {
			h.add(at(float64(i)), time.Second)
		}
		if _, ok := h.admitted(at(3), t0.Add(-time.Second), 0); ok {
			t.Fatal("an estimate from three successes")
		}
		var fast history
		for i := range 15 {
			fast.add(at(float64(i)/10), 100*time.Millisecond)
		}
		if _, ok := fast.admitted(at(1.5), t0, 0); ok {
			t.Fatal("an estimate from a second and a half")
		}
	})

	t.Run("RingKeepsTheLatest", func(t *testing.T) {
		var h history
		for i := range histLen + 100 {
			h.add(at(float64(i)), time.Second)
		}
		if h.n != histLen {
			t.Fatalf("held %d, want %d", h.n, histLen)
		}
		got, ok := h.admitted(at(float64(histLen+99)), time.Time{}, 0)
		if !ok || got != 1 {
			t.Fatalf("admitted = %v, %v", got, ok)
		}
	})
}

func TestWindowGuess(t *testing.T) {
	o := Options{}
	o.setDefaults()
	hint := func(limit, remaining int, reset time.Duration) *hints.Hint {
		h := &hints.Hint{Limit: limit, HasLimit: true}
		if remaining >= 0 {
			h.Remaining, h.HasRemaining = remaining, true
		}
		if reset > 0 {
			h.Reset, h.HasReset = reset, true
		}
		return h
	}
	for _, tc := range []struct {
		name  string
		seen  []*hints.Hint
		want  time.Duration
		howTo string
	}{
		{"Advertised", []*hints.Hint{{Limit: 10, HasLimit: true, Window: 10 * time.Second, HasWindow: true}}, 10 * time.Second, WindowAdvertised},
		{"Assumed", []*hints.Hint{hint(10, -1, 0)}, time.Minute, WindowAssumed},
		{"ResetRoundedUp", []*hints.Hint{hint(60, 59, 41*time.Second), hint(60, 58, 39*time.Second)}, time.Minute, WindowReset},
		{"OneReset", []*hints.Hint{hint(60, 59, 41*time.Second)}, time.Minute, WindowStatic},
		{"LongestReset", []*hints.Hint{hint(60, 10, 3*time.Second), hint(60, 59, 9*time.Second), hint(60, 58, 7*time.Second)}, 10 * time.Second, WindowReset},
		// A Reset that moves without counting down (a bucket's time to
		// refill whole, read in whole seconds) is no window's.
		{"MovesWithoutCountingDown", []*hints.Hint{hint(20, 19, time.Second), hint(20, 18, 2*time.Second), hint(20, 19, time.Second), hint(20, 18, 2*time.Second)}, 2 * time.Second, WindowStatic},
		// A bucket of 20 at 5 a second: a Reset of 4s with 20 missing says
		// nothing of the window; one with at most 5 missing does.
		{"Bucket", []*hints.Hint{hint(5, 19, time.Second), hint(5, 0, 4*time.Second)}, time.Second, WindowBucket},
		{"NewLimitStartsOver", []*hints.Hint{hint(60, 59, 50*time.Second), hint(30, 29, 4*time.Second), hint(30, 28, 2*time.Second)}, 5 * time.Second, WindowReset},
		// A Unix-time Reset of a 2-minute window, in whole seconds,
		// read just after the window began: 121 s is that window.
		{"UnixResetASecondLong", []*hints.Hint{hint(1000, 999, 121*time.Second), hint(1000, 998, 119*time.Second)}, 2 * time.Minute, WindowReset},
		{"ASecondLong", []*hints.Hint{hint(10, 9, 11*time.Second), hint(10, 8, 9*time.Second)}, 10 * time.Second, WindowReset},
		{"PastAnHour", []*hints.Hint{hint(5000, 4999, 90*time.Minute), hint(5000, 4998, 90*time.Minute-2*time.Second)}, time.Hour, WindowReset},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g windowGuess
			var w time.Duration
			var how string
			for i, h := range tc.seen {
				w, how = g.window(h, t0.Add(time.Duration(i)*countdownSpan), &o)
			}
			if w != tc.want || how != tc.howTo {
				t.Fatalf("window = %v from %s, want %v from %s", w, how, tc.want, tc.howTo)
			}
		})
	}
}

// FuzzWindowGuess feeds arbitrary advertisements: the window is always
// positive and no longer than MaxWindow.
func FuzzWindowGuess(f *testing.F) {
	f.Add(5, 9, int64(time.Second), 5, 7, int64(2*time.Second))
	f.Add(60, 59, int64(58*time.Second), 60, -1, int64(0))
	f.Fuzz(func(t *testing.T, l1, r1 int, d1 int64, l2, r2 int, d2 int64) {
		o := Options{}
		o.setDefaults()
		var g windowGuess
		for _, s := range [][3]int64{{int64(l1), int64(r1), d1}, {int64(l2), int64(r2), d2}} {
			if s[0] <= 0 {
				continue // Observe reads only a positive limit
			}
			h := &hints.Hint{Limit: int(s[0]), HasLimit: true, Remaining: int(s[1]), HasRemaining: s[1] >= 0,
				Reset: time.Duration(s[2]), HasReset: s[2] > 0}
			w, how := g.window(h, t0, &o)
			if w <= 0 || w > o.MaxWindow || how == "" {
				t.Fatalf("window %v from %q for %+v", w, how, h)
			}
		}
	})
}
