package registry

import (
	"context"
	"math"
	"time"
)

// spentRefusals is how many refusals with no success between them show a
// spent window rather than a pace too fast: a bucket admits again within a
// drain pause or two, a spent window not before it resets.
const spentRefusals = 3

// windowSpent ends x's refusal episode on a success. One of spentRefusals
// refusals or more, or any once a spent window was seen, ends at a window's
// boundary: the server refused whatever the pace until it reset. The pace
// is then what the server admitted from the last boundary seen to this
// one, its quota spread evenly over its length; a refused probe doubles the
// hold, as in refuse.
func (r *Registry) windowSpent(ctx context.Context, x *entry, obs *Observation, now time.Time) (bool, error) {
	o := &r.opts
	n := x.episode
	x.episode = 0
	if n < spentRefusals && !x.windowed {
		return false, nil
	}
	x.windowed = true
	// The boundary lies within the last pause: its middle errs least.
	end := now.Add(-x.lastPause / 2)
	from, count, bounded := x.cycleFrom, x.cycleOK, x.bounded
	x.cycleFrom, x.cycleOK, x.bounded = end, 0, true
	span := end.Sub(from)
	if from.IsZero() || count < minAdmitted || span < minSpan {
		return false, nil
	}
	per := float64(count) / span.Seconds()
	// Windows since the last boundary seen: one, unless the last window's
	// length says more went by unspent.
	m := 1.0
	if x.cycleLen > 0 {
		m = max(1, math.Round(span.Seconds()/x.cycleLen.Seconds()))
	}
	win := span.Seconds() / m
	if m > 1 {
		// What was admitted over several windows is the pace sent, not the
		// quota. The pace that spent the last one, spread over the whole
		// window, is.
		per = max(per, x.rateAt(x.episodeAt)*max(0, win-end.Sub(x.episodeAt).Seconds())/win)
	}
	if bounded || x.cycleLen == 0 {
		// From boundary to boundary, the window's length; from the first
		// success, a first guess of it. Boundaries are only known to
		// within a pause: a length near a common one is that one.
		var common bool
		x.cycleLen, common = CommonWindow(time.Duration(win*float64(time.Second)), 0.2)
		if m == 1 && common {
			// One window, spent: what it admitted is its quota, over its
			// length rather than over the blurred span between the two
			// boundaries seen.
			per = float64(count) / x.cycleLen.Seconds()
		}
	}
	if x.probing || now.Sub(x.probedAt) < max(probeMemory, 2*x.cycleLen) {
		x.hold = min(2*max(x.hold, o.ProbeHold), o.MaxHold)
	}
	x.probing, x.held, x.proven, x.afterStart, x.gain = false, 0, true, false, o.ProbeGain
	x.lastCut, x.pacedSum, x.paused, x.drained = now, 0, 0, 0
	old := x.st
	x.st.Phase, x.st.Refused = PhaseSteady, per
	l, w := x.limitFor(per, o)
	c := change{cause: CauseWindowSpent, runID: obs.RunID, sourceID: obs.SourceID}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err == nil && !moved {
		err = r.persist(x)
	}
	return moved, err
}

// The pause after a further refusal of an episode doubles, up to four
// drain pauses or 1/episodeShare of the time the episode has lasted,
// whichever is longer, and maxEpisodePause: a spent window is found soon
// after its boundary, with few refusals before it.
const (
	episodeShare    = 8
	maxEpisodePause = time.Minute
)

// episodePause is the pause after the latest refusal of x's episode, the
// first's being drain. For the first refusal of a window seen spent
// before, it is the time to the window's next boundary, as the last
// window's length and end tell it, and a second, unless that says a
// boundary just went by.
func (e *entry) episodePause(drain time.Duration, now time.Time) time.Duration {
	if e.episode == 1 && e.cycleLen > 0 && !e.cycleFrom.IsZero() {
		n := now.Sub(e.cycleFrom)/e.cycleLen + 1
		// Unless a boundary was due just now, or within half the last
		// pause (which is how well the last boundary is known): the
		// estimate ran ahead of the window, whose boundary is near.
		wait := e.cycleFrom.Add(n * e.cycleLen).Sub(now)
		if 10*wait < 9*e.cycleLen && wait < e.cycleLen-e.lastPause/2 {
			e.lastPause = wait + settle
			return e.lastPause
		}
	}
	grown := drain << min(e.episode-1, 16)
	e.lastPause = max(drain, min(grown, max(now.Sub(e.episodeAt)/episodeShare, 4*drain), maxEpisodePause))
	return e.lastPause
}

// CommonWindow returns the length quota windows commonly come in (1 s,
// 5 s, a minute ...) that d is within the share within of, and true; or d
// and false when there is none. A window's length read between two
// refusals errs by where in each window the pace spent it, and by how
// late the refusals were seen: a length near a common one is that one.
func CommonWindow(d time.Duration, within float64) (time.Duration, bool) {
	for _, w := range windows {
		if math.Abs(float64(d-w)) <= within*float64(w) {
			return w, true
		}
	}
	return d, false
}
