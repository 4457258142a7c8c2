package registry

import (
	"context"
	"math"
	"net/http"
	"time"
)

// learn applies the lessons of obs to source e and its group g (nil when
// none), recording in d what moved. It stops at the first error, with every
// change made before it committed. Callers hold e.mu and g.mu.
func (r *Registry) learn(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	if err := r.learnQuota(ctx, e, g, obs, now, d); err != nil {
		return err
	}
	switch {
	case obs.refused():
		return r.onRefusal(ctx, e, g, obs, now, d)
	case obs.succeeded():
		return r.onSuccess(ctx, e, g, obs, now, d)
	case obs.failed():
		if obs.ambiguous() && e.suspect.IsZero() && e.streak < suspectStreak {
			e.suspect = obs.Sent
		}
		if err := r.fail(ctx, e, g, obs, now, d); err != nil {
			return err
		}
		if e.streak >= suspectStreak {
			e.suspect = time.Time{}
		}
	}
	return nil
}

// note records in d that x, source e or its group, moved.
func (d *Decision) note(x, e *entry, moved bool) {
	switch {
	case !moved:
	case x == e:
		d.Changed = true
	default:
		d.GroupChanged = true
	}
}

// onRefusal learns from a refusal of source e's request.
func (r *Registry) onRefusal(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	// Members of a group draw on one budget, in whatever order their
	// requests come: a throttle of any of them is the gateway's shared
	// quota speaking. It acts on the group, and the member is left alone.
	x := e
	if g != nil {
		x = g
	}
	if quotaSpent(&obs.Hint) && x.st.capped() {
		// The quota the server advertised is spent until its Reset, which
		// Observe waits out: a window to wait for, not a pace refused.
		if x.episode++; x.episode == 1 {
			x.episodeAt = now
		}
		e.streak, e.suspect = 0, time.Time{}
		if g != nil {
			g.streak = 0
		}
		return nil
	}
	plain := obs.Status == http.StatusServiceUnavailable && !obs.Hint.HasRetryAfter
	before, hold := x.st, x.hold
	moved, err := r.refuse(ctx, x, obs, obs.Sent, now, &r.opts)
	if err != nil {
		return err
	}
	if plain {
		// A plain 503 taken for a refusal may yet turn out to be the
		// first of an outage: keep what to go back to, and count it
		// toward the failures that would show one.
		if moved && x.undo == nil {
			x.undo, x.undoHold = &before, hold
		}
		if err := r.fail(ctx, e, g, obs, now, d); err != nil {
			return err
		}
	} else {
		e.streak = 0 // the server is up, and counting
		if g != nil {
			g.streak = 0
		}
	}
	d.note(x, e, moved)
	e.suspect = time.Time{}
	return nil
}

// onSuccess learns from a success of source e's request: the end of a
// failing spell, a plain 503 before it that was a refusal after all, and a
// round toward a faster pace.
func (r *Registry) onSuccess(ctx context.Context, e, g *entry, obs *Observation, now time.Time, d *Decision) error {
	o := &r.opts
	for _, x := range []*entry{e, g} {
		if x == nil {
			continue
		}
		if x.streak > 0 && x.failSince.After(x.lastCut) {
			if x.down {
				// Back from an outage: the admitted rate is measured from
				// now, not across the outage (a backlog meets the source as
				// it returns, and its refusals say nothing of a rate the
				// spell before would average down).
				x.upAgain, x.paused = now, 0
			} else {
				// Time the source spent failing is not time it refused
				// for rate: the admitted rate leaves it out.
				x.paused += now.Sub(x.failSince)
			}
		}
		// Failures alone for outageTime, even too few to have shown
		// it down (a pace slowed by the cuts sends few): an outage
		// after all, whose cuts are undone.
		if x.undo != nil && x.streak >= suspectStreak+1 && now.Sub(x.failSince) >= outageTime {
			moved, err := r.revert(ctx, x, obs, now)
			if err != nil {
				return err
			}
			d.note(x, e, moved)
		}
		x.okAt, x.streak, x.undo, x.down = now, 0, nil, false
		if x.episode > 0 {
			moved, err := r.windowSpent(ctx, x, obs, now)
			if err != nil {
				return err
			}
			d.note(x, e, moved)
		}
		if x.cycleFrom.IsZero() {
			x.cycleFrom = now // a window began no later than the first success
		}
		x.cycleOK++
	}
	// A plain 503 between successes, or two, was the server refusing
	// that request for its rate: an outage answers every request.
	if !e.suspect.IsZero() {
		sent := e.suspect
		e.suspect = time.Time{}
		late := *obs
		late.Status = http.StatusServiceUnavailable
		moved, err := r.refuse(ctx, e, &late, sent, now, o)
		if err != nil {
			return err
		}
		d.note(e, e, moved)
	}
	for _, x := range []*entry{e, g} {
		if x == nil {
			continue
		}
		x.hist.add(now, x.interval())
		moved, err := r.round(ctx, x, obs, now, o)
		if err != nil {
			return err
		}
		d.note(x, e, moved)
	}
	return nil
}

