package runs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// Run returns one run: its live view while the fetch loop works on it, its
// stored record otherwise; ENOTFOUND when there is none.
func (s *Store) Run(_ context.Context, id string) (auditd.RunView, error) {
	if r := s.tracked(id); r != nil {
		return s.liveView(r), nil
	}
	var rec *record
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		rec, err = loadRun(tx, id)
		return err
	})
	if err != nil {
		return auditd.RunView{}, err
	}
	return s.view(*rec), nil
}

func (s *Store) view(rec record) auditd.RunView {
	v := auditd.RunView{Run: rec.Run, Counts: rec.Counts}
	v.EstimatedFinish = s.estimate(&v)
	return v
}

// liveView is the view of a run the loop is working on: paused while the
// ledger cannot write its records.
func (s *Store) liveView(r *Live) auditd.RunView {
	v := s.view(r.record())
	if s.stalled != nil && !v.Status.Terminal() {
		if since, err := s.stalled(); err != nil {
			v.Paused = &auditd.Pause{Since: since.UTC(), Reason: "the ledger cannot write its records: " + err.Error()}
		}
	}
	return v
}

// estimate: the slowest source decides. A source with n items left and a
// pace of L per W needs about n/L windows.
func (s *Store) estimate(v *auditd.RunView) time.Time {
	if v.Status.Terminal() || s.pace == nil {
		return time.Time{}
	}
	var longest time.Duration
	for id, p := range v.Counts.BySource {
		left := p.Items - p.Done
		if left <= 0 {
			continue
		}
		limit, window, err := s.pace(id)
		if err != nil || limit <= 0 || window <= 0 {
			continue
		}
		d := time.Duration(math.Ceil(float64(left) / float64(limit) * float64(window)))
		longest = max(longest, d)
	}
	return s.clock.Now().UTC().Add(longest).Truncate(time.Second)
}

// Runs lists runs matching f, newest first, a page of up to f.Limit (50 by
// default, at most 500) at a time. next is the cursor of the following
// page, "" when there is none.
func (s *Store) Runs(ctx context.Context, f auditd.RunFilter) (runs []auditd.RunView, next string, err error) {
	if f.Limit <= 0 || f.Limit > 500 {
		f.Limit = 50
	}
	err = s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRuns).Cursor()
		k, v := c.Last()
		if f.After != "" {
			c.Seek([]byte(f.After))
			k, v = c.Prev()
		}
		for ; k != nil; k, v = c.Prev() {
			rec, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			if !matches(&f, rec) {
				continue
			}
			if len(runs) == f.Limit {
				next = runs[len(runs)-1].ID
				return nil
			}
			runs = append(runs, auditd.RunView{Run: rec.Run, Counts: rec.Counts})
		}
		return nil
	})
	for i := range runs {
		if live, err := s.Run(ctx, runs[i].ID); err == nil {
			runs[i] = live
		}
	}
	return runs, next, err
}

func matches(f *auditd.RunFilter, r *record) bool {
	switch {
	case f.Status != "" && r.Status != f.Status:
		return false
	case f.FAIN != "" && r.Award.FAIN != f.FAIN:
		return false
	case !f.From.IsZero() && r.CreatedAt.Before(f.From):
		return false
	case !f.To.IsZero() && !r.CreatedAt.Before(f.To):
		return false
	case f.Source != "":
		_, ok := r.Counts.BySource[f.Source]
		return ok
	}
	return true
}

// errStop ends a scan early.
var errStop = errors.New("stop")

// Items lists a run's items in submission order after the item whose key is
// after ("" for the start), a page of up to limit (100 by default, at most
// 1,000) at a time. An after that names no item of the run is EINVALID
// with Field "cursor". A page costs the same wherever it is in the run:
// the cursor is looked up, not scanned for. A proxy-mode run's item is
// listed once its item.queued is stored.
func (s *Store) Items(_ context.Context, runID, after string, limit int) (items []auditd.ItemView, next string, err error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	badCursor := &auditd.Error{Code: auditd.EINVALID, Field: "cursor", Message: "cursor names no item of this run"}
	err = s.db.View(func(tx *bolt.Tx) error {
		if _, err := loadRun(tx, runID); err != nil {
			return err
		}
		results := &resultReader{tx: tx, runID: runID}
		add := func(it *auditd.Item) error {
			if len(items) == limit {
				next = items[len(items)-1].Key
				return errStop
			}
			res, _, err := results.result(it.Key)
			if err != nil {
				return err
			}
			items = append(items, auditd.ItemView{Item: *it, Result: res})
			return nil
		}
		if hasPages(tx, runID) {
			hiddenFrom, hiding := s.hidden(runID)
			from := uint32(0)
			if after != "" {
				idx, ok := pagedIndex(tx, runID, after)
				if !ok || hiding && idx >= hiddenFrom {
					return badCursor
				}
				from = idx + 1
			}
			return scanPages(tx, runID, from, func(idx uint32, it *auditd.Item) error {
				if hiding && idx >= hiddenFrom {
					return errStop // a pending page: not the run's yet
				}
				return add(it)
			})
		}
		skipping := after != ""
		err := forEachItem(tx, runID, func(it *auditd.Item) error {
			if skipping {
				skipping = it.Key != after
				return nil
			}
			return add(it)
		})
		if errors.Is(err, errStop) {
			return nil
		}
		if err == nil && skipping {
			return badCursor
		}
		return err
	})
	return items, next, err
}

