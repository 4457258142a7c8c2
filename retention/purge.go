package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/auditd/auditd"
)

// PurgeReport is what a purge did (or, for a dry run, would do).
type PurgeReport struct {
	Award    string      `json:"award,omitempty"` // "" when every eligible award was purged
	DryRun   bool        `json:"dry_run"`
	Runs     []PurgedRun `json:"runs"`
	Payloads int         `json:"payloads"`
	Bytes    int64       `json:"bytes"`
	Events   []uint64    `json:"events"`  // the payload.purged events recorded
	Kept     []string    `json:"kept"`    // awards whose payloads were kept, and why
	Shared   int         `json:"shared"`  // payloads kept because a run of a kept award (or of none) uses them too
	Already  int         `json:"already"` // payloads purged before
}

// PurgedRun is the payloads purged of one run.
type PurgedRun struct {
	Award    string `json:"award"`
	Run      string `json:"run"`
	Payloads int    `json:"payloads"`
	Bytes    int64  `json:"bytes"`
}

// Purge deletes the staged payloads whose retention has passed, recording
// each run's purged payload hashes in payload.purged events before they
// are deleted. fain narrows it to one award: refused with ErrHeld,
// ErrRetained or ErrNoRetention (recording nothing) when that award may
// not be purged now; "" purges every award that may be, and reports the
// others in Kept. dryRun records and deletes nothing.
func (k *Keeper) Purge(ctx context.Context, principal, fain string, dryRun bool) (*PurgeReport, error) {
	if k.Payloads == nil {
		return nil, errors.New("purge: no payload store")
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.catchUp(); err != nil {
		return nil, err
	}
	now := k.now()
	if fain != "" {
		if err := checkAward(fain); err != nil {
			return nil, err
		}
		if err := k.eligible(fain, now); err != nil {
			return nil, err
		}
	}

	// Which runs use which payloads, and which award each run is of.
	runAward := map[string]string{}
	type ref struct {
		runs  []string
		bytes int64
	}
	refs := map[string]*ref{}
	err := k.Ledger.Scan(1, k.through, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventRunStarted:
			var d struct {
				Award auditd.Award `json:"award"`
			}
			if json.Unmarshal([]byte(e.Detail), &d) == nil && d.Award.FAIN != "" {
				runAward[e.RunID] = d.Award.FAIN
			}
		case auditd.EventPayloadStaged, auditd.EventCacheServed:
			if e.PayloadHash == "" || e.RunID == "" {
				return nil
			}
			r := refs[e.PayloadHash]
			if r == nil {
				r = &ref{}
				refs[strings.Clone(e.PayloadHash)] = r
			}
			if !slices.Contains(r.runs, e.RunID) {
				r.runs = append(r.runs, strings.Clone(e.RunID))
			}
			if e.Type == auditd.EventPayloadStaged {
				r.bytes = max(r.bytes, e.Bytes)
			}
		}
		return ctx.Err()
	})
	if err != nil {
		return nil, fmt.Errorf("purge: read the ledger: %w", err)
	}

	rep := &PurgeReport{Award: fain, DryRun: dryRun, Runs: []PurgedRun{}, Events: []uint64{}, Kept: []string{}}
	why := map[string]error{}
	ok := func(award string) bool {
		if award == "" {
			return false
		}
		if _, seen := why[award]; !seen {
			why[award] = k.eligible(award, now)
		}
		return why[award] == nil
	}
	type group struct{ award, run string }
	groups := map[group][]string{}
	sizes := map[group]int64{}
	sums := make([]string, 0, len(refs))
	for sum := range refs {
		sums = append(sums, sum)
	}
	slices.Sort(sums)
	for _, sum := range sums {
		r := refs[sum]
		var g *group
		all := true
		for _, run := range r.runs {
			award := runAward[run]
			if !ok(award) {
				all = false
				continue
			}
			if g == nil && (fain == "" || award == fain) {
				g = &group{award, run}
			}
		}
		if g == nil {
			continue // not of the award asked for, or of no award that may be purged
		}
		if !all {
			rep.Shared++
			continue
		}
		if _, purged, err := k.Payloads.Purged(sum); err != nil {
			return nil, err
		} else if purged {
			rep.Already++
			continue
		}
		groups[*g] = append(groups[*g], sum)
		sizes[*g] += r.bytes
	}
	for _, err := range why {
		if err != nil {
			rep.Kept = append(rep.Kept, err.Error())
		}
	}
	slices.Sort(rep.Kept)

	keys := make([]group, 0, len(groups))
	for g := range groups {
		keys = append(keys, g)
	}
	slices.SortFunc(keys, func(a, b group) int {
		if c := strings.Compare(a.award, b.award); c != 0 {
			return c
		}
		return strings.Compare(a.run, b.run)
	})
	for _, g := range keys {
		list := groups[g]
		rep.Runs = append(rep.Runs, PurgedRun{Award: g.award, Run: g.run, Payloads: len(list), Bytes: sizes[g]})
		rep.Payloads += len(list)
		rep.Bytes += sizes[g]
		if dryRun {
			continue
		}
		for chunk := range slices.Chunk(list, PurgeChunk) {
			var bytes int64
			for _, sum := range chunk {
				bytes += refs[sum].bytes
			}
			e, err := k.record(ctx, auditd.Event{Type: auditd.EventPayloadPurged, Principal: principal, Reason: "retention", Bytes: bytes},
				detail{Award: g.award, Run: g.run, Payloads: chunk})
			if err != nil {
				return rep, err
			}
			rep.Events = append(rep.Events, e.Seq)
			if err := k.Payloads.Purge(e.Seq, chunk); err != nil {
				return rep, fmt.Errorf("purge run %s: %w", g.run, err)
			}
		}
	}
	return rep, nil
}