// refuse cuts entry x after a refusal of a request sent at sent, unless the
// request left before x's last cut (it was paced at the old rate): in slow
// start back to the pace of the last clean round, a probe back to the pace
// before it (probeRefused), else as steadyCut says.
func (r *Registry) refuse(ctx context.Context, x *entry, obs *Observation, sent, now time.Time, o *Options) (bool, error) {
	x.roundCount = 0
	prev := x.refusedAt
	x.refusedAt = now
	// A request sent before the last cut was paced at the old rate; one
	// sent just after it meets a server still full of the faster pace (a
	// bucket that has not drained, a window that still holds it). Neither
	// says anything of the new pace.
	if !x.lastCut.IsZero() && sent.Before(x.lastCut.Add(max(settle, 2*x.interval()))) {
		return false, nil
	}
	// Refusals with no success between them are one episode: a window or
	// a bucket that stays full refuses whatever the pace, and the refusals
	// after the first say nothing of the pace. The episode cuts once; the
	// pause grows with each of its refusals instead (Observe).
	x.episode++
	if x.episode > 1 {
		return false, nil
	}
	x.episodeAt = now
	if x.windowed {
		// A window that was seen spent: this episode's end says what it
		// allows (windowSpent).
		return false, nil
	}
	if x.probing && !sent.Before(x.probedAt) && x.base.limit > 0 {
		return r.probeRefused(ctx, x, obs, sent, now)
	}
	// The pace the refused request was sent at bounds the server's rate
	// from above, and what it was found to admit, from below: recovery
	// climbs back toward the lower of the refused pace and a step above
	// what was admitted; the cut goes below both.
	bad := x.rateAt(sent)
	refused := bad
	var next float64
	start := x.st.Phase != PhaseSteady
	switch {
	case start:
		// The first refusal: back to the pace of the last clean round. What
		// was admitted before is slow start's, and says nothing yet.
		next = bad / o.Growth
		if p := x.prev.perSecond(); p < bad && !sent.Before(x.changed) {
			// The pace before the round refused, when the ceiling (or
			// whole requests) made that round less than Growth.
			next = max(next, p)
		}
		x.hist = history{}
		if x.resumed {
			// Slow start resumed from a pace proven clean: the limit is
			// a step past that pace, not near the one refused.
			refused = min(bad, next*(1+o.ProbeGain))
		}
	default:
		next, refused = x.steadyCut(sent, now, prev, o)
	}
	if x.probing || now.Sub(x.probedAt) < probeMemory {
		// The probe above the last refusal was refused too (or soon after
		// it held): wait longer before the next one.
		x.hold = min(2*max(x.hold, o.ProbeHold), o.MaxHold)
	} else if x.st.Phase == PhaseSteady && x.st.Refused > 0 {
		x.missed++ // refused on the way back up
	}
	x.afterStart = x.afterStart || start
	x.probing, x.held, x.proven, x.gain, x.clean, x.resumed, x.retry = false, 0, false, o.ProbeGain, 0, false, false
	x.lastCut, x.pacedSum, x.paused, x.drained, x.stableFrom = now, 0, 0, 0, time.Time{}
	x.st.Refused = refused
	x.st.Phase = PhaseSteady
	l, w := x.limitFor(next, o)
	if cur := x.rate(); !cur.faster(rate{l, w}) {
		// Never a rise: at the floor already, or the pace was already below.
		l, w = x.limitFor(o.Decrease*cur.perSecond(), o)
	}
	old := x.st
	c := change{cause: CauseThrottle, runID: obs.RunID, sourceID: obs.SourceID, status: obs.Status}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if err != nil {
		x.episode = 0 // the cut did not happen
		return false, err
	}
	if !moved {
		return false, r.persist(x) // the phase and the refused rate changed
	}
	return true, nil
}