// Item returns one item of a run; ENOTFOUND when the run or the key is
// unknown.
func (s *Store) Item(_ context.Context, runID, key string) (auditd.ItemView, error) {
	var v auditd.ItemView
	if live := s.tracked(runID); live != nil {
		if p, ok := live.pendingItem(key); ok {
			return auditd.ItemView{Item: p.it}, nil
		}
	}
	err := s.db.View(func(tx *bolt.Tx) error {
		if from, hiding := s.hidden(runID); hiding {
			if idx, ok := pagedIndex(tx, runID, key); ok && idx >= from {
				return auditd.Errorf(auditd.ENOTFOUND, "item %q not found in run %q", key, runID)
			}
		}
		it, err := loadItem(tx, runID, key)
		if err != nil {
			return err
		}
		res, _, err := (&resultReader{tx: tx, runID: runID}).result(key)
		v = auditd.ItemView{Item: *it, Result: res}
		return err
	})
	return v, err
}

// Payload opens the staged payload an item ended with; ENOTFOUND when it
// has none.
func (s *Store) Payload(ctx context.Context, runID, key string) (io.ReadCloser, error) {
	v, err := s.Item(ctx, runID, key)
	if err != nil {
		return nil, err
	}
	if v.Result == nil || v.Result.PayloadHash == "" {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "item %q has no payload", key)
	}
	return s.payloads.Open(v.Result.PayloadHash)
}

// RunByIdempotencyKey returns the run submitted with nr's idempotency key:
// ENOTFOUND when none was, ECONFLICT when the key was used for a run
// submitted with other contents (another name, award, item, deadline or
// replay setting). A key answers only a retry of the request that used it
// first; the same key for a different run would be answered with the wrong
// run otherwise.
func (s *Store) RunByIdempotencyKey(ctx context.Context, nr auditd.NewRun) (auditd.RunView, error) {
	var rec *record
	err := s.db.View(func(tx *bolt.Tx) (err error) {
		if id := tx.Bucket(bucketIdem).Get([]byte(nr.IdempotencyKey)); id != nil {
			rec, err = loadRun(tx, string(id))
		}
		return err
	})
	if err != nil {
		return auditd.RunView{}, err
	}
	if rec == nil {
		return auditd.RunView{}, auditd.Errorf(auditd.ENOTFOUND, "no run was submitted with that idempotency key")
	}
	if rec.RequestHash != "" && rec.RequestHash != requestHash(nr) {
		return auditd.RunView{}, auditd.Errorf(auditd.ECONFLICT,
			"The idempotency key was first used for run %s, submitted with other contents; use a new key for a new run.", rec.ID)
	}
	return s.Run(ctx, rec.ID)
}

// requestHash fingerprints what a submit asks for: the run's name, award,
// items (an item's method defaulting to GET), deadline and replay setting;
// not who asks, nor the key.
func requestHash(nr auditd.NewRun) string {
	items := slices.Clone(nr.Items)
	for i := range items {
		if items[i].Method == "" {
			items[i].Method = http.MethodGet
		}
	}
	b, err := json.Marshal(struct {
		Name     string        `json:"name"`
		Award    auditd.Award  `json:"award"`
		Items    []auditd.Item `json:"items"`
		Deadline time.Time     `json:"deadline"`
		Replay   bool          `json:"replay"`
		// Batch runs leave these out: their keys keep the hashes they had.
		Mode        auditd.RunMode `json:"mode,omitempty"`
		IdleTimeout time.Duration  `json:"idle_timeout,omitempty"`
		Open        bool           `json:"open,omitempty"`
	}{nr.Name, nr.Award, items, nr.Deadline.UTC(), nr.Replay, nr.Mode, nr.IdleTimeout, nr.Open})
	if err != nil {
		panic(fmt.Sprintf("fingerprint a run request: %v", err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
