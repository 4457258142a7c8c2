package reports

import (
	"errors"
	"fmt"
	"strings"

	"github.com/auditd/auditd"
)

// runRange returns the sequence numbers of a run's first and last events
// (0, 0 when it has none) with a handful of index probes instead of a read
// of the whole run: the last event is found by galloping, then bisecting,
// over "does the run have an event after x". Access events (views and
// exports of the run's reports) do not count: the range of a finished run
// ends with run.finished, or its last acknowledgement, however often it is
// read since. A probe reads past the access events it meets, so the cost
// grows with the reads recorded after the run's last event.
func runRange(r auditd.EventReader, runID string) (first, last uint64, err error) {
	// next returns the run's first seq after x that is no access event, or 0.
	next := func(x uint64) (uint64, error) {
		var seq uint64
		err := r.ScanRun(runID, x, func(e *auditd.Event) error {
			if e.Type.Access() {
				return nil
			}
			seq = e.Seq
			return errStop
		})
		if err != nil && !errors.Is(err, errStop) {
			return 0, err
		}
		return seq, nil
	}
	if first, err = next(0); err != nil || first == 0 {
		return 0, 0, err
	}
	// Invariant: the run has an event > lo; none > hi once hi is found.
	lo, hi := first-1, first
	for step := uint64(1); ; step *= 2 {
		s, err := next(hi)
		if err != nil {
			return 0, 0, err
		}
		if s == 0 {
			break
		}
		lo = s - 1 // s exists, so an event > s-1 does
		if hi = s + step; hi < s {
			hi = ^uint64(0) // overflow: nothing lies beyond
		}
	}
	for hi-lo > 1 {
		mid := lo + (hi-lo)/2
		s, err := next(mid)
		if err != nil {
			return 0, 0, err
		}
		if s == 0 {
			hi = mid
		} else {
			lo = s - 1 // s > mid, so this moves lo up
		}
	}
	return first, hi, nil
}

// chainCheck is R8 over the ledger range a run spans: sequence numbers
// follow one another from the run's first event to its last, every event
// links to the hash before it (the event before the range anchors the
// first) and, with a hash function, every hash recomputes. Events of other
// runs and service-wide events in the range count in total only.
type chainCheck struct {
	runID    string
	first    uint64
	hash     HashFunc
	prevSeq  uint64
	prevHash [32]byte
	endSeq   uint64
	note     string
}

// observe checks one event of the range; anchors (before first) only set
// the previous hash.
func (c *chainCheck) observe(rc *recount, e *auditd.Event) {
	if e.Seq < c.first {
		c.prevSeq, c.prevHash = e.Seq, e.Hash
		return
	}
	s := rc.source("")
	if e.RunID == c.runID {
		s = rc.source(e.SourceID)
	}
	t := &s.checks[7]
	t.expected++
	ok := e.PrevHash == c.prevHash && (c.prevSeq == 0 && e.Seq == c.first || e.Seq == c.prevSeq+1)
	if ok && c.hash != nil {
		ok = c.hash(e.PrevHash, e) == e.Hash
	}
	if ok {
		t.actual++
	} else {
		t.offend(e.Seq, rc.maxOffending)
	}
	c.prevSeq, c.prevHash, c.endSeq = e.Seq, e.Hash, e.Seq
}

// settle notes what the range scan could not match.
func (c *chainCheck) settle(rc *recount, last uint64) {
	var notes []string
	if c.endSeq != last {
		notes = append(notes, fmt.Sprintf("range scan ended at seq %d, run ends at %d", c.endSeq, last))
		rc.source("").checks[7].offend(last, rc.maxOffending)
	}
	if c.hash == nil {
		notes = append(notes, "links checked; hashes not recomputed (no hash function given)")
	}
	c.note = strings.Join(notes, "; ")
}
