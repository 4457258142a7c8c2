package reports

import (
	"fmt"
	"slices"
	"strings"
)

// Fleet check identifiers, after R1 to R10 in a fleet run's report.
const (
	// F1: every node that took part of the run answered with its part.
	F1 = "F1"
	// F2: every part's events are covered by its node's checkpoint in the
	// fleet log of logs.
	F2 = "F2"
)

var fleetDescriptions = map[string]string{
	F1: "nodes holding a part of the fleet run (expected) = nodes whose part was reconciled (actual)",
	F2: "parts reconciled (expected) = parts whose last event is covered by the node's checkpoint in the fleet log (actual)",
}

// FleetPart is one node's part of a fleet run: its reconciliation, or why
// there is none, and how far the node's checkpoint in the fleet log
// covers its ledger.
type FleetPart struct {
	Node   string  `json:"node"`
	Report *Report `json:"report,omitempty"`
	// Error says why the part could not be reconciled (the node is down,
	// say); Report is nil then.
	Error string `json:"error,omitempty"`
	// Logged is the size of the node's last checkpoint the fleet log
	// accepted (0: none), FleetLeaf the fleet log leaf that holds it.
	Logged    uint64 `json:"logged_size"`
	FleetLeaf uint64 `json:"fleet_leaf"`
	// Dispatches are the part's dispatches on the sources the fleet
	// limits, for R9 over the fleet (fleet_limits.go); nil leaves R9 the
	// sum of the nodes'.
	Dispatches *PartDispatches `json:"dispatches,omitempty"`
}

// covered reports whether the part's events are in the node's logged tree.
func (p *FleetPart) covered() bool {
	return p.Report != nil && p.Logged > 0 && max(p.Report.Run.LastSeq, p.Report.Run.FirstSeq) <= p.Logged
}

// FleetReport is the reconciliation of a fleet run: the nodes' parts
// summed as one population, R1 to R10 holding over the sum only if they
// hold on every node (R9 also over every node's dispatches together, when
// the parts carry them), and F1 and F2 over the parts.
type FleetReport struct {
	RunID    string `json:"run_id"`
	Balanced bool   `json:"balanced"`
	// Status is the fleet run's: "succeeded" when every part did, else
	// the first other status of a part, in node order ("missing" when a
	// part could not be had).
	Status  string         `json:"status"`
	Counts  LedgerCounts   `json:"counts"`
	Checks  []Check        `json:"checks"`
	Sources []SourceReport `json:"sources"`
	Parts   []FleetPart    `json:"parts"`
}

// Missing returns the nodes whose part could not be had.
func (r *FleetReport) Missing() []string {
	var nodes []string
	for _, p := range r.Parts {
		if p.Report == nil {
			nodes = append(nodes, p.Node)
		}
	}
	return nodes
}

// Failed returns the ids of the checks that failed in total.
func (r *FleetReport) Failed() []string {
	var ids []string
	for _, c := range r.Checks {
		if c.Status == StatusFail {
			ids = append(ids, c.ID)
		}
	}
	return ids
}

// CombineFleet sums the parts of the fleet run runID, in node order. A
// check of a scope fails when it fails on any node (its note names the
// nodes and their offending events: sequence numbers are per node), and
// does not apply when it applies on none.
func CombineFleet(runID string, parts []FleetPart) *FleetReport {
	parts = slices.Clone(parts)
	slices.SortFunc(parts, func(a, b FleetPart) int { return strings.Compare(a.Node, b.Node) })
	if parts == nil {
		parts = []FleetPart{}
	}
	r := &FleetReport{RunID: runID, Status: "succeeded", Parts: parts, Sources: []SourceReport{}}
	total := newCheckSum()
	sources := map[string]*SourceReport{}
	srcChecks := map[string]*checkSum{}
	var reconciled, covered int64
	var missing, uncovered []string
	for _, p := range parts {
		if p.Report == nil {
			missing = append(missing, p.Node)
			if r.Status == "succeeded" {
				r.Status = "missing"
			}
			continue
		}
		reconciled++
		if p.covered() {
			covered++
		} else {
			uncovered = append(uncovered, fmt.Sprintf("%s (events to %d, logged %d)", p.Node, p.Report.Run.LastSeq, p.Logged))
		}
		if p.Report.Run.Status != "succeeded" && r.Status == "succeeded" {
			r.Status = p.Report.Run.Status
		}
		r.Counts.add(p.Report.Counts)
		total.add(p.Node, p.Report.Checks)
		for _, s := range p.Report.Sources {
			sr := sources[s.SourceID]
			if sr == nil {
				sr = &SourceReport{SourceID: s.SourceID}
				sources[s.SourceID], srcChecks[s.SourceID] = sr, newCheckSum()
			}
			sr.Counts.add(s.Counts)
			srcChecks[s.SourceID].add(p.Node, s.Checks)
		}
	}
	r.Checks = total.checks()
	r.Checks = append(r.Checks,
		fleetCheck(F1, int64(len(parts)), reconciled, "no part from "+strings.Join(missing, ", ")),
		fleetCheck(F2, reconciled, covered, "not covered: "+strings.Join(uncovered, ", ")))
	r.Balanced = allPass(r.Checks)
	ids := make([]string, 0, len(sources))
	for id := range sources {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		sr := sources[id]
		sr.Checks = srcChecks[id].checks()
		sr.Balanced = allPass(sr.Checks)
		r.Sources = append(r.Sources, *sr)
	}
	fleetR9(r, parts)
	for i := range r.Parts {
		r.Parts[i].Dispatches = nil // read; the report need not repeat them
	}
	return r
}

