package retention

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
)

// Defaults.
const (
	// DefaultYears is how long after the final financial report an award's
	// records are kept when no other date is set (2 CFR 200.334).
	DefaultYears = 3

	// PurgeChunk is the most payload hashes one payload.purged event lists,
	// which keeps the event well under the ledger's event size.
	PurgeChunk = 10_000
)

// Errors.
var (
	// ErrHeld means the award is under a legal hold: nothing of it is
	// purged until every hold is released.
	ErrHeld = errors.New("award under legal hold")

	// ErrRetained means the award's retention date has not come.
	ErrRetained = errors.New("award still within its retention period")

	// ErrNoRetention means no retention date was set for the award: its
	// records are kept.
	ErrNoRetention = errors.New("award has no retention date")
)

// Ledger is what a Keeper needs of the ledger. *ledger.Ledger provides it.
type Ledger interface {
	auditd.Appender
	Scan(from, to uint64, fn func(*auditd.Event) error) error
	Event(seq uint64) (auditd.Event, error)
}

// Payloads is the payload store a Keeper purges from. *staging.Store
// provides it.
type Payloads interface {
	Purge(seq uint64, sums []string) error
	Purged(sum string) (seq uint64, ok bool, err error)
}

// Award is an award's retention as recorded.
type Award struct {
	FAIN        string    `json:"award"`
	FinalReport time.Time `json:"final_report"`
	RetainUntil time.Time `json:"retain_until"`
	Seq         uint64    `json:"seq"` // the retention.set event
}

// Hold is a legal hold on an award.
type Hold struct {
	ID            string    `json:"id"` // "h" and the seq of the hold.placed event
	Award         string    `json:"award"`
	Reason        string    `json:"reason"`
	PlacedBy      string    `json:"placed_by"`
	PlacedAt      time.Time `json:"placed_at"`
	ReleasedBy    string    `json:"released_by,omitempty"`
	ReleasedAt    time.Time `json:"released_at,omitzero"`
	ReleaseReason string    `json:"release_reason,omitempty"`
}

// Active reports whether the hold still stands.
func (h Hold) Active() bool { return h.ReleasedAt.IsZero() }

// Status is an award's retention and holds.
type Status struct {
	Award Award  `json:"retention"`
	Set   bool   `json:"set"` // a retention date was recorded
	Holds []Hold `json:"holds"`
	// Purgeable says whether a purge of the award would be allowed now.
	Purgeable bool `json:"purgeable"`
}

// detail is the Detail of the retention events.
type detail struct {
	Award       string   `json:"award"`
	FinalReport string   `json:"final_report,omitempty"`
	RetainUntil string   `json:"retain_until,omitempty"`
	Hold        string   `json:"hold,omitempty"`
	Run         string   `json:"run,omitempty"`
	Payloads    []string `json:"payloads,omitempty"`
}

// Keeper keeps retention dates and holds and purges payloads. It is safe
// for concurrent use.
type Keeper struct {
	// Ledger records every decision and is where state is read from.
	Ledger Ledger
	// Payloads is purged from; nil makes Purge refuse.
	Payloads Payloads
	// Clock says what day it is. Default: clock.Real{}.
	Clock clock.Clock

	mu      sync.Mutex
	through uint64              // retention events read up to this seq
	awards  map[string]Award    // by FAIN
	holds   map[string]*Hold    // by id
	events  map[string][]uint64 // award -> its retention events, in order
}

// New returns a Keeper recording in l and purging from p.
func New(l Ledger, p Payloads) *Keeper {
	return &Keeper{Ledger: l, Payloads: p, Clock: clock.Real{}}
}

func (k *Keeper) now() time.Time {
	if k.Clock == nil {
		return time.Now().UTC()
	}
	return k.Clock.Now().UTC()
}

