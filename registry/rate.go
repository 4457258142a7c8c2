package registry

import (
	"math"
	"time"
)

// paceWindows are the windows a learned pace is expressed in: the shortest
// that holds about paceRequests requests at that pace. A short window keeps
// the limiter's strict sliding window (no more than the limit in any window,
// which reconciliation's R9 checks) from holding a source back for long
// after a cut, when the requests sent at the faster pace are still in it;
// paceRequests per window keeps steps of about 5%.
var paceWindows = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second,
	15 * time.Second, 20 * time.Second, 30 * time.Second, time.Minute,
}

const paceRequests = 20

// limitFor expresses per (requests per second) as a limit per window,
// rounded down so the pace never exceeds it, within e's cap. The window is
// the advertised one when it caps the pace (so the quota is kept exactly),
// else the shortest of paceWindows that holds paceRequests at that pace.
// Below one request a minute, the window stretches instead, up to MaxWindow.
func (e *entry) limitFor(per float64, o *Options) (int, time.Duration) {
	per = max(min(per, e.cap().perSecond()), 1/o.MaxWindow.Seconds())
	w := paceWindows[len(paceWindows)-1]
	if e.st.capped() {
		w = e.st.AdvWindow.D()
	} else {
		for _, pw := range paceWindows {
			if per*pw.Seconds() >= paceRequests {
				w = pw
				break
			}
		}
	}
	l := int(math.Floor(per*w.Seconds() + 1e-9))
	if l < 1 {
		l, w = 1, min(o.MaxWindow, time.Duration(math.Ceil(float64(time.Second)/per)))
	}
	return clamp(l, w, e.cap())
}

// faster reports whether per, expressed as a limit per window, is a faster
// pace than e's.
func (e *entry) faster(per float64, o *Options) bool {
	l, w := e.limitFor(per, o)
	return rate{l, w}.faster(e.rate())
}

// rate is limit requests per window.
type rate struct {
	limit  int
	window time.Duration
}

// faster reports whether a allows more requests per unit of time than b.
func (a rate) faster(b rate) bool {
	return float64(a.limit)*float64(b.window) > float64(b.limit)*float64(a.window)
}

// in returns the most requests per window w that stay within a.
func (a rate) in(w time.Duration) int {
	return int(float64(a.limit) * float64(w) / float64(a.window))
}

// perSecond returns a in requests per second.
func (a rate) perSecond() float64 {
	if a.window <= 0 {
		return 0
	}
	return float64(a.limit) / a.window.Seconds()
}

// clamp returns l per w brought within ceiling c: the same window with fewer
// requests when that leaves at least one, else c itself.
func clamp(l int, w time.Duration, c rate) (int, time.Duration) {
	if c.limit == 0 {
		return l, w
	}
	m := c.in(w)
	if l <= m {
		return l, w
	} else if m >= 1 {
		return m, w
	}
	return c.limit, c.window
}
