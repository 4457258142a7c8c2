package reports_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
)

// recountRuns are finished runs of 250,000 and 1,000,000 items of one page
// each, as a batch run of the service records them: queued, dispatch,
// response, payload staged, finished (every 50th request throttled first).
var recountRuns = [...]synthRun{
	{items: 250_000, pages: 1, throttleEvery: 50},
	{items: 1_000_000, pages: 1, throttleEvery: 50},
}

// recountLedgers are recountRuns in real bbolt ledgers, written once a
// process (about a minute for the 1M-item one).
var recountLedgers [len(recountRuns)]builtLedger

// BenchmarkRecountHeap reconciles each of recountRuns from its bbolt
// ledger as the service does at a run's end (chain re-hashed, every staged
// payload verified) and reports the heap in use after GC when the ledger
// scan returns, above what it was before the reconciliation
// (MB-heap-scan-end): the recount's state for the whole run is live then.
// Run it as -benchtime 1x: each iteration collects garbage twice a scan.
func BenchmarkRecountHeap(b *testing.B) {
	for i, run := range recountRuns {
		b.Run(fmt.Sprintf("items=%d", run.items), func(b *testing.B) {
			db := recountLedgers[i].open(b, run)
			rd := &heapAtScanEnd{EventReader: ledger.NewReader(db)}
			r := reports.NewReconciler(rd)
			r.Hash, r.Payloads = ledgerHash, knownPayloads{synthPayloadHash: true}
			var most float64
			for b.Loop() {
				before := heapInUse()
				rd.most = 0
				rep, err := r.Reconcile(context.Background(), synthRunID, nil)
				if err != nil {
					b.Fatal(err)
				}
				if !rep.Balanced || rep.Counts.Succeeded != int64(run.items) || rep.Counts.Staged != int64(run.items) {
					b.Fatalf("synthetic run not balanced: %v %+v", rep.Failed(), rep.Counts)
				}
				most = max(most, rd.most-before)
			}
			b.ReportMetric(most, "MB-heap-scan-end")
		})
	}
}

// heapAtScanEnd notes the most heap in use after GC seen as a Scan of the
// ledger returns.
type heapAtScanEnd struct {
	auditd.EventReader
	most float64
}

func (r *heapAtScanEnd) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	err := r.EventReader.Scan(from, to, fn)
	r.most = max(r.most, heapInUse())
	return err
}

// heapInUse is the heap in use after two collections, in MB.
func heapInUse() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20)
}

// knownPayloads verifies the payload hashes it holds and no other: the
// synthetic runs stage one payload hash for every item.
type knownPayloads map[string]bool

func (k knownPayloads) VerifyPayload(hash string) error {
	if !k[hash] {
		return errors.New("payload not staged")
	}
	return nil
}