// catchUp reads the retention events appended since the last call. The
// caller holds k.mu.
func (k *Keeper) catchUp() error {
	if k.awards == nil {
		k.awards, k.holds, k.events = map[string]Award{}, map[string]*Hold{}, map[string][]uint64{}
	}
	return k.Ledger.Scan(k.through+1, 0, func(e *auditd.Event) error {
		k.through = e.Seq
		if !e.Type.Retention() {
			return nil
		}
		var d detail
		if err := json.Unmarshal([]byte(e.Detail), &d); err != nil || d.Award == "" {
			return fmt.Errorf("retention event %d: detail %q: %v", e.Seq, e.Detail, err)
		}
		k.events[d.Award] = append(k.events[d.Award], e.Seq)
		switch e.Type {
		case auditd.EventRetentionSet:
			a := Award{FAIN: d.Award, Seq: e.Seq}
			a.FinalReport, _ = time.Parse(time.DateOnly, d.FinalReport)
			a.RetainUntil, _ = time.Parse(time.DateOnly, d.RetainUntil)
			k.awards[d.Award] = a
		case auditd.EventHoldPlaced:
			id := "h" + strconv.FormatUint(e.Seq, 10)
			k.holds[id] = &Hold{ID: id, Award: d.Award, Reason: e.Reason, PlacedBy: e.Principal, PlacedAt: e.Time.UTC()}
		case auditd.EventHoldReleased:
			if h := k.holds[d.Hold]; h != nil && h.Active() {
				h.ReleasedBy, h.ReleasedAt, h.ReleaseReason = e.Principal, e.Time.UTC(), e.Reason
			}
		}
		return nil
	})
}

func (k *Keeper) record(ctx context.Context, e auditd.Event, d detail) (auditd.Event, error) {
	b, err := json.Marshal(d)
	if err != nil {
		return auditd.Event{}, err
	}
	e.Detail = string(b)
	e, err = k.Ledger.Append(ctx, e)
	if err != nil {
		return auditd.Event{}, fmt.Errorf("record %s: %w", e.Type, err)
	}
	return e, k.catchUp()
}

func checkAward(fain string) error {
	if fain == "" || len(fain) > 64 || strings.TrimSpace(fain) != fain {
		return &auditd.Error{Code: auditd.EINVALID, Field: "award", Message: "award must be a FAIN of 1 to 64 characters."}
	}
	return nil
}