// roundNeed is how many successes e's current round takes. A round after
// the first refusal is ProbeAfter successes, or as many as the pace sends
// in roundTime if fewer (a slow pace must not take minutes a round), and
// never fewer than a slow start's, nor than the pace sends in minSpan: a
// window that has just drained admits a burst of the pace, which proves
// nothing of it.
func (e *entry) roundNeed(o *Options) int {
	if e.st.Phase == PhaseSteady {
		return max(o.StartRound, min(o.ProbeAfter, int(math.Ceil(float64(roundTime)/float64(e.interval())))),
			int(math.Ceil(float64(minSpan)/float64(e.interval()))))
	}
	if at, ok := e.hist.before(); ok && e.roundCount == 0 && e.interval() >= startRoundTime {
		// At a second or more a request, the success before this one
		// (sent at the pace before) opens the round: the round still
		// checks that the pace was used from it on, and a doubling
		// takes one interval rather than StartRound of them.
		e.roundStart, e.roundCount = at, 1
	}
	return max(o.StartRound, int(math.Ceil(float64(startRoundTime)/float64(e.interval()))))
}

// round counts a success toward entry x's current round, and when the round
// is complete raises x's pace by what the phase allows: Growth in slow
// start; after a refusal, half the way back toward the refused rate, a hold
// just under it, then a probe above it whose step doubles while probes stay
// clean.
func (r *Registry) round(ctx context.Context, x *entry, obs *Observation, now time.Time, o *Options) (bool, error) {
	if !x.sustained(now, x.roundNeed(o), o) {
		return false, nil
	}
	x.proven, x.afterStart = true, false
	cur := x.rate().perSecond()
	x.good = cur
	g := o.ProbeGain
	if x.st.Refused <= 0 {
		x.st.Refused = cur / (1 - g) // steady with nothing refused: hold here, then probe
	}
	// Recovery stops ProbeGain under the rate refused, and another
	// ProbeGain further under it for each refusal met on the way back up
	// since a probe last held: the refused pace was only a little above the
	// server's rate.
	top := 1 - g*float64(1+min(x.missed, 2))
	var next float64
	cause := CauseProbeUp
	switch {
	case x.st.Phase != PhaseSteady:
		next, cause = cur*o.Growth, CauseSlowStart
	case x.probing:
		// A probe past the last refusal must hold as long as the pace held
		// before it: a gateway's burst hides a pace above its rate for a
		// while, and a round or two proves nothing.
		// A spent window's probe holds for a whole window: a window
		// refuses the pace that overspends it only at its end.
		// Neither waits longer than maxHoldTime, or two windows.
		held := now.Sub(x.probedAt)
		if x.held++; (x.held < max(x.hold, o.ProbeHold) && held < x.holdTime(now)) || held < max(probeProof, x.cycleLen) {
			return false, nil
		}
		x.missed = 0
		// The server allows this pace now: hold here, then probe again.
		// After resumeAfter clean probes in a row, or one at the pace
		// the probe before it was refused at (again), with nothing
		// refused for as long as a hold may last, the limit has risen:
		// slow start resumes from this pace, within the cap.
		again := x.retry && cur >= (1-g/2)*x.st.Refused
		x.probing, x.held, x.hold, x.retry, x.stableFrom = false, 0, o.ProbeHold, false, time.Time{}
		x.st.Refused = cur / (1 - g)
		if x.clean++; (x.clean >= resumeAfter || again) && now.Sub(x.lastCut) >= x.holdTime(now) {
			x.st.Phase, x.clean, x.resumed = PhaseStart, 0, true
		}
		return false, r.persist(x)
	case !x.retry && cur < (top-g)*x.st.Refused && x.faster(min(top*x.st.Refused, max(cur+x.unit(), (cur+x.st.Refused)/2)), o):
		// Recovering after a cut: halve the distance each round, up to
		// just under the rate refused.
		next = min(top*x.st.Refused, max(cur+x.unit(), (cur+x.st.Refused)/2))
		cause = CauseRecover
	default:
		// Just under the rate refused (as near as whole requests per
		// window go): hold, then probe past it.
		if x.held++; x.held < max(x.hold, o.ProbeHold) && now.Sub(x.changed) < x.holdTime(now) {
			return false, nil
		}
		// Held clean at the top: the margin below the refused rate can go.
		x.held, x.probing, x.missed, x.base = 0, true, 0, x.rate()
		next = x.st.Refused * (1 + max(g, x.gain))
		if x.retry {
			// The last probe was refused: no further than its pace.
			next = min(x.st.Refused, cur*(1+2*g))
		}
	}
	l, w := x.limitFor(next, o)
	if !(rate{l, w}).faster(x.rate()) {
		// At the cap, or too slow for a step to show in whole requests:
		// take one request more per window. A probe the cap blocks is no
		// probe: a refusal after it doubles no hold.
		if x.st.Limit >= x.cap().in(x.st.Window.D()) {
			x.probing = false
			return false, nil
		}
		l, w = x.limitFor(x.rate().perSecond()+x.unit(), o)
		if !(rate{l, w}).faster(x.rate()) {
			x.probing = false
			return false, nil
		}
	}
	if x.probing && cause == CauseProbeUp {
		x.probedAt = now
	}
	old := x.st
	c := change{cause: cause, runID: obs.RunID, sourceID: obs.SourceID}
	moved, err := r.move(ctx, x, old, l, w, c, now)
	if moved {
		x.rose = now
	}
	return moved, err
}

