package registry

import (
	"math"
	"time"

	"github.com/auditd/auditd/hints"
)

// histLen is how many recent successes a history keeps: enough that a
// gateway's burst is a small share of what it measures.
const histLen = 512

// minAdmitted is the fewest successes an admitted-rate estimate rests on.
const minAdmitted = 4

// history is a ring of a source's most recent successes: when each came back
// and the interval of the pace it was sent at. When the server starts
// refusing, the successes of the busy spell before show the rate it admits.
type history struct {
	at   [histLen]time.Time
	iv   [histLen]time.Duration
	n    int // entries held, up to histLen
	head int // index of the next write
}

// add records a success at t, sent at a pace of one request per iv.
func (h *history) add(t time.Time, iv time.Duration) {
	h.at[h.head], h.iv[h.head] = t, iv
	h.head = (h.head + 1) % histLen
	h.n = min(h.n+1, histLen)
}

// before returns when the success before the latest came back; false when
// fewer than two are held.
func (h *history) before() (time.Time, bool) {
	if h.n < 2 {
		return time.Time{}, false
	}
	return h.at[(h.head-2+histLen)%histLen], true
}

// minSpan is the shortest span an admitted rate is measured over.
const minSpan = 2 * time.Second

// sinceCutSpan is the longest time after a refusal over which admitted
// counts every success since it.
const sinceCutSpan = 5 * time.Minute

// admitted estimates the rate, in requests per second, the server admitted
// lately. Within sinceCutSpan of the last refusal (since) it is every
// success since then over the time since: a gateway's bucket was full then
// and is full now, so what it admitted in between is its rate, its burst
// aside; pauses the server asked for (paused: Retry-After, Remaining 0)
// are not counted, and any other pause only makes the estimate lower. Otherwise it is the busy spell that ends
// now: the latest successes back to the first gap longer than twice the pace
// they were sent at. It reports false when too few successes are held to
// say.
func (h *history) admitted(now, since time.Time, paused time.Duration) (float64, bool) {
	if h.n == 0 {
		return 0, false
	}
	i := (h.head - 1 + histLen) % histLen
	recent := !since.IsZero() && now.Sub(since) <= sinceCutSpan
	if !recent && now.Sub(h.at[i]) > 2*h.iv[i]+time.Second {
		return 0, false // idle since the last success
	}
	count, oldest, oldIv := 0, now, time.Duration(0)
	for k := 0; k < h.n; k++ {
		j := (i - k + histLen) % histLen
		if recent {
			if !h.at[j].After(since) {
				break
			}
		} else if count > 0 && oldest.Sub(h.at[j]) > 2*max(h.iv[j], oldIv) {
			break
		}
		count, oldest, oldIv = count+1, h.at[j], h.iv[j]
	}
	from := oldest.Add(-oldIv) // the first success's interval began before it
	if recent && (count < h.n || h.n < histLen) {
		// Every success since the refusal is held: the span is since it,
		// less the pauses the server asked for (a Retry-After's wait says
		// how long to wait, not how fast to go). When the ring holds only
		// the latest, the span starts before the oldest and the pauses,
		// which may be older, are not left out: the estimate errs low.
		from = since.Add(paused)
	}
	if count < minAdmitted {
		return 0, false
	}
	span := now.Sub(from)
	if span < minSpan || span < time.Duration(minAdmitted)*oldIv {
		return 0, false // too short to tell a rate from noise
	}
	return float64(count) / span.Seconds(), true
}

// Ways an advertised quota's window is known, as recorded in the
// registry.changed event that the advertisement taught (window_from).
const (
	// WindowAdvertised: the server said it (RateLimit-Policy w,
	// X-RateLimit-Window). The quota then caps the pace.
	WindowAdvertised = "advertised"
	// WindowReset: for a Reset seen to count down, the longest Reset seen,
	// rounded up to a common window length (roundWindow), among the
	// responses whose Remaining left no more than one window's quota
	// missing. No window resets later than its length, and a bucket that has
	// lost at most one window's quota refills within a window; a bucket
	// holding more than the limit (Remaining above it) that has lost more
	// takes longer, and is left out.
	WindowReset = "reset"
	// WindowBucket: as WindowReset, for a server whose Remaining has gone
	// above the limit: a token bucket with a burst larger than its rate per
	// window, whose Reset (time to refill whole) says little of the window.
	WindowBucket = "bucket"
	// WindowStatic: as WindowReset, for a Reset not yet seen to count down:
	// one response, a header the server sends as a constant (nginx
	// add_header), or a bucket's time to refill whole. It says little of
	// the window either.
	WindowStatic = "static"
	// WindowAssumed: nothing said; Options.AssumedWindow, recorded as an
	// assumption.
	WindowAssumed = "assumed"
)

