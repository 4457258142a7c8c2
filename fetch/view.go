package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// RunView is a run as the API shows it: its record, live counts, and an
// estimate of when it will finish.
type RunView struct {
	auditd.Run
	Counts Counts `json:"counts"`
	// EstimatedFinish is computed from each source's learned limit and the
	// items still queued for it; zero once the run is finished.
	EstimatedFinish time.Time `json:"estimated_finish,omitzero"`
}

func (l *Loop) view(ar *activeRun) RunView {
	ar.mu.Lock()
	v := RunView{Run: ar.rec.Run, Counts: ar.rec.Counts.clone()}
	ar.mu.Unlock()
	v.EstimatedFinish = l.estimate(v)
	return v
}

// estimate: the slowest source decides. A source with n items left and a
// learned limit of L per W needs about n/L windows.
func (l *Loop) estimate(v RunView) time.Time {
	if v.Status.Terminal() {
		return time.Time{}
	}
	var longest time.Duration
	for id, p := range v.Counts.BySource {
		left := p.Items - p.Done
		if left <= 0 {
			continue
		}
		lim, err := l.cfg.Registry.Limits(id)
		if err != nil {
			continue
		}
		limit, window := lim.Pace()
		if limit <= 0 || window <= 0 {
			continue
		}
		d := time.Duration(math.Ceil(float64(left) / float64(limit) * float64(window)))
		longest = max(longest, d)
	}
	return l.cfg.Clock.Now().UTC().Add(longest).Truncate(time.Second)
}

// Run returns one run.
func (l *Loop) Run(id string) (RunView, error) {
	l.mu.Lock()
	ar := l.active[id]
	l.mu.Unlock()
	if ar != nil {
		return l.view(ar), nil
	}
	var rec *runRecord
	err := l.cfg.DB.View(func(tx *bolt.Tx) (err error) {
		rec, err = loadRun(tx, id)
		return err
	})
	if err != nil {
		return RunView{}, err
	}
	v := RunView{Run: rec.Run, Counts: rec.Counts}
	v.EstimatedFinish = l.estimate(v)
	return v, nil
}

// RunFilter selects runs for Runs. Zero fields match everything.
type RunFilter struct {
	Status auditd.RunStatus
	Source string
	FAIN   string
	From   time.Time // created at or after
	To     time.Time // created before
	After  string    // cursor: the id of the last run of the previous page
	Limit  int
}

// Runs lists runs, newest first, a page at a time. next is the cursor of the
// following page, "" when there is none.
func (l *Loop) Runs(f RunFilter) (runs []RunView, next string, err error) {
	if f.Limit <= 0 || f.Limit > 500 {
		f.Limit = 50
	}
	err = l.cfg.DB.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucketRuns).Cursor()
		k, v := c.Last()
		if f.After != "" {
			c.Seek([]byte(f.After))
			k, v = c.Prev()
		}
		for ; k != nil; k, v = c.Prev() {
			var rec runRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode run %s: %w", k, err)
			}
			if !f.matches(&rec) {
				continue
			}
			if len(runs) == f.Limit {
				next = runs[len(runs)-1].ID
				return nil
			}
			runs = append(runs, RunView{Run: rec.Run, Counts: rec.Counts})
		}
		return nil
	})
	for i := range runs {
		if live, err := l.Run(runs[i].ID); err == nil {
			runs[i] = live
		}
	}
	return runs, next, err
}

func (f *RunFilter) matches(r *runRecord) bool {
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

// ItemView is an item with how it ended (Result is nil while it is pending).
type ItemView struct {
	auditd.Item
	Result *ItemResult `json:"result,omitempty"`
}

// Items lists a run's items in submission order after the item whose key is
// after ("" for the start), a page at a time.
func (l *Loop) Items(runID, after string, limit int) (items []ItemView, next string, err error) {
	if limit <= 0 || limit > 1000 {
		limit = 100
	}
	ar := l.activeRun(runID)
	err = l.cfg.DB.View(func(tx *bolt.Tx) error {
		if _, err := loadRun(tx, runID); err != nil {
			return err
		}
		skipping := after != ""
		errStop := fmt.Errorf("stop")
		results := &resultReader{tx: tx, runID: runID}
		err := forEachItem(tx, runID, func(it *auditd.Item) error {
			if skipping {
				skipping = it.Key != after
				return nil
			}
			if len(items) == limit {
				next = items[len(items)-1].Key
				return errStop
			}
			res, err := itemResult(ar, results, it.Key)
			if err != nil {
				return err
			}
			items = append(items, ItemView{Item: *it, Result: res})
			return nil
		})
		if err == errStop {
			return nil
		}
		if err == nil && skipping {
			return &auditd.Error{Code: auditd.EINVALID, Field: "cursor", Message: "cursor names no item of this run"}
		}
		return err
	})
	return items, next, err
}

// Item returns one item of a run.
func (l *Loop) Item(runID, key string) (ItemView, error) {
	var v ItemView
	ar := l.activeRun(runID)
	err := l.cfg.DB.View(func(tx *bolt.Tx) error {
		it, err := loadItem(tx, runID, key)
		if err != nil {
			return err
		}
		res, err := itemResult(ar, &resultReader{tx: tx, runID: runID}, key)
		v = ItemView{Item: *it, Result: res}
		return err
	})
	return v, err
}

// activeRun returns the run id while the loop works on it, else nil.
// Wait returns the view of run id once it has ended (its end is stored),
// or ctx's error when ctx ends first. A run the loop is not working on is
// returned at once: one that ended, and one a shutdown left unfinished.
func (l *Loop) Wait(ctx context.Context, id string) (RunView, error) {
	if ar := l.activeRun(id); ar != nil {
		select {
		case <-ar.ended:
		case <-ctx.Done():
			return RunView{}, ctx.Err()
		}
	}
	return l.Run(id)
}

func (l *Loop) activeRun(id string) *activeRun {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.active[id]
}

// itemResult returns how an item ended (nil while it is pending): kept
// with its run while the run is active (ar), stored once the run has ended.
// A run that ends between the caller's look at the active set and the
// stored results' transaction has its results there.
func itemResult(ar *activeRun, stored *resultReader, key string) (*ItemResult, error) {
	if ar != nil {
		if res, ok := ar.result(key); ok {
			c := *res
			return &c, nil
		}
	}
	res, _, err := stored.result(key)
	return res, err
}

// Payload opens the staged payload an item ended with.
func (l *Loop) Payload(runID, key string) (io.ReadCloser, error) {
	v, err := l.Item(runID, key)
	if err != nil {
		return nil, err
	}
	if v.Result == nil || v.Result.PayloadHash == "" {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "item %q has no payload", key)
	}
	return l.cfg.Staging.Open(v.Result.PayloadHash)
}