// steadyCut returns the pace to cut e to after a refusal, in steady state,
// of a request sent at sent, and the rate to take for refused; prev is the
// refusal before this one. The cut goes to Decrease times the lower of the
// pace the request was sent at and what the server admitted since the last
// cut; when the server was found well behind (refused again since the cut,
// or before a round proved its pace: a limit that dropped), just under what
// it admitted since the refusal before, or half the pace when too little was
// admitted to say; after slow start's end or a refused probe, Decrease times
// the pace unless the server admitted less than 1/Growth of it.
func (e *entry) steadyCut(sent, now, prev time.Time, o *Options) (next, refused float64) {
	bad := e.rateAt(sent)
	refused = bad
	if e.proven && now.Sub(e.dropAt) < probeMemory && bad > (1+o.ProbeGain/2)*e.good {
		// A step up from a pace a round proved since the last cut was
		// refused: the server's rate lies between the two. Back to the
		// proven pace with the step's pace for the rate refused (like a
		// refused probe's, though as a cut: recovery climbs back toward
		// it, a ProbeGain lower for the refusal met on the way up); what
		// was admitted meanwhile is that pace's, and says nothing of the
		// limit.
		return e.good, bad
	}
	// What the server admitted since the last cut bounds its rate from
	// above only where it fell short of the pace in force meanwhile
	// (refusals, pauses it asked for); otherwise it is only the pace
	// that was sent, and the refused pace is the bound.
	since := e.lastCut
	if e.upAgain.After(since) {
		since = e.upAgain
	}
	drained := prev.After(since) && e.paused == 0
	if drained {
		// From one refusal to the next the server goes from full to
		// full: what it admitted in between is its rate. A window
		// that still held a faster pace at the last cut has drained
		// since the refusals after it.
		since = prev
	}
	adm, ok := e.hist.admitted(now, since, e.paused)
	if (e.afterStart || e.retry) && !e.proven && ok && adm*o.Growth >= bad {
		// Slow start's last rounds, or a refused probe, still fill the
		// server's window: a refusal before a round proved the pace it
		// went back to (proven clean before), with the server found
		// admitting more than 1/Growth of it, says that pace is at the
		// limit, not that the limit dropped. What was admitted since is
		// blurred low by the faster pace the window held and by the drain
		// pause. Far less admitted is a burst that hid the rate (a deep
		// bucket): measured below.
		return o.Decrease * bad, refused
	}
	if ok && adm < bad {
		if adm < o.Decrease*e.offered(now) {
			bad = adm
		}
		// Either way the server's rate is not far above what it
		// admitted: recovery heads a step past it, not to the
		// refused pace. Over a short spell what it admitted is
		// blurred by what it still held of the faster pace (a
		// window full of it after a drop): recovery heads back
		// toward the pace refused, and the next cut measures again.
		if now.Sub(since) >= roundTime {
			// Never under a pace a round proved since the cut after
			// a drop: the server admitted that one whole, whatever
			// the pauses blur of it.
			proved := 0.0
			if e.proven && now.Sub(e.dropAt) < probeMemory {
				proved = e.good
			}
			refused = min(refused, max(adm*(1+o.ProbeGain), proved))
		}
	}
	next = o.Decrease * bad
	if (drained || !e.proven) && ok && adm < o.Decrease*e.paced(now) {
		// The server is well behind the pace (a limit that dropped), and
		// what it admitted is its rate now: pace just under it. What a
		// window still held of the old pace blurs that low, so recovery
		// may head up to drainedMargin steps past it.
		next = (1 - o.ProbeGain) * adm
		refused = min(refused, adm*(1+drainedMargin*o.ProbeGain))
		e.dropAt = now
	} else if !e.proven && !e.lastCut.IsZero() {
		// Refused again before a round proved the pace of the last cut:
		// the server is still well behind; halve.
		next = min(next, e.rateAt(sent)/2)
		e.dropAt = now
	}
	return next, refused
}

