package registry

import (
	"context"
	"time"

	"github.com/auditd/auditd"
)

// learnQuota learns what obs advertises of the server's quota, for source e
// and its group g.
func (r *Registry) learnQuota(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	// An advertised quota first: a 429 that ships X-RateLimit-Limit corrects
	// the limit at once instead of merely cutting it. Members of a group
	// sit behind one gateway: its advertised quota is the one they share.
	if h := &obs.Hint; h.HasLimit && h.Limit > 0 {
		for _, x := range []*entry{e, g} {
			if x == nil {
				continue
			}
			moved, err := r.advertised(ctx, x, obs, now)
			if err != nil {
				return err
			}
			d.note(x, e, moved)
		}
	}

	// Remaining 0: the pace has used up what the server allows. In slow
	// start that ends slow start as a refusal would, without one; after
	// it, a pace above the advertised quota comes down to it.
	if h := &obs.Hint; h.HasRemaining && h.Remaining <= 0 && !obs.refused() {
		for _, x := range []*entry{e, g} {
			if x == nil {
				continue
			}
			var moved bool
			var err error
			if x.st.Phase == PhaseSteady {
				moved, err = r.overQuota(ctx, x, obs, now, &r.opts)
			} else {
				moved, err = r.spent(ctx, x, obs, now, &r.opts)
			}
			if err != nil {
				return err
			}
			d.note(x, e, moved)
		}
	}
	return nil
}

// overQuota brings entry x, after slow start, down to what the server
// admits when a response left nothing of its quota at a faster pace: the
// pauses Remaining 0 asks for hold the source to that rate anyway, and the
// pace on record is then the pace it is sent at. What it admits is the
// rate of its successes over the last ten seconds (or paceRequests
// intervals) at the pace in force. The pace holds just under it, and a probe past it that met this
// doubles the hold.
func (r *Registry) overQuota(ctx context.Context, x *entry, obs *Observation, now time.Time, o *Options) (bool, error) {
	if x.st.capped() {
		return false, nil // paced at the quota: nothing left at its end is the window spent
	}
	since := now.Add(-max(roundTime, paceRequests*x.interval()))
	if x.changed.After(since) {
		since = x.changed
	}
	per, ok := x.hist.admitted(now, since, 0)
	if !ok {
		return false, nil // too soon after the pace changed to tell
	}
	if x.rate().perSecond() <= (1+2*o.ProbeGain)*per {
		return false, nil // near enough: the pace is what is sent
	}
	if x.probing || now.Sub(x.probedAt) < probeMemory {
		x.hold = min(2*max(x.hold, o.ProbeHold), o.MaxHold)
	}
	x.probing, x.held, x.clean = false, 0, 0
	old := x.st
	x.st.Refused = per * (1 + o.ProbeGain)
	l, w := x.limitFor(per, o)
	c := change{cause: CauseHeader, runID: obs.RunID, sourceID: obs.SourceID, remaining: true}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err == nil && !moved {
		err = r.persist(x)
	}
	return moved, err
}

// advertised learns from an advertised quota in obs for entry x (a source,
// or the group it belongs to), and reports whether x's limit moved.
func (r *Registry) advertised(ctx context.Context, x *entry, obs *Observation, now time.Time) (bool, error) {
	h := &obs.Hint
	w, from := x.win.window(h, now, &r.opts)
	if x.st.AdvLimit == h.Limit && x.st.AdvWindow.D() == w && x.st.WindowFrom == from {
		return false, nil // an unchanged advertisement teaches nothing new
	}
	old := x.st
	x.st.AdvLimit, x.st.AdvWindow, x.st.WindowFrom = h.Limit, auditd.Duration(w), from
	x.st.Base = auditd.Duration(w)
	l, nw := clamp(h.Limit, w, x.ceil)
	switch from {
	case WindowAdvertised, WindowReset:
		// The server said what it allows: that is the pace, and the cap. A
		// Reset that counts down is a window's: no window resets later than
		// its length, so the quota over the longest Reset seen, spread
		// evenly over it, is never more than the server allows.
		x.st.Phase, x.st.Refused, x.probing, x.held = PhaseSteady, 0, false, 0
	default:
		// An assumed window, a bucket's, or one read off a Reset that does
		// not move is only a starting point: where
		// slow start is still under way it goes on from the faster of the
		// two, until a refusal or a Remaining of 0 ends it.
		if x.st.Phase != PhaseSteady && x.rate().faster(rate{l, nw}) {
			l, nw = x.st.Limit, x.st.Window.D()
		}
	}
	c := change{cause: CauseHeader, runID: obs.RunID, sourceID: obs.SourceID, window: from}
	return r.move(ctx, x, old, l, nw, c, now)
}

// spent ends entry x's slow start on a response that said nothing remains
// of the server's quota: back to the pace of the last clean round, with the
// pace that spent it taken as refused.
func (r *Registry) spent(ctx context.Context, x *entry, obs *Observation, now time.Time, o *Options) (bool, error) {
	cur := x.rate()
	x.st.Phase, x.st.Refused = PhaseSteady, cur.perSecond()
	x.lastCut, x.hist, x.roundCount, x.held, x.probing = now, history{}, 0, 0, false
	l, w := x.limitFor(cur.perSecond()/o.Growth, o)
	old := x.st
	c := change{cause: CauseHeader, runID: obs.RunID, sourceID: obs.SourceID, remaining: true}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err == nil && !moved {
		err = r.persist(x)
	}
	return moved, err
}