func allPass(cs []Check) bool {
	for _, c := range cs {
		if !c.Pass {
			return false
		}
	}
	return true
}

func fleetCheck(id string, expected, actual int64, failNote string) Check {
	c := Check{ID: id, Scope: "total", Description: fleetDescriptions[id], Expected: expected, Actual: actual,
		Difference: actual - expected, Status: StatusPass, Pass: true}
	if actual != expected {
		c.Status, c.Pass, c.Note = StatusFail, false, failNote
	}
	return c
}

// checkSum adds up one scope's checks over the nodes, in check order.
type checkSum struct {
	order   []string
	byID    map[string]*Check
	notes   map[string][]string    // failures, a note per node
	naNotes map[string][][2]string // why it does not apply: node and note
}

func newCheckSum() *checkSum {
	return &checkSum{byID: map[string]*Check{}, notes: map[string][]string{}, naNotes: map[string][][2]string{}}
}

func (s *checkSum) add(node string, cs []Check) {
	for _, c := range cs {
		sum := s.byID[c.ID]
		if sum == nil {
			sum = &Check{ID: c.ID, Scope: c.Scope, Description: c.Description, Status: StatusNA, Pass: true}
			s.byID[c.ID] = sum
			s.order = append(s.order, c.ID)
		}
		sum.Expected += c.Expected
		sum.Actual += c.Actual
		sum.Difference += c.Difference
		switch {
		case c.Status == StatusFail:
			sum.Status, sum.Pass = StatusFail, false
			s.notes[c.ID] = append(s.notes[c.ID], failedOn(node, c))
		case c.Status == StatusPass && sum.Status == StatusNA:
			sum.Status = StatusPass
		case c.Status == StatusNA && c.Note != "":
			s.naNotes[c.ID] = append(s.naNotes[c.ID], [2]string{node, c.Note})
		}
	}
}

func failedOn(node string, c Check) string {
	msg := fmt.Sprintf("failed on node %s (expected %d, actual %d)", node, c.Expected, c.Actual)
	if len(c.Offending) > 0 {
		seqs := make([]string, len(c.Offending))
		for i, s := range c.Offending {
			seqs[i] = fmt.Sprint(s)
		}
		msg += ", its offending events " + strings.Join(seqs, ", ")
	}
	if c.Note != "" {
		msg += ": " + c.Note
	}
	return msg
}

func (s *checkSum) checks() []Check {
	out := make([]Check, 0, len(s.order))
	for _, id := range s.order {
		c := *s.byID[id]
		c.Note = strings.Join(append(s.notes[id], naNote(s.naNotes[id])...), "; ")
		out = append(out, c)
	}
	return out
}

// naNote says once each reason a check does not apply, with its nodes:
// "no acknowledgements recorded for the run (nodes a, b)".
func naNote(notes [][2]string) []string {
	var order []string
	nodes := map[string][]string{}
	for _, nn := range notes {
		if nodes[nn[1]] == nil {
			order = append(order, nn[1])
		}
		nodes[nn[1]] = append(nodes[nn[1]], nn[0])
	}
	out := make([]string, len(order))
	for i, note := range order {
		out[i] = fmt.Sprintf("%s (node %s)", note, strings.Join(nodes[note], ", "))
	}
	return out
}