// probeRefused takes x back to the pace it held clean before its probe,
// after a refusal of a request sent at the probe's pace: a pace never proven
// refused once says the server's rate lies between the two, not that it
// dropped, and costs nothing more than that refusal. The probe's pace is
// the rate refused, and the next probe waits twice as long.
func (r *Registry) probeRefused(ctx context.Context, x *entry, obs *Observation, sent, now time.Time) (bool, error) {
	o := &r.opts
	x.hold = min(2*max(x.hold, o.ProbeHold), o.MaxHold)
	x.probing, x.held, x.proven, x.clean, x.resumed, x.missed, x.retry = false, 0, false, 0, false, 0, true
	x.lastCut, x.pacedSum, x.paused, x.drained = now, 0, 0, 0
	x.st.Refused = x.rateAt(sent)
	if x.stableFrom.IsZero() {
		x.stableFrom = now
	}
	old := x.st
	c := change{cause: CauseThrottle, runID: obs.RunID, sourceID: obs.SourceID, status: obs.Status}
	moved, err := r.move(ctx, x, old, x.base.limit, x.base.window, c, now)
	if err != nil {
		x.episode = 0 // the cut did not happen
		return false, err
	}
	if !moved {
		return false, r.persist(x)
	}
	return true, nil
}

// drainedMargin is how many ProbeGains past what a server well behind the
// pace admitted recovery may head.
const drainedMargin = 6

// resumeAfter is how many probes in a row must hold for slow start to
// resume: a limit that has risen lets every probe through.
const resumeAfter = 2

// maxHoldTime bounds the time a pace holds under the rate last refused
// before it probes, and a probe must hold to count, whatever the hold in
// rounds: a limit that rose is found within a minute of it at two
// requests a second or more (BenchmarkRiseAtEveryPhase). A refused probe
// costs one refusal (probeRefused): one every holdRequests requests at
// most is 1.9% of them.
const maxHoldTime = 15 * time.Second

// holdTime is the longest x holds before a probe: maxHoldTime, two windows
// of a spent window, or holdRequests intervals of the pace, whichever is
// longest (a probe refused every holdRequests requests is refusal enough);
// twice that once every probe for stableTime has been refused.
func (e *entry) holdTime(now time.Time) time.Duration {
	d := max(maxHoldTime, 2*e.cycleLen, holdRequests*e.interval())
	if !e.stableFrom.IsZero() && now.Sub(e.stableFrom) >= stableTime {
		d *= 2
	}
	return d
}

// stableTime is how long probes must have been refused, every one, for the
// limit to count as stable: it is probed half as often.
const stableTime = 5 * time.Minute

// holdRequests is the fewest requests between two probes that maxHoldTime
// lets go: at slow paces the hold is counted in requests, not time. At 50,
// a source held at its limit by refused probes (one in 51 requests, 1.96%)
// went over 2% where a count's span cut a probe cycle; each request more
// delays finding a rise from 2/s by about 3 s on average.
const holdRequests = 52

// rateAt returns the pace in force at t, in requests per second.
func (e *entry) rateAt(t time.Time) float64 {
	if !e.changed.IsZero() && t.Before(e.changed) && e.prev.limit > 0 {
		return e.prev.perSecond()
	}
	return e.rate().perSecond()
}