// windows are the lengths quota windows come in: a Reset read off a
// response is rounded up to the next of them (a fixed window's first
// response in this process may come seconds into it).
var windows = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second,
	20 * time.Second, 30 * time.Second, time.Minute, 2 * time.Minute, 5 * time.Minute,
	10 * time.Minute, 15 * time.Minute, 30 * time.Minute, time.Hour,
}

// roundWindow rounds d up to the next of windows, or to whole hours past
// the last.
func roundWindow(d time.Duration) time.Duration {
	for _, w := range windows {
		if d <= w {
			return w
		}
	}
	return time.Duration(math.Ceil(d.Hours())) * time.Hour
}

// resetSpan is the longest a window whose Reset read d can be. A Reset
// comes in whole seconds, rounded up by many servers, and one given as a
// Unix time is read against a clock (the server's Date, or this one's) a
// little behind the server's: a window of 2 minutes reads 121 s just after
// it resets, which rounded up would be 5 minutes, pacing its quota at
// two fifths. Past 5 s, a second and 2% are taken off; at 5 s or less a
// second is too much to tell a window of 1 s from one of 2 s, and the
// longer is kept (a slower pace, not a refused one).
func resetSpan(d time.Duration) time.Duration {
	if d <= 5*time.Second {
		return d
	}
	return d - time.Second - d/50
}

// windowGuess infers the window of an advertised limit that comes without
// one, from what Remaining and Reset have shown since the limit was first
// advertised.
type windowGuess struct {
	limit    int           // the advertised limit this guess is for
	maxLeft  int           // most Remaining seen
	maxReset time.Duration // longest Reset seen with at most a window's quota missing
	// A Reset seen, and when: a later one that has counted down from it by
	// the time between them shows a window's Reset (countsDown); one that
	// has not is a new anchor. A header sent as a constant does not count
	// down, nor does a bucket's time to refill whole, under a steady pace.
	anchorReset time.Duration
	anchorAt    time.Time
	countsDown  bool
}

// countdownSpan is the least time between two Resets that show a countdown;
// countdownSlack, how far from the elapsed time the countdown may be (a
// Reset in whole seconds is up to a second off), and never more than half
// of it.
const (
	countdownSpan  = 2 * time.Second
	countdownSlack = 1100 * time.Millisecond
)

// window returns the window of the quota h advertises and how it is known,
// learning from h's Remaining and Reset first.
func (g *windowGuess) window(h *hints.Hint, now time.Time, o *Options) (time.Duration, string) {
	if h.HasWindow && h.Window > 0 {
		return h.Window, WindowAdvertised
	}
	if g.limit != h.Limit {
		*g = windowGuess{limit: h.Limit}
	}
	if h.HasRemaining {
		g.maxLeft = max(g.maxLeft, h.Remaining)
	}
	if h.HasReset && h.Reset > 0 {
		if g.anchorAt.IsZero() {
			g.anchorReset, g.anchorAt = h.Reset, now
		} else if gone := now.Sub(g.anchorAt); gone >= countdownSpan && gone < g.anchorReset {
			if d := g.anchorReset - gone - h.Reset; d.Abs() <= min(countdownSlack, gone/2) {
				g.countsDown = true
			} else {
				g.anchorReset, g.anchorAt = h.Reset, now
			}
		} else if gone >= g.anchorReset {
			g.anchorReset, g.anchorAt = h.Reset, now // a new window, or a new bucket reading
		}
		// What is missing from the bucket or window: its capacity is at
		// least the limit, and at least one more than the most ever left.
		capacity := max(h.Limit, g.maxLeft+1)
		if !h.HasRemaining || capacity-h.Remaining <= h.Limit {
			g.maxReset = max(g.maxReset, h.Reset)
		}
	}
	if g.maxReset > 0 {
		w := min(roundWindow(resetSpan(g.maxReset)), o.MaxWindow)
		switch {
		case g.maxLeft >= h.Limit:
			return w, WindowBucket
		case !g.countsDown:
			return w, WindowStatic
		}
		return w, WindowReset
	}
	return o.AssumedWindow, WindowAssumed
}
