package reports_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	bolt "go.etcd.io/bbolt"
)

// synthThirdOf1M is one node's part of a 1M-event fleet run over three
// nodes: 30,000 items of 4 pages, about 333,000 events.
var synthThirdOf1M = synthRun{items: 30_000, pages: 4, throttleEvery: 50}

// fleetLedgers are three nodes' ledgers of synthThirdOf1M, written once
// and removed by TestMain.
var fleetLedgers struct {
	once sync.Once
	dirs [3]string
	err  error
}

// openFleetLedgers opens the three nodes' ledgers read-only.
func openFleetLedgers(b *testing.B) [3]*bolt.DB {
	b.Helper()
	f := &fleetLedgers
	f.once.Do(func() {
		for i := range f.dirs {
			if f.dirs[i], f.err = os.MkdirTemp("", "reports-fleet-bench-"); f.err != nil {
				return
			}
			if f.err = writeLedger(filepath.Join(f.dirs[i], "auditd.db"), f.dirs[i], synthThirdOf1M); f.err != nil {
				return
			}
		}
	})
	if f.err != nil {
		b.Fatal(f.err)
	}
	var dbs [3]*bolt.DB
	for i, dir := range f.dirs {
		db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{ReadOnly: true})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { db.Close() })
		dbs[i] = db
	}
	return dbs
}

// BenchmarkFleetReconcile1M reconciles a fleet run of about 1M events over
// three nodes' real bbolt ledgers (warm after the first iteration): each
// node's part recounted and re-hashed at once, as the nodes do when the
// fleet reconciliation asks them, with their dispatches read for R9 over
// the fleet and sent as JSON, then summed (CombineFleet).
func BenchmarkFleetReconcile1M(b *testing.B) {
	dbs := openFleetLedgers(b)
	var recs [3]*reports.Reconciler
	for i, db := range dbs {
		recs[i] = reports.NewReconciler(ledger.NewReader(db))
		recs[i].Hash = ledgerHash
	}
	nodes := [3]string{"a", "b", "c"}
	var events int64
	for b.Loop() {
		parts := make([]reports.FleetPart, 3)
		var wg sync.WaitGroup
		for i := range recs {
			wg.Go(func() {
				rep, err := recs[i].Reconcile(context.Background(), synthRunID, nil)
				if err != nil {
					b.Error(err)
					return
				}
				ds := &reports.PartDispatches{}
				idx := map[string]int{}
				for _, s := range rep.Sources {
					idx[s.SourceID] = len(ds.Sources)
					ds.Limits = append(ds.Limits, reports.FleetLimit{Source: s.SourceID, Limit: 1 << 40, Window: int64(time.Second)})
					ds.Sources = append(ds.Sources, reports.SourceDispatches{Source: s.SourceID})
				}
				err = ledger.NewReader(dbs[i]).ScanRun(synthRunID, 0, func(e *auditd.Event) error {
					if e.Type == auditd.EventDispatch {
						s := &ds.Sources[idx[e.SourceID]]
						s.At, s.Seq = append(s.At, e.Time.UnixNano()), append(s.Seq, e.Seq)
					}
					return nil
				})
				if err != nil {
					b.Error(err)
					return
				}
				raw, err := json.Marshal(reports.FleetPart{Node: nodes[i], Report: rep, Logged: rep.Run.LastSeq, Dispatches: ds})
				if err == nil {
					err = json.Unmarshal(raw, &parts[i])
				}
				if err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		rep := reports.CombineFleet(synthRunID, parts)
		if !rep.Balanced {
			b.Fatalf("fleet run not balanced: %v", rep.Failed())
		}
		events = rep.Counts.Events
	}
	b.ReportMetric(float64(events), "events/op")
}
