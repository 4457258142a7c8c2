package reports

import (
	"cmp"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
)

// The recount's verdict: what it found settled into the report's checks
// (R1 to R10), with notes that name the first offenders.

// report closes the recount: it settles what only the end can tell
// (pending items, dispatches left without outcome, payloads and
// acknowledgements missing) and sums the scopes.
func (rc *recount) report(live *LiveCounters) *Report {
	most := rc.maxOffending
	rc.settleItems()
	rc.settleRequests()
	rc.checkStatus()

	// Sources and Control are arrays in the contract, empty before a run's
	// first request, never null.
	rep := &Report{RunID: rc.run.ID, Run: rc.run, Cached: rc.cached, Sources: []SourceReport{}, Control: []ControlEvidence{}}
	rep.Run.FirstSeq, rep.Run.LastSeq = rc.first, rc.last
	if rc.first != 0 {
		rep.Run.HeadAtEnd = hex.EncodeToString(rc.headAtEnd[:])
	}
	ids := make([]string, 0, len(rc.sources))
	for id := range rc.sources {
		ids = append(ids, id)
	}
	sort.Strings(ids)

	var totals [numChecks]tally
	var anyApplies [numChecks]bool
	var anyFails [numChecks]bool
	for _, id := range ids {
		s := rc.sources[id]
		rc.settle(s, live)
		rep.Counts.add(s.counts)
		scope := id
		if scope == "" {
			scope = "run"
		}
		s.checks[9].note = ackNote(s.unacked, s.undelivered, most)
		checks := make([]Check, numChecks)
		for i := range numChecks {
			checks[i] = s.checks[i].check(i, scope, most)
			if checks[i].Status != StatusNA {
				anyApplies[i] = true
				totals[i].expected += s.checks[i].expected
				totals[i].actual += s.checks[i].actual
				totals[i].offending = append(totals[i].offending, s.checks[i].offending...)
			}
			if checks[i].Status == StatusFail {
				anyFails[i] = true
			}
		}
		if id == "" {
			continue
		}
		sr := SourceReport{SourceID: id, Balanced: balanced(checks), Counts: s.counts, Checks: checks}
		rep.Sources = append(rep.Sources, sr)
		if s.limited {
			ce := s.control
			ce.Within = checks[8].Status != StatusFail
			rep.Control = append(rep.Control, ce)
		}
	}
	rep.Checks = make([]Check, numChecks)
	for i := range numChecks {
		t := totals[i]
		if i == 6 && live != nil {
			// R7 in total compares the total counters, not a sum of sources.
			t = rc.liveTally(live.Total, rep.Counts)
		} else if !anyApplies[i] {
			t.na = naTotal(i)
		}
		if note := rc.totalNote(i); note != "" && t.na == "" {
			t.note = note
		}
		c := t.check(i, "total", most)
		if anyFails[i] {
			c.Status, c.Pass = StatusFail, false
		}
		rep.Checks[i] = c
	}
	rep.Balanced = balanced(rep.Checks)
	return rep
}

// settleItems counts the items still pending (R1), and holds each item
// that succeeded to its staged payload (R6) and, when the run has
// acknowledgements, each delivered item to one (R10).
func (rc *recount) settleItems() {
	most := rc.maxOffending
	for i := range rc.items.n {
		it := rc.items.at(i)
		if !it.has(itemQueued) {
			continue
		}
		s := rc.scopes[it.src]
		switch {
		case !it.has(itemFinished):
			s.counts.Pending++
			s.checks[0].actual++
		case it.has(itemSucceeded):
			s.checks[5].expected++
			if !it.has(itemStaged) {
				s.checks[5].offend(it.seq, most)
			}
		}
		if it.has(itemDelivered) {
			s.checks[9].expected++
			if rc.hasAck && !it.has(itemAcked) {
				s.checks[9].offend(it.seq, most)
				s.unacked = append(s.unacked, keyAt{it.seq, string(rc.items.key(i))})
			}
		}
	}
}

