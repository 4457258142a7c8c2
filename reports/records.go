package reports

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/auditd/auditd"
)

// R9 holds each dispatch to two sliding windows. The limit in force (the
// registry's, learned or configured) counts requests, as it always has.
// A source whose dispatches cost more than 1 (the records each carries,
// recorded in its Detail as {"cost":N}) is also held to its configured
// ceiling (ceiling_limit per ceiling_window, from its registry snapshot),
// which counts records: the costs admitted per window, strictly, as the
// limiter's ceiling does. A refused dispatch (a throttle) counted none of
// its records upstream, and the limiter refunds it: its records leave the
// window when the refusal is recorded. A source whose dispatches all cost
// 1 is held to the limit in force alone, as before costs.

// Units a ControlEvidence counts.
const (
	UnitRequests = "requests"
	UnitRecords  = "records"
)

// recordWindow is a sliding window of dispatches: each one's seq and cost,
// and the sum of the costs inside it.
type recordWindow struct {
	at      []int64 // unix nanos, ascending; at[head:] are live
	seq     []uint64
	cost    []int64
	head    int
	records int64 // the cost of at[head:]
}

// add counts dispatch seq at t (unix nanos) of cost.
func (w *recordWindow) add(seq uint64, t, cost int64) {
	w.at = append(w.at, t)
	w.seq = append(w.seq, seq)
	w.cost = append(w.cost, cost)
	w.records += cost
}

// expire drops the dispatches at or before t, and compacts the slices once
// most of them are dead.
func (w *recordWindow) expire(t int64) {
	for w.head < len(w.at) && w.at[w.head] <= t {
		w.records -= w.cost[w.head]
		w.head++
	}
	if w.head > 1024 && w.head*2 > len(w.at) {
		w.at = append(w.at[:0], w.at[w.head:]...)
		w.seq = append(w.seq[:0], w.seq[w.head:]...)
		w.cost = append(w.cost[:0], w.cost[w.head:]...)
		w.head = 0
	}
}

// restart forgets the dispatches counted so far: a slower limit counts
// only those after it.
func (w *recordWindow) restart() {
	w.head, w.records = len(w.at), 0
}

// refund takes the cost of dispatch seq out of the window, if it is in it.
func (w *recordWindow) refund(seq uint64) {
	live := w.seq[w.head:]
	if i, ok := slices.BinarySearch(live, seq); ok {
		i += w.head
		w.records -= w.cost[i]
		w.cost[i] = 0
	}
}

// requests is how many dispatches the window holds.
func (w *recordWindow) requests() int64 { return int64(len(w.at) - w.head) }

// ceiling is a source's configured ceiling in records, and the window R9
// holds its costed dispatches to.
type ceiling struct {
	limit  int
	window time.Duration
	win    recordWindow
	costed bool // a dispatch of the source cost other than 1
}

// snapshotDetail takes from a registry snapshot of s the burst the limiter
// allowed (unless the Reconciler was given one) and the configured ceiling.
func (rc *recount) snapshotDetail(s *scope, e *auditd.Event) {
	if e.Type != auditd.EventRegistrySnapshot || e.Detail == "" {
		return
	}
	var d struct {
		Burst         int             `json:"burst"`
		CeilingLimit  int             `json:"ceiling_limit"`
		CeilingWindow auditd.Duration `json:"ceiling_window"`
	}
	if json.Unmarshal([]byte(e.Detail), &d) != nil {
		return
	}
	if _, given := rc.bursts[s.id]; !given && d.Burst > 0 {
		s.burst = d.Burst
	}
	if d.CeilingLimit > 0 && d.CeilingWindow > 0 {
		s.ceil.limit, s.ceil.window = d.CeilingLimit, d.CeilingWindow.D()
	}
}

// refused takes a refused dispatch's records out of s's ceiling window; it
// stays counted as a request.
func (s *scope) refused(dispatchSeq uint64) {
	s.ceil.win.refund(dispatchSeq)
}

// window holds dispatch e of s to R9.
func (rc *recount) window(s *scope, e *auditd.Event) {
	c := &s.checks[8]
	t, cost := e.Time.UnixNano(), int64(auditd.DispatchCost(e))
	s.win.add(e.Seq, t, cost)
	s.ceil.costed = s.ceil.costed || cost != 1
	if s.ceil.limit > 0 {
		s.ceil.win.add(e.Seq, t, cost)
		s.ceil.win.expire(t - int64(s.ceil.window))
	}
	if !s.limited {
		c.actual++ // unchecked; the scope reports n/a
		return
	}
	// The limit in force counts requests: (t - window, t] holds no more
	// than limit+burst of them.
	s.win.expire(t - int64(s.window))
	n := s.win.requests()
	within := rc.control(s, e, n, n, int64(s.limit+s.burst), UnitRequests, s.limit, s.burst, s.window)
	if s.ceil.costed && s.ceil.limit > 0 {
		// The ceiling counts records, with no burst on top: the limiter
		// holds it strictly whatever its bucket's capacity.
		w := &s.ceil.win
		within = rc.control(s, e, w.records, w.requests(), int64(s.ceil.limit), UnitRecords, s.ceil.limit, 0, s.ceil.window) && within
	}
	if within {
		c.actual++
	} else {
		c.offend(e.Seq, rc.maxOffending)
	}
}

// control keeps as s's evidence the window with the smallest margin to its
// allowance, and reports whether n is within it.
func (rc *recount) control(s *scope, e *auditd.Event, n, requests, allowed int64, unit string, limit, burst int, window time.Duration) bool {
	if m := allowed - n; m < s.margin {
		s.margin = m
		s.control = ControlEvidence{
			SourceID: s.id, Peak: n, Unit: unit, Requests: requests, PeakSeq: e.Seq, PeakAt: e.Time.UTC(),
			Limit: limit, Burst: burst, Window: window,
		}
	}
	return n <= allowed
}