// SetRetention records the final financial report date of an award and
// its retention date: retainUntil, or DefaultYears after the report when
// retainUntil is zero. Dates are days (UTC). Setting it again replaces it.
func (k *Keeper) SetRetention(ctx context.Context, principal, fain string, finalReport, retainUntil time.Time) (Award, error) {
	if err := checkAward(fain); err != nil {
		return Award{}, err
	}
	if finalReport.IsZero() {
		return Award{}, &auditd.Error{Code: auditd.EINVALID, Field: "final_report", Message: "final_report is required: the date of the final financial report."}
	}
	day := func(t time.Time) time.Time {
		y, m, d := t.UTC().Date()
		return time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	}
	finalReport = day(finalReport)
	if retainUntil.IsZero() {
		retainUntil = finalReport.AddDate(DefaultYears, 0, 0)
	}
	retainUntil = day(retainUntil)
	if retainUntil.Before(finalReport) {
		return Award{}, &auditd.Error{Code: auditd.EINVALID, Field: "retain_until", Message: "retain_until must not be before final_report."}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e, err := k.record(ctx, auditd.Event{Type: auditd.EventRetentionSet, Principal: principal},
		detail{Award: fain, FinalReport: finalReport.Format(time.DateOnly), RetainUntil: retainUntil.Format(time.DateOnly)})
	if err != nil {
		return Award{}, err
	}
	return Award{FAIN: fain, FinalReport: finalReport, RetainUntil: retainUntil, Seq: e.Seq}, nil
}

// PlaceHold places a legal hold on an award; reason is required.
func (k *Keeper) PlaceHold(ctx context.Context, principal, fain, reason string) (Hold, error) {
	if err := checkAward(fain); err != nil {
		return Hold{}, err
	}
	if strings.TrimSpace(reason) == "" || len(reason) > 1000 {
		return Hold{}, &auditd.Error{Code: auditd.EINVALID, Field: "reason", Message: "reason is required (at most 1,000 characters): the litigation, claim, audit or notice."}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	e, err := k.record(ctx, auditd.Event{Type: auditd.EventHoldPlaced, Principal: principal, Reason: reason}, detail{Award: fain})
	if err != nil {
		return Hold{}, err
	}
	return *k.holds["h"+strconv.FormatUint(e.Seq, 10)], nil
}

// ReleaseHold releases hold id of an award; reason is required.
func (k *Keeper) ReleaseHold(ctx context.Context, principal, fain, id, reason string) (Hold, error) {
	if strings.TrimSpace(reason) == "" || len(reason) > 1000 {
		return Hold{}, &auditd.Error{Code: auditd.EINVALID, Field: "reason", Message: "reason is required (at most 1,000 characters)."}
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.catchUp(); err != nil {
		return Hold{}, err
	}
	h := k.holds[id]
	if h == nil || h.Award != fain {
		return Hold{}, auditd.Errorf(auditd.ENOTFOUND, "Award %s has no hold %s.", fain, id)
	}
	if !h.Active() {
		return Hold{}, auditd.Errorf(auditd.ECONFLICT, "Hold %s was released on %s by %s.", id, h.ReleasedAt.Format(time.DateOnly), h.ReleasedBy)
	}
	if _, err := k.record(ctx, auditd.Event{Type: auditd.EventHoldReleased, Principal: principal, Reason: reason}, detail{Award: fain, Hold: id}); err != nil {
		return Hold{}, err
	}
	return *k.holds[id], nil
}

// Status returns an award's retention and holds.
func (k *Keeper) Status(fain string) (Status, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err := k.catchUp(); err != nil {
		return Status{}, err
	}
	return k.status(fain), nil
}

func (k *Keeper) status(fain string) Status {
	a, set := k.awards[fain]
	st := Status{Award: a, Set: set, Holds: []Hold{}}
	if !set {
		st.Award.FAIN = fain
	}
	for _, h := range k.holds {
		if h.Award == fain {
			st.Holds = append(st.Holds, *h)
		}
	}
	sort.Slice(st.Holds, func(i, j int) bool {
		return st.Holds[i].PlacedAt.Before(st.Holds[j].PlacedAt) || st.Holds[i].ID < st.Holds[j].ID
	})
	st.Purgeable = k.eligible(fain, k.now()) == nil
	return st
}

// eligible says why an award's payloads may not be purged now, or nil.
func (k *Keeper) eligible(fain string, now time.Time) error {
	a, ok := k.awards[fain]
	if !ok {
		return fmt.Errorf("%w: %s (record its final report date first)", ErrNoRetention, fain)
	}
	for _, h := range k.holds {
		if h.Award == fain && h.Active() {
			return fmt.Errorf("%w: %s is held by %s since %s: %q", ErrHeld, fain, h.ID, h.PlacedAt.Format(time.DateOnly), h.Reason)
		}
	}
	if now.Before(a.RetainUntil) {
		return fmt.Errorf("%w: %s is retained until %s (final report %s)", ErrRetained, fain, a.RetainUntil.Format(time.DateOnly), a.FinalReport.Format(time.DateOnly))
	}
	return nil
}

// Events calls fn with the retention events of the awards, in sequence
// order: what the evidence workbook's Retention sheet shows.
func (k *Keeper) Events(awards []string, fn func(*auditd.Event) error) error {
	k.mu.Lock()
	if err := k.catchUp(); err != nil {
		k.mu.Unlock()
		return err
	}
	var seqs []uint64
	for _, a := range awards {
		seqs = append(seqs, k.events[a]...)
	}
	k.mu.Unlock()
	slices.Sort(seqs)
	seqs = slices.Compact(seqs)
	for _, seq := range seqs {
		e, err := k.Ledger.Event(seq)
		if err != nil {
			return err
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	return nil
}
