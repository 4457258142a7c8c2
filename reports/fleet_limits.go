package reports

import (
	"cmp"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/auditd/auditd"
)

// R9 over a fleet. Each node's R9 holds its own dispatches to the limits
// its registry records; the fleet shares one budget per source, so R9 of
// a fleet run also holds every node's dispatches together to the limit
// the fleet shares: no window (t - window, t] ending at a dispatch, over
// all nodes, holds more than the limit in force at t. It is the window
// check of the fleet pack's over-limit proof (package pack calls
// FleetWindows), on the same dispatches (a part's dispatch events) and the
// same limits (the sources' ceilings), so the two agree.

// FleetLimit is a limit in force on a source from From (Unix nanoseconds;
// 0 for always): at most Limit dispatches in any Window (nanoseconds).
type FleetLimit struct {
	Source string `json:"source"`
	Limit  int64  `json:"limit"`
	Window int64  `json:"window_nanos"`
	From   int64  `json:"from_unix_nano,omitempty"`
}

// LimitInForce returns the limit of ls (sorted by From) in force at t.
func LimitInForce(ls []FleetLimit, t int64) (FleetLimit, bool) {
	i := sort.Search(len(ls), func(i int) bool { return ls[i].From > t })
	if i == 0 {
		return FleetLimit{}, false
	}
	return ls[i-1], true
}

// FleetDispatch is one dispatch of a fleet run: its node, its time (Unix
// nanoseconds) and its event in the node's ledger.
type FleetDispatch struct {
	Node string
	At   int64
	Seq  uint64
}

// FleetOver is the first window of a source's dispatches over the limit.
type FleetOver struct {
	Source   string
	Count    int   // dispatches in the window
	From, To int64 // the first and the last of them
	Limit    FleetLimit
	Last     FleetDispatch // the one that passed the limit
	// Offending counts the dispatches that each ended a window over the
	// limit, this one's included.
	Offending int
}

func (o *FleetOver) String() string {
	return fmt.Sprintf("source %s: %d dispatches from %s to %s, over the limit %d per %v; the last is node %s's event %d (leaf %d)",
		o.Source, o.Count, stampNanos(o.From), stampNanos(o.To), o.Limit.Limit, time.Duration(o.Limit.Window), o.Last.Node, o.Last.Seq, o.Last.Seq-1)
}

func stampNanos(ns int64) string { return time.Unix(0, ns).UTC().Format(time.RFC3339Nano) }

// FleetWindows sorts ds, a source's dispatches over every node, by time
// and returns the first window that holds more than the limit of ls
// (sorted by From) in force at its last dispatch, with how many dispatches
// ended such a window; nil when none did.
func FleetWindows(src string, ds []FleetDispatch, ls []FleetLimit) *FleetOver {
	slices.SortFunc(ds, func(a, b FleetDispatch) int { return cmp.Compare(a.At, b.At) })
	var first *FleetOver
	for j, d := range ds {
		l, ok := LimitInForce(ls, d.At)
		if !ok {
			continue
		}
		i := sort.Search(j, func(i int) bool { return ds[i].At > d.At-l.Window })
		if int64(j-i+1) <= l.Limit {
			continue
		}
		if first == nil {
			first = &FleetOver{Source: src, Count: j - i + 1, From: ds[i].At, To: d.At, Limit: l, Last: d}
		}
		first.Offending++
	}
	return first
}

// SentScan tells, in events read in ledger order, which dispatches reached
// the upstream: every one but those a "not sent" dispatch.interrupted
// closes (auditd.NotSent: the node put the dispatch on record and then did
// not send it, its fleet slot or its client's deadline having passed).
// Those are left out of the fleet's limit checks; each node's own R9
// still counts them. Give See every dispatch the caller keeps and every
// event that closes one (an outcome, an interruption), in order; the
// dispatches are numbered from 0 in the order seen. It holds only the
// dispatches not yet closed.
type SentScan struct {
	open map[attemptKey]int
	n    int
	// NotSent are the numbers of the dispatches closed as not sent, in
	// increasing order.
	NotSent []int
}

// attemptKey names a dispatch: its run, item, page and attempt.
type attemptKey struct {
	run, item     string
	page, attempt uint32
}

// See takes the next event of the scan.
func (s *SentScan) See(e *auditd.Event) {
	k := attemptKey{e.RunID, e.ItemKey, e.Page, e.Attempt}
	switch e.Type {
	case auditd.EventDispatch:
		if s.open == nil {
			s.open = map[attemptKey]int{}
		}
		s.open[k] = s.n
		s.n++
	case auditd.EventResponse, auditd.EventThrottle, auditd.EventTransportError, auditd.EventInterrupted:
		i, ok := s.open[k]
		if !ok {
			return
		}
		delete(s.open, k)
		if auditd.NotSent(e) {
			s.NotSent = append(s.NotSent, i)
		}
	}
}

// Sent returns the items of ds, one per dispatch seen in order, that were
// sent: ds without those at NotSent, in ds's array.
func Sent[T any](ds []T, s *SentScan) []T {
	if len(s.NotSent) == 0 {
		return ds
	}
	out := ds[:0]
	j := 0
	for i, d := range ds {
		if j < len(s.NotSent) && s.NotSent[j] == i {
			j++
			continue
		}
		out = append(out, d)
	}
	return out
}