// risingAt reports whether a request sent at t left soon after e's pace
// rose (within riseWindow, or five intervals of the pace), with a success
// not long before, and e not down: the time a plain 503 is most likely the
// server refusing the faster pace.
func (e *entry) risingAt(t time.Time) bool {
	if e.down || e.rose.IsZero() || t.Before(e.rose) || t.Sub(e.rose) > max(riseWindow, 5*e.interval()) {
		return false
	}
	recent := max(recentSuccess, 4*e.interval())
	return !e.okAt.IsZero() && t.Sub(e.okAt) <= recent
}

// maxPause bounds one server-requested wait, as counted by admitted.
const maxPause = 5 * time.Minute

// maxDrain bounds the pause after a refusal without Retry-After.
const maxDrain = 5 * time.Second

// drainPause is the pause after a refusal without Retry-After: a second, or
// two intervals of the pace, up to maxDrain. After a refused probe (one cut
// back to the pace held clean before it, just now) it is half a second, or
// two intervals of that pace: the probe went only a step past what the
// server allows, and its window or bucket is a request or two over, not a
// slow start's backlog; a second of nothing sent at a fast pace costs many
// requests (at 8 a second, eight: four seconds once the limit falls to 2).
func (e *entry) drainPause(now time.Time) time.Duration {
	d := min(2*e.interval(), maxDrain)
	if e.retry && e.lastCut.Equal(now) {
		return max(settle/2, d)
	}
	return max(settle, d)
}

// roundTime bounds the time of a round after the first refusal, in
// successes at the pace.
const roundTime = 10 * time.Second

// startRoundTime is the least a round of slow start lasts: a gateway's
// burst hides a pace above its rate for a while, and doubling every few
// hundred milliseconds runs far past the rate before the first refusal.
const startRoundTime = time.Second

// settle is the least time after a cut before a refusal can cut again.
const settle = time.Second

// probeProof is the least time a probe past the rate last refused must hold
// to count as allowed: a gateway's burst hides a pace a little above its
// rate for seconds. A refusal within probeMemory of a probe's start is the
// probe's.
const (
	probeProof  = 10 * time.Second
	probeMemory = time.Minute
)

// riseWindow is how long after a rise of the pace a plain 503 is taken for a
// refusal; recentSuccess, how long after a success the source still counts
// as answering.
const (
	riseWindow    = 30 * time.Second
	recentSuccess = 5 * time.Second
)

// paced returns the mean pace in force since the last cut, in requests per
// second; the current pace when there was none.
func (e *entry) paced(now time.Time) float64 {
	if e.lastCut.IsZero() || !now.After(e.lastCut) {
		return e.rate().perSecond()
	}
	from := e.lastCut
	if e.changed.After(from) {
		from = e.changed
	}
	sum := e.pacedSum + e.rate().perSecond()*now.Sub(from).Seconds()
	return sum / now.Sub(e.lastCut).Seconds()
}

// offered returns the pace in force since the last cut, in requests per
// second, less auditd's own drain pauses since it when the cut was less
// than roundTime ago: over a short spell a pause of nothing sent is a large
// share of it, and what the server admitted falls short of the pace by that
// share without the server being behind. Over a longer one the pauses are a
// small share, and a bucket refills during them (it admitted that much).
func (e *entry) offered(now time.Time) float64 {
	span := now.Sub(e.lastCut)
	if e.lastCut.IsZero() || span <= 0 || span >= roundTime {
		return e.paced(now)
	}
	return e.paced(now) * max(0, 1-e.drained.Seconds()/span.Seconds())
}

// sustained counts a success and reports whether it completes a round that
// proves the current pace: need successes or more, sent at
// ProbeUtilization of the pace or more. A round that ends without proof
// starts over.
func (e *entry) sustained(now time.Time, need int, o *Options) bool {
	if e.roundCount == 0 {
		e.roundStart = now
	}
	e.roundCount++
	if e.roundCount < need {
		return false
	}
	// n successes paced at the limit cover n intervals: the first one's
	// interval began before it was seen.
	iv := e.interval()
	span := now.Sub(e.roundStart) + iv
	used := float64(e.roundCount)*float64(iv) >= o.ProbeUtilization*float64(span)
	e.roundCount = 0
	return used
}