// settleRequests counts the dispatches left without an outcome (R2): in
// flight while the run goes on, offending once it has finished.
func (rc *recount) settleRequests() {
	for k, req := range rc.reqs {
		if !req.outstanding {
			continue
		}
		s := rc.sources[""]
		if it := rc.items.at(k.item); it.has(itemQueued) {
			s = rc.scopes[it.src]
		}
		if rc.finished {
			s.checks[1].offend(req.dispatchSeq, rc.maxOffending)
			continue
		}
		s.counts.InFlight++
		s.checks[1].actual++
	}
}

// checkStatus holds run.finished's status to the items' ends (R1): a run
// ends only once every item has, succeeded only when none failed or was
// shed, partial only when one did. A disagreement fails R1 at run.finished.
func (rc *recount) checkStatus() {
	if !rc.finished {
		return
	}
	var pending, failed int64
	for _, s := range rc.sources {
		pending += s.counts.Pending
		failed += s.counts.Failed + s.counts.Shed
	}
	status := auditd.RunStatus(rc.run.Status)
	var notes []string
	if pending > 0 {
		notes = append(notes, fmt.Sprintf("the run ended %s with %d items that never ended", status, pending))
	}
	switch {
	case status == auditd.RunSucceeded && failed > 0:
		notes = append(notes, fmt.Sprintf("the run ended succeeded with %d items failed or shed", failed))
	case status == auditd.RunPartial && failed == 0 && pending == 0:
		notes = append(notes, "the run ended partial with no item failed or shed")
	case !status.Terminal():
		notes = append(notes, fmt.Sprintf("run.finished gives no terminal status (%q)", status))
	}
	if len(notes) > 0 {
		rc.statusNote = strings.Join(notes, "; ")
		c := &rc.source("").checks[0]
		c.offend(rc.finSeq, rc.maxOffending)
		c.note = rc.statusNote
	}
}

// settle fills the parts of a scope's checks known only at the end.
func (rc *recount) settle(s *scope, live *LiveCounters) {
	s.checks[3].actual = s.checks[3].expected - int64(len(s.violated))
	if !rc.hasAck {
		s.checks[9].na = "no acknowledgements recorded for the run"
	}
	if !s.limited {
		s.checks[8].na = "no limit in force recorded for the source"
	}
	s.checks[6].na = "no live counters given"
	if live != nil {
		s.checks[6].na = "live counters kept in total only"
	}
	if s.id == "" {
		for _, i := range []int{0, 1, 2, 3, 4, 5, 8, 9} {
			if s.checks[i].expected == 0 && s.checks[i].actual == 0 && len(s.checks[i].offending) == 0 {
				s.checks[i].na = "no events of this kind without a source"
			}
		}
	}
	if live != nil && live.Sources != nil && s.id != "" {
		c := live.Sources[s.id]
		s.checks[6] = rc.liveTally(c, s.counts)
	}
}

func naTotal(i int) string {
	switch i {
	case 6:
		return "no live counters given"
	case 8:
		return "no limit in force recorded for any source"
	case 9:
		return "no acknowledgements recorded for the run"
	}
	return "no events for this check"
}

func (rc *recount) totalNote(i int) string {
	switch i {
	case 0:
		return rc.statusNote
	case 5:
		if rc.payloads == nil {
			return "payload count checked; hashes not verified (no payload store given)"
		}
		var notes []string
		if rc.payloadErr != nil {
			notes = append(notes, "first payload error: "+rc.payloadErr.Error())
		}
		if rc.purged > 0 {
			notes = append(notes, fmt.Sprintf("%d payloads purged under retention: counted by their recorded hashes, not re-hashed", rc.purged))
		}
		return strings.Join(notes, "; ")
	case 7:
		return rc.chain.note
	case 9:
		var unacked, undelivered []keyAt
		for _, s := range rc.sources {
			unacked, undelivered = append(unacked, s.unacked...), append(undelivered, s.undelivered...)
		}
		return ackNote(unacked, undelivered, rc.maxOffending)
	}
	return ""
}

