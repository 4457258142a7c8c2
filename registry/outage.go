package registry

import (
	"context"
	"time"
)

// fail counts a failure of source e (and its group g): a 5xx, a transport
// error, or a plain 503. Enough of them in a row, with no success for
// outageTime, are an outage: the source is down, plain 503s are no longer
// taken for refusals until it answers a success, and a cut that a plain 503
// at the start of the run made is undone, so the source resumes at the pace
// it had learned before. (A gateway refusing a pace far above its rate also
// answers several 503s in a row, but lets one through every interval of its
// rate.)
func (r *Registry) fail(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	for _, x := range []*entry{e, g} {
		if x == nil {
			continue
		}
		if x.streak == 0 {
			x.failSince = now
		}
		x.streak++
		x.roundCount = 0
		if x.streak < r.outageStreak(e) || now.Sub(x.failSince) < outageTime {
			continue
		}
		x.down = true
		// Refusals before it were the outage's, and what was admitted
		// around it says nothing of a window.
		x.episode, x.cycleFrom, x.cycleOK = 0, time.Time{}, 0
		if x.undo != nil {
			moved, err := r.revert(ctx, x, obs, now)
			if err != nil {
				return err
			}
			d.Changed = d.Changed || (moved && x == e)
			d.GroupChanged = d.GroupChanged || (moved && x == g)
		}
	}
	return nil
}

// outageTime is how long a source must answer nothing but failures to be
// taken for down.
const outageTime = 10 * time.Second

// suspectStreak is the most failures in a row whose plain 503s may still be
// refusals once a success follows: beyond it, they were an outage.
const suspectStreak = 2

// outageStreak is how many failures in a row make an outage: the source's
// breaker threshold.
func (r *Registry) outageStreak(e *entry) int {
	if t := e.src.Breaker.Threshold; t > 0 {
		return t
	}
	return r.opts.OutageStreak
}

// revert undoes the cut recorded in x.undo: the outage that followed showed
// the plain 503 behind it was not a refusal.
func (r *Registry) revert(ctx context.Context, x *entry, obs *Observation, now time.Time) (bool, error) {
	st := *x.undo
	x.undo = nil
	x.hold = x.undoHold // the 503s doubled it as refused probes: they were not
	old := x.st
	x.st.Refused, x.st.Phase = st.Refused, st.Phase
	if x.st.Phase == "" {
		x.st.Phase = PhaseStart
	}
	x.lastCut = time.Time{}
	c := change{cause: CauseOutage, runID: obs.RunID, sourceID: obs.SourceID}
	return r.move(ctx, x, old, st.Limit, st.Window.D(), c, now)
}