// Acknowledge records that the downstream pipeline loaded the given items.
// Every key must name an item of the run that ended with a payload; nothing
// is recorded when one does not. Keys already acknowledged are skipped.
func (l *Loop) Acknowledge(ctx context.Context, runID string, keys []string, principal string) (int, error) {
	acked := map[string]bool{}
	if err := l.cfg.Ledger.ScanRun(runID, 0, func(e *auditd.Event) error {
		if e.Type == auditd.EventAcknowledged {
			acked[e.ItemKey] = true
		}
		return nil
	}); err != nil {
		return 0, err
	}
	var todo []ItemView
	for i, k := range keys {
		v, err := l.Item(runID, k)
		if err != nil {
			if auditd.ErrorCode(err) == auditd.ENOTFOUND {
				return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: auditd.ErrorMessage(err)}
			}
			return 0, err
		}
		if v.Result == nil || v.Result.PayloadHash == "" {
			return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: fmt.Sprintf("item %q delivered nothing to acknowledge", k)}
		}
		if !acked[k] {
			acked[k] = true
			todo = append(todo, v)
		}
	}
	for _, v := range todo {
		e := auditd.Event{Type: auditd.EventAcknowledged, RunID: runID, SourceID: v.SourceID, ItemKey: v.Key, Principal: principal, PayloadHash: v.Result.PayloadHash}
		l.mu.Lock()
		ar := l.active[runID]
		l.mu.Unlock()
		var err error
		if ar != nil {
			_, err = l.record(ctx, ar, e)
		} else {
			var got auditd.Event
			got, err = l.cfg.Ledger.Append(ctx, e)
			if err == nil {
				err = l.bumpAcknowledged(runID, got.Seq)
			}
		}
		if err != nil {
			return 0, err
		}
	}
	return len(todo), nil
}

// bumpAcknowledged counts an acknowledgement of a finished run, recorded at
// seq, in its stored record.
func (l *Loop) bumpAcknowledged(runID string, seq uint64) error {
	return l.cfg.DB.Update(func(tx *bolt.Tx) error {
		rec, err := loadRun(tx, runID)
		if err != nil {
			return err
		}
		rec.Counts.Acknowledged++
		rec.LastSeq = max(rec.LastSeq, seq)
		return saveRun(tx, rec)
	})
}

func sortedStrings(s []string) []string {
	sort.Strings(s)
	return s
}

// RunByIdempotencyKey returns the run submitted with req's idempotency key:
// ENOTFOUND when none was, ECONFLICT when the key was used for a run
// submitted with other contents (another name, award, item, deadline or
// replay setting). A key answers only a retry of the request that used it
// first; the same key for a different run would be answered with the wrong
// run otherwise.
func (l *Loop) RunByIdempotencyKey(req SubmitRequest) (RunView, error) {
	rec, err := l.idempotentRun(req.IdempotencyKey)
	if err != nil {
		return RunView{}, err
	}
	if rec == nil {
		return RunView{}, auditd.Errorf(auditd.ENOTFOUND, "no run was submitted with that idempotency key")
	}
	if rec.RequestHash != "" && rec.RequestHash != requestHash(req) {
		return RunView{}, auditd.Errorf(auditd.ECONFLICT,
			"The idempotency key was first used for run %s, submitted with other contents; use a new key for a new run.", rec.ID)
	}
	return l.Run(rec.ID)
}

// requestHash fingerprints what a submit asks for: the run's name, award,
// items (an item's method defaulting to GET), deadline and replay setting;
// not who asks, nor the key.
func requestHash(req SubmitRequest) string {
	items := slices.Clone(req.Items)
	for i := range items {
		items[i].Method = itemMethod(items[i].Method)
	}
	b, err := json.Marshal(struct {
		Name     string        `json:"name"`
		Award    auditd.Award  `json:"award"`
		Items    []auditd.Item `json:"items"`
		Deadline time.Time     `json:"deadline"`
		Replay   bool          `json:"replay"`
	}{req.Name, req.Award, items, req.Deadline.UTC(), req.Replay})
	if err != nil {
		panic(fmt.Sprintf("fingerprint a run request: %v", err)) // plain data: cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
