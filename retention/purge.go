package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
	use, err := k.payloadUse(ctx)
	if err != nil {
		return nil, fmt.Errorf("purge: read the ledger: %w", err)
	}
	rep := &PurgeReport{Award: fain, DryRun: dryRun, Runs: []PurgedRun{}, Events: []uint64{}, Kept: []string{}}
	batches, err := k.planPurge(use, fain, now, rep)
	if err != nil {
		return nil, err
	}
	for _, b := range batches {
		rep.Runs = append(rep.Runs, PurgedRun{Award: b.award, Run: b.run, Payloads: len(b.sums), Bytes: b.bytes})
		rep.Payloads += len(b.sums)
		rep.Bytes += b.bytes
		if dryRun {
			continue
		}
		if err := k.deleteBatch(ctx, principal, b, use, rep); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// payloadUse is which runs use each staged payload and which award each
// run is of, as the ledger says.
type payloadUse struct {
	runAward map[string]string      // run id -> the award's FAIN
	refs     map[string]*payloadRef // payload hash -> its runs and size
}

// payloadRef is the runs that staged or were served one payload, and its
// size.
type payloadRef struct {
	runs  []string
	bytes int64
}

// payloadUse reads the ledger through k.through for the runs' awards and
// the payloads each run staged or was served from the cache.
func (k *Keeper) payloadUse(ctx context.Context) (payloadUse, error) {
	use := payloadUse{runAward: map[string]string{}, refs: map[string]*payloadRef{}}
	err := k.Ledger.Scan(1, k.through, func(e *auditd.Event) error {
		switch e.Type {
		case auditd.EventRunStarted:
			var d struct {
				Award auditd.Award `json:"award"`
			}
			if json.Unmarshal([]byte(e.Detail), &d) == nil && d.Award.FAIN != "" {
				use.runAward[e.RunID] = d.Award.FAIN
			}
		case auditd.EventPayloadStaged, auditd.EventCacheServed:
			if e.PayloadHash == "" || e.RunID == "" {
				return nil
			}
			r := use.refs[e.PayloadHash]
			if r == nil {
				r = &payloadRef{}
				use.refs[strings.Clone(e.PayloadHash)] = r
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
	return use, err
}

// purgeBatch is the payloads one run's purge deletes, credited to the
// first run (of an award asked for) that uses each.
type purgeBatch struct {
	award, run string
	sums       []string // payload hashes, sorted
	bytes      int64
}

// planPurge picks the payloads to purge, in batches by award and run in
// that order: each payload whose runs are all of awards that may be purged
// now (and, with fain, one of them of fain) and that is not purged
// already. It counts in rep the payloads it keeps because another run
// uses them (Shared) or finds purged (Already), and the awards kept, why.
func (k *Keeper) planPurge(use payloadUse, fain string, now time.Time, rep *PurgeReport) ([]purgeBatch, error) {
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
	batches := map[group]*purgeBatch{}
	for _, sum := range slices.Sorted(maps.Keys(use.refs)) {
		r := use.refs[sum]
		var g *group
		all := true
		for _, run := range r.runs {
			award := use.runAward[run]
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
		b := batches[*g]
		if b == nil {
			b = &purgeBatch{award: g.award, run: g.run}
			batches[*g] = b
		}
		b.sums = append(b.sums, sum)
		b.bytes += r.bytes
	}
	for _, err := range why {
		if err != nil {
			rep.Kept = append(rep.Kept, err.Error())
		}
	}
	slices.Sort(rep.Kept)
	out := make([]purgeBatch, 0, len(batches))
	for _, b := range batches {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b purgeBatch) int {
		if c := strings.Compare(a.award, b.award); c != 0 {
			return c
		}
		return strings.Compare(a.run, b.run)
	})
	return out, nil
}

// deleteBatch records b's payload hashes in payload.purged events of at
// most PurgeChunk each, and deletes each chunk once its event is durable.
func (k *Keeper) deleteBatch(ctx context.Context, principal string, b purgeBatch, use payloadUse, rep *PurgeReport) error {
	for chunk := range slices.Chunk(b.sums, PurgeChunk) {
		var bytes int64
		for _, sum := range chunk {
			bytes += use.refs[sum].bytes
		}
		e, err := k.record(ctx, auditd.Event{Type: auditd.EventPayloadPurged, Principal: principal, Reason: "retention", Bytes: bytes},
			detail{Award: b.award, Run: b.run, Payloads: chunk})
		if err != nil {
			return err
		}
		rep.Events = append(rep.Events, e.Seq)
		if err := k.Payloads.Purge(e.Seq, chunk); err != nil {
			return fmt.Errorf("purge run %s: %w", b.run, err)
		}
	}
	return nil
}
