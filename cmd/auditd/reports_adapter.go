package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
)

// reportsAPI serves reconciliations and evidence workbooks from the live
// ledger, with the fetch loop's live counters for R7 and the staging store
// to re-hash payloads for R6. Evidence exports are admission-controlled.
type reportsAPI struct {
	led       *ledger.Ledger
	runs      *runs.Store
	stage     *staging.Store
	admission *reports.Admission
	cache     *reconcileCache
}

func newReportsAPI(led *ledger.Ledger, store *runs.Store, stage *staging.Store) reportsAPI {
	return reportsAPI{led: led, runs: store, stage: stage, admission: reports.NewAdmission(), cache: newReconcileCache()}
}

// reconcileCacheSize bounds how many finished runs' reconciliations are kept.
const reconcileCacheSize = 256

// reconcileCache keeps the reconciliation of finished runs: CI jobs and the
// UI ask for the same report again and again, and a finished run's events
// change only when one is added to it (an acknowledgement), which moves the
// run's last sequence number, the cache key. Concurrent requests for one run
// compute it once.
type reconcileCache struct {
	mu      sync.Mutex
	reports map[string]cachedReport
	busy    map[string]*sync.Mutex
}

type cachedReport struct {
	lastSeq uint64
	rep     *reports.Report
}

func newReconcileCache() *reconcileCache {
	return &reconcileCache{reports: map[string]cachedReport{}, busy: map[string]*sync.Mutex{}}
}

// get returns the cached report of run id at lastSeq, or computes it.
func (c *reconcileCache) get(id string, lastSeq uint64, compute func() (*reports.Report, error)) (*reports.Report, error) {
	c.mu.Lock()
	m := c.busy[id]
	if m == nil {
		m = &sync.Mutex{}
		c.busy[id] = m
	}
	c.mu.Unlock()
	m.Lock()
	defer m.Unlock()
	c.mu.Lock()
	got, ok := c.reports[id]
	c.mu.Unlock()
	if ok && got.lastSeq == lastSeq {
		return got.rep, nil
	}
	rep, err := compute()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.reports) >= reconcileCacheSize {
		for k := range c.reports { // evict one: any will do
			delete(c.reports, k)
			delete(c.busy, k)
			break
		}
	}
	c.reports[id] = cachedReport{lastSeq: lastSeq, rep: rep}
	c.mu.Unlock()
	return rep, nil
}

func (a reportsAPI) reconciler() *reports.Reconciler {
	r := reports.NewReconciler(a.led)
	r.Hash = newLedgerHash()
	r.Payloads = a.stage
	return r
}

func (a reportsAPI) live(ctx context.Context, runID string) (*reports.LiveCounters, error) {
	v, err := a.runs.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	return &reports.LiveCounters{Total: v.Counts}, nil
}

func (a reportsAPI) WriteReconciliation(ctx context.Context, w io.Writer, runID, format string) error {
	v, err := a.runs.Run(ctx, runID)
	if err != nil {
		return err
	}
	compute := func() (*reports.Report, error) {
		return a.reconciler().Reconcile(ctx, runID, &reports.LiveCounters{Total: v.Counts})
	}
	var rep *reports.Report
	if v.Status.Terminal() {
		rep, err = a.cache.get(runID, v.LastSeq, compute)
	} else {
		rep, err = compute() // a running run changes under every request
	}
	if err != nil {
		return err
	}
	return reports.Write(w, rep, format)
}

func (a reportsAPI) WriteRunEvidence(ctx context.Context, w io.Writer, runID string) error {
	if _, err := a.runs.Run(ctx, runID); err != nil {
		return err
	}
	return a.export(ctx, w, []string{runID}, "run="+runID)
}

func (a reportsAPI) WriteAwardEvidence(ctx context.Context, w io.Writer, q api.EvidenceQuery) error {
	var ids []string
	f := auditd.RunFilter{FAIN: q.FAIN, From: q.From, To: q.To, Limit: 500}
	for {
		runs, next, err := a.runs.Runs(ctx, f)
		if err != nil {
			return err
		}
		for _, r := range runs {
			ids = append(ids, r.ID)
		}
		if next == "" {
			break
		}
		f.After = next
	}
	if len(ids) == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "no run of award %q in that period", q.FAIN)
	}
	// Oldest first, as an auditor reads a period.
	for i, j := 0, len(ids)-1; i < j; i, j = i+1, j-1 {
		ids[i], ids[j] = ids[j], ids[i]
	}
	filters := fmt.Sprintf("award=%s from=%s to=%s", q.FAIN, stamp(q.From), stamp(q.To))
	return a.export(ctx, w, ids, filters)
}

func (a reportsAPI) export(ctx context.Context, w io.Writer, runIDs []string, filters string) error {
	live := map[string]*reports.LiveCounters{}
	for _, id := range runIDs {
		lc, err := a.live(ctx, id)
		if err != nil {
			return err
		}
		live[id] = lc
	}
	head, _ := a.led.Head()
	x := reports.NewExporter(a.reconciler())
	x.Ledger = a.led
	req := reports.Request{
		ExportID:    fmt.Sprintf("%s@%d", filters, head),
		RunIDs:      runIDs,
		Filters:     filters,
		GeneratedAt: time.Now().UTC(),
		Live:        live,
	}
	return a.admission.Do(ctx, func(ctx context.Context) error {
		_, err := x.Export(ctx, w, req)
		return err
	})
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}