// ackNote names the items behind an R10 failure, the first most of each
// kind in ledger order, as its offending events are listed.
func ackNote(unacked, undelivered []keyAt, most int) string {
	var parts []string
	for _, k := range []struct {
		what string
		keys []keyAt
	}{{"not acknowledged", unacked}, {"acknowledged but not delivered", undelivered}} {
		if len(k.keys) == 0 {
			continue
		}
		keys := slices.SortedFunc(slices.Values(k.keys), func(a, b keyAt) int { return cmp.Compare(a.seq, b.seq) })
		names := make([]string, 0, min(len(keys), most))
		for _, x := range keys[:min(len(keys), most)] {
			names = append(names, strconv.Quote(x.key))
		}
		more := ""
		if len(keys) > most {
			more = fmt.Sprintf(" and %d more", len(keys)-most)
		}
		item := "item"
		if len(keys) > 1 {
			item = "items"
		}
		parts = append(parts, fmt.Sprintf("%s: %s %s%s", k.what, item, strings.Join(names, ", "), more))
	}
	return strings.Join(parts, "; ")
}

// counterPair is one live counter beside its recount.
type counterPair struct {
	name          string
	live, recount int64
}

func counterPairs(live *auditd.Counts, c *LedgerCounts) []counterPair {
	return []counterPair{
		{"queued", int64(live.Items), c.Queued},
		{"succeeded", int64(live.Succeeded), c.Succeeded},
		{"cached", int64(live.Cached), c.Cached},
		{"failed", int64(live.Failed), c.Failed},
		{"shed", int64(live.Shed), c.Shed},
		{"dispatches", int64(live.Dispatches), c.Dispatches},
		{"retries", int64(live.Retries), c.Retries},
		{"status_2xx", int64(live.Status2xx), c.Status2xx},
		{"status_429", int64(live.Status429), c.Status429},
		{"status_5xx", int64(live.Status5xx), c.Status5xx},
		{"status_other", int64(live.StatusOther), c.StatusOther},
		{"transport_errors", int64(live.TransportErrors), c.TransportErrors},
		{"interrupted", int64(live.Interrupted), c.Interrupted},
		{"waits", int64(live.Waits), c.Waits},
		{"breaker_opens", int64(live.BreakerOpens), c.BreakerOpens},
		{"staged", int64(live.Staged), c.Staged},
		{"acknowledged", int64(live.Acknowledged), c.Acknowledged},
	}
}

// liveTally is R7 in one scope: how many counters equal their recount, and
// a note naming those that do not.
func (rc *recount) liveTally(live auditd.Counts, c LedgerCounts) tally {
	var t tally
	var diffs []string
	for _, p := range counterPairs(&live, &c) {
		t.expected++
		if p.live == p.recount {
			t.actual++
			continue
		}
		diffs = append(diffs, fmt.Sprintf("%s live %d recount %d", p.name, p.live, p.recount))
	}
	t.note = strings.Join(diffs, "; ")
	return t
}

func (t tally) check(i int, scope string, most int) Check {
	c := Check{ID: checkIDs[i], Scope: scope, Description: checkDescriptions[i], Pass: true,
		Expected: t.expected, Actual: t.actual, Difference: t.actual - t.expected, Note: t.note}
	switch {
	case t.na != "":
		c.Status, c.Note = StatusNA, t.na
	case c.Difference != 0 || len(t.offending) > 0:
		c.Status, c.Pass = StatusFail, false
		c.Offending = firstSeqs(slices.Clone(t.offending), most)
	default:
		c.Status = StatusPass
	}
	return c
}

func balanced(checks []Check) bool {
	for _, c := range checks {
		if c.Status == StatusFail {
			return false
		}
	}
	return true
}