// PartDispatches are a node's dispatches of a fleet run on the sources the
// fleet limits, and those limits as the node holds them: what R9 over the
// fleet needs of the node.
type PartDispatches struct {
	Limits  []FleetLimit       `json:"limits"`
	Sources []SourceDispatches `json:"sources"`
}

// SourceDispatches are a node's dispatches on one source, in event order.
// In JSON: the source, their count, and "data", base64 of each dispatch's
// time and event as varints of their differences from the previous (the
// time's zigzag-signed), from 0.
type SourceDispatches struct {
	Source string
	At     []int64
	Seq    []uint64
}

type sourceDispatchesJSON struct {
	Source string `json:"source"`
	Count  int    `json:"count"`
	Data   string `json:"data"`
}

func (s SourceDispatches) MarshalJSON() ([]byte, error) {
	if len(s.At) != len(s.Seq) {
		return nil, errors.New("reports: dispatch times and events differ in number")
	}
	b := make([]byte, 0, 6*len(s.At))
	var at int64
	var seq uint64
	for i := range s.At {
		b = binary.AppendVarint(b, s.At[i]-at)
		b = binary.AppendUvarint(b, s.Seq[i]-seq)
		at, seq = s.At[i], s.Seq[i]
	}
	return json.Marshal(sourceDispatchesJSON{Source: s.Source, Count: len(s.At), Data: base64.StdEncoding.EncodeToString(b)})
}

func (s *SourceDispatches) UnmarshalJSON(raw []byte) error {
	var j sourceDispatchesJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return err
	}
	b, err := base64.StdEncoding.DecodeString(j.Data)
	if err != nil {
		return fmt.Errorf("dispatches of source %s: %w", j.Source, err)
	}
	if j.Count < 0 || j.Count > len(b) {
		return fmt.Errorf("dispatches of source %s: count %d for %d bytes", j.Source, j.Count, len(b))
	}
	out := SourceDispatches{Source: j.Source, At: make([]int64, 0, j.Count), Seq: make([]uint64, 0, j.Count)}
	var at int64
	var seq uint64
	for range j.Count {
		d, n := binary.Varint(b)
		if n <= 0 {
			return fmt.Errorf("dispatches of source %s: truncated", j.Source)
		}
		b = b[n:]
		ds, n := binary.Uvarint(b)
		if n <= 0 {
			return fmt.Errorf("dispatches of source %s: truncated", j.Source)
		}
		b = b[n:]
		at, seq = at+d, seq+ds
		out.At, out.Seq = append(out.At, at), append(out.Seq, seq)
	}
	if len(b) != 0 {
		return fmt.Errorf("dispatches of source %s: %d bytes past its %d dispatches", j.Source, len(b), j.Count)
	}
	*s = out
	return nil
}

// fleetR9 holds the parts' dispatches together to the limits the fleet
// shares (the strictest a node holds for each source) and folds the
// result into R9 of the total and of each source: a window over the limit
// fails R9, its dispatches that ended one leave actual, and the note names
// the first window and its last dispatch's node and event. It does
// nothing when no part carries its dispatches.
func fleetR9(r *FleetReport, parts []FleetPart) {
	limits := map[string]FleetLimit{}
	ds := map[string][]FleetDispatch{}
	carried := false
	for _, p := range parts {
		if p.Dispatches == nil {
			continue
		}
		carried = true
		for _, l := range p.Dispatches.Limits {
			if old, ok := limits[l.Source]; (!ok || l.Limit*old.Window < old.Limit*l.Window) && l.Limit > 0 && l.Window > 0 {
				limits[l.Source] = l
			}
		}
		for _, s := range p.Dispatches.Sources {
			for i := range s.At {
				ds[s.Source] = append(ds[s.Source], FleetDispatch{Node: p.Node, At: s.At[i], Seq: s.Seq[i]})
			}
		}
	}
	if !carried {
		return
	}
	for _, src := range slices.Sorted(maps.Keys(ds)) {
		l, ok := limits[src]
		if !ok {
			continue
		}
		over := FleetWindows(src, ds[src], []FleetLimit{l})
		if over == nil {
			continue
		}
		foldR9(r.Checks, over)
		for i := range r.Sources {
			if r.Sources[i].SourceID == src {
				foldR9(r.Sources[i].Checks, over)
				r.Sources[i].Balanced = allPass(r.Sources[i].Checks)
			}
		}
	}
	r.Balanced = allPass(r.Checks)
}

func foldR9(cs []Check, over *FleetOver) {
	for i := range cs {
		c := &cs[i]
		if c.ID != R9 {
			continue
		}
		c.Actual = max(0, c.Actual-int64(over.Offending))
		c.Difference = c.Actual - c.Expected
		c.Status, c.Pass = StatusFail, false
		note := fmt.Sprintf("over the fleet: %s; %d dispatches each ended a window over the limit the fleet shares", over, over.Offending)
		c.Note = strings.TrimPrefix(c.Note+"; "+note, "; ")
	}
}
