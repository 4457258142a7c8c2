package reports

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
)

// DefaultCachedReports bounds how many finished runs' reconciliations a
// Service keeps.
const DefaultCachedReports = 256

// Runs is what a Service needs of the store of runs (*runs.Store): a run
// with its live counters, and the runs of an award.
type Runs interface {
	Run(ctx context.Context, id string) (auditd.RunView, error)
	Runs(ctx context.Context, f auditd.RunFilter) ([]auditd.RunView, string, error)
}

// Ledger is what a Service reads of the ledger (*ledger.Ledger): its
// events, its head, and what the Manifest needs to be verified offline.
type Ledger interface {
	auditd.EventReader
	Checkpointer
	Head() (seq uint64, hash [32]byte)
}

// Service serves a running auditd's reports: a run's reconciliation, with
// the counters kept while it ran for R7, and evidence workbooks of a run or
// of an award, admission-controlled. It implements the API's Reports.
//
// CI jobs and the UI ask for the same reconciliation again and again, and
// a finished run's events change only when one is added to it (an
// acknowledgement), which moves the run's last sequence number. So a
// finished run's report is kept, up to DefaultCachedReports of them, under
// that number; concurrent requests for one run compute it once. A run is
// recounted by one request at a time, running or not: a recount holds a
// record per item (a run's end brings the log line's request and its
// clients' at once).
type Service struct {
	// Payloads re-hashes staged payloads for R6; nil counts them only.
	Payloads PayloadVerifier
	// NewHash returns the ledger's chain hash for R8, one reconciliation
	// at a time; nil checks sequence numbers and links only.
	NewHash func() HashFunc
	// Admission admits evidence exports. Default: NewAdmission().
	Admission *Admission
	// Clock stamps an export's generated-at time. Default: clock.Real{}.
	Clock clock.Clock
	// SecretQuery names each source's declared secret query parameters,
	// for the exports' second guard (Exporter.SecretQuery). Default nil:
	// the built-in names only.
	SecretQuery func(sourceID string) []string

	ledger Ledger
	runs   Runs

	mu      sync.Mutex
	reports map[string]cachedReport
	busy    map[string]*runLock // runs being recounted or waited for
}

// runLock lets one request at a time recount a run.
type runLock struct {
	mu      sync.Mutex
	holders int // holding or waiting for mu; the lock is dropped at 0
}

type cachedReport struct {
	lastSeq uint64
	rep     *Report
}

// NewService returns a Service of the runs in runs, recorded in ledger.
func NewService(ledger Ledger, runs Runs) *Service {
	return &Service{Admission: NewAdmission(), Clock: clock.Real{}, ledger: ledger, runs: runs,
		reports: map[string]cachedReport{}, busy: map[string]*runLock{}}
}

func (s *Service) reconciler() *Reconciler {
	r := NewReconciler(s.ledger)
	if s.NewHash != nil {
		r.Hash = s.NewHash()
	}
	r.Payloads = s.Payloads
	return r
}

// WriteReconciliation writes run runID's reconciliation as format: "json",
// "csv" or "xlsx" (see Write).
func (s *Service) WriteReconciliation(ctx context.Context, w io.Writer, runID, format string) error {
	rep, err := s.Reconciliation(ctx, runID)
	if err != nil {
		return err
	}
	return Write(w, rep, format)
}

// Reconciliation returns run runID's reconciliation: a finished run's is
// computed once and kept.
func (s *Service) Reconciliation(ctx context.Context, runID string) (*Report, error) {
	v, err := s.runs.Run(ctx, runID)
	if err != nil {
		return nil, err
	}
	compute := func() (*Report, error) {
		return s.reconciler().Reconcile(ctx, runID, &LiveCounters{Total: v.Counts})
	}
	defer s.lockRun(runID)()
	if v.Status.Terminal() {
		return s.cached(runID, v.LastSeq, compute)
	}
	return compute() // a running run changes under every request
}

// lockRun waits until no other request recounts run id, and returns the
// func that lets the next one go.
func (s *Service) lockRun(id string) (unlock func()) {
	s.mu.Lock()
	l := s.busy[id]
	if l == nil {
		l = &runLock{}
		s.busy[id] = l
	}
	l.holders++
	s.mu.Unlock()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		s.mu.Lock()
		if l.holders--; l.holders == 0 {
			delete(s.busy, id)
		}
		s.mu.Unlock()
	}
}

// cached returns the kept report of run id at lastSeq, or computes it; the
// caller holds the run's lock.
func (s *Service) cached(id string, lastSeq uint64, compute func() (*Report, error)) (*Report, error) {
	s.mu.Lock()
	got, ok := s.reports[id]
	s.mu.Unlock()
	if ok && got.lastSeq == lastSeq {
		return got.rep, nil
	}
	rep, err := compute()
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	if len(s.reports) >= DefaultCachedReports {
		for k := range s.reports { // evict one: any will do
			delete(s.reports, k)
			break
		}
	}
	s.reports[id] = cachedReport{lastSeq: lastSeq, rep: rep}
	s.mu.Unlock()
	return rep, nil
}

// WriteRunEvidence writes run runID's evidence workbook (XLSX).
func (s *Service) WriteRunEvidence(ctx context.Context, w io.Writer, runID string) error {
	if _, err := s.runs.Run(ctx, runID); err != nil {
		return err
	}
	return s.export(ctx, w, []string{runID}, "run="+runID)
}

// WriteAwardEvidence writes the evidence workbook (XLSX) of every run of
// award f.FAIN created in [f.From, f.To), oldest first; ENOTFOUND when
// there is none. The other fields of f are ignored.
func (s *Service) WriteAwardEvidence(ctx context.Context, w io.Writer, f auditd.RunFilter) error {
	var ids []string
	q := auditd.RunFilter{FAIN: f.FAIN, From: f.From, To: f.To, Limit: 500}
	err := auditd.EachRun(ctx, s.runs, q, func(r auditd.RunView) error {
		ids = append(ids, r.ID)
		return nil
	})
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "no run of award %q in that period", f.FAIN)
	}
	slices.Reverse(ids) // oldest first, as an auditor reads a period
	return s.export(ctx, w, ids, q.AwardPeriod())
}

func (s *Service) export(ctx context.Context, w io.Writer, runIDs []string, filters string) error {
	live := map[string]*LiveCounters{}
	for _, id := range runIDs {
		v, err := s.runs.Run(ctx, id)
		if err != nil {
			return err
		}
		live[id] = &LiveCounters{Total: v.Counts}
	}
	head, _ := s.ledger.Head()
	x := NewExporter(s.reconciler())
	x.Ledger, x.SecretQuery = s.ledger, s.SecretQuery
	req := Request{
		ExportID:    fmt.Sprintf("%s@%d", filters, head),
		RunIDs:      runIDs,
		Filters:     filters,
		GeneratedAt: s.Clock.Now().UTC(),
		Live:        live,
	}
	return s.Admission.Do(ctx, func(ctx context.Context) error {
		_, err := x.Export(ctx, w, req)
		return err
	})
}
