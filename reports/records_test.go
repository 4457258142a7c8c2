package reports_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

const recordsRun = "01JRECORDS0RUN000000000000"

// send is one dispatch of a records run: when it left (after the run
// started), the records it carried, and whether the upstream refused it.
type send struct {
	at      time.Duration
	cost    int
	refused bool
}

// recordsLedger is a run against a source configured as the batch-upload
// seed's gateway (a ceiling of 120 records a second, a bucket of 200 at 50
// a second): one item per send, each dispatched once with its cost on
// record as the fetch loop records it, and answered.
func recordsLedger(sends []send) *memLedger {
	t0 := fixtureBase
	evs := []auditd.Event{
		{Type: auditd.EventRunStarted, RunID: recordsRun, Time: t0},
		{Type: auditd.EventRegistrySnapshot, RunID: recordsRun, SourceID: "upload", Time: t0, NewLimit: 120,
			NewWindow: time.Second, Snapshot: "run_start", Detail: `{"ceiling_limit":120,"ceiling_window":"1s","burst":200}`},
	}
	for i, s := range sends {
		key := fmt.Sprintf("batch-%d", i)
		at := t0.Add(s.at)
		detail := ""
		if s.cost != 1 {
			detail = fmt.Sprintf(`{"cost":%d}`, s.cost)
		}
		evs = append(evs,
			auditd.Event{Type: auditd.EventItemQueued, RunID: recordsRun, SourceID: "upload", ItemKey: key, Time: at, Method: "POST", Path: "/upload"},
			auditd.Event{Type: auditd.EventDispatch, RunID: recordsRun, SourceID: "upload", ItemKey: key, Attempt: 1, Time: at,
				Method: "POST", Path: "/upload", Detail: detail})
		done := at.Add(10 * time.Millisecond)
		if s.refused {
			evs = append(evs,
				auditd.Event{Type: auditd.EventThrottle, RunID: recordsRun, SourceID: "upload", ItemKey: key, Attempt: 1, Time: done,
					Status: 429, RetryAfter: 2 * time.Second, Wait: 2 * time.Second},
				auditd.Event{Type: auditd.EventItemFinished, RunID: recordsRun, SourceID: "upload", ItemKey: key, Time: done, Outcome: auditd.ItemFailed})
			continue
		}
		evs = append(evs,
			auditd.Event{Type: auditd.EventResponse, RunID: recordsRun, SourceID: "upload", ItemKey: key, Attempt: 1, Time: done,
				Status: 201, Outcome: auditd.OutcomeSuccess},
			auditd.Event{Type: auditd.EventItemFinished, RunID: recordsRun, SourceID: "upload", ItemKey: key, Time: done, Outcome: auditd.ItemSucceeded})
	}
	return newMemLedger(evs)
}

// r9 returns the source's R9 check in rep.
func r9(t *testing.T, rep *reports.Report) reports.Check {
	t.Helper()
	for _, s := range rep.Sources {
		for _, c := range s.Checks {
			if s.SourceID == "upload" && c.ID == reports.R9 {
				return c
			}
		}
	}
	t.Fatal("no R9 check for source upload")
	return reports.Check{}
}

// dispatchSeqs returns the seqs of l's dispatches, in order.
func dispatchSeqs(l *memLedger) []uint64 {
	var seqs []uint64
	for _, e := range l.Events {
		if e.Type == auditd.EventDispatch {
			seqs = append(seqs, e.Seq)
		}
	}
	return seqs
}

func TestReconcile_R9CountsRecords(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sends []send
		// pass is R9's verdict; over, the indexes of the sends it names.
		pass bool
		over []int
		// The Control evidence: its unit, peak and requests in that
		// window, and the bound it was held to.
		unit           string
		peak, requests int64
		limit, burst   int
		within         bool
		peakSend       int
	}{
		// The seed's worked example: two batches of 75 records, the
		// second admitted once the first has left the 1 s window.
		{name: "SeedExampleWithinCeiling", sends: []send{{0, 75, false}, {1001 * time.Millisecond, 75, false}},
			pass: true, unit: reports.UnitRecords, peak: 75, requests: 1, limit: 120, within: true, peakSend: 0},
		// Two requests are far inside 120 requests (plus the burst of
		// 200), but their 150 records are above the ceiling of 120.
		{name: "RecordsAboveCeiling", sends: []send{{0, 75, false}, {500 * time.Millisecond, 75, false}},
			pass: false, over: []int{1}, unit: reports.UnitRecords, peak: 150, requests: 2, limit: 120, within: false, peakSend: 1},
		// A refused batch counted none of its records upstream, and the
		// limiter refunds its cost: the next one fits.
		{name: "RefusedBatchRefunded", sends: []send{{0, 75, true}, {500 * time.Millisecond, 75, false}},
			pass: true, unit: reports.UnitRecords, peak: 75, requests: 1, limit: 120, within: true, peakSend: 0},
		// With every cost 1 the window counts requests against the limit
		// in force plus burst, as before costs.
		{name: "CostOneCountsRequests", sends: []send{{0, 1, false}, {100 * time.Millisecond, 1, false}, {200 * time.Millisecond, 1, false}},
			pass: true, unit: reports.UnitRequests, peak: 3, requests: 3, limit: 120, burst: 200, within: true, peakSend: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := recordsLedger(tc.sends)
			rep, err := newReconciler(l).Reconcile(context.Background(), recordsRun, nil)
			if err != nil {
				t.Fatal(err)
			}
			seqs := dispatchSeqs(l)
			c := r9(t, rep)
			var want []uint64
			for _, i := range tc.over {
				want = append(want, seqs[i])
			}
			if c.Pass != tc.pass || !slices.Equal(c.Offending, want) {
				t.Errorf("R9 pass %v offending %v, want pass %v offending %v (%s)", c.Pass, c.Offending, tc.pass, want, c.Note)
			}
			if len(rep.Control) != 1 {
				t.Fatalf("control evidence %+v, want one source", rep.Control)
			}
			ce := rep.Control[0]
			if ce.Unit != tc.unit || ce.Peak != tc.peak || ce.Requests != tc.requests || ce.Limit != tc.limit ||
				ce.Burst != tc.burst || ce.Window != time.Second || ce.Within != tc.within || ce.PeakSeq != seqs[tc.peakSend] {
				t.Errorf("control %+v, want %s peak %d requests %d limit %d burst %d within %v at seq %d",
					ce, tc.unit, tc.peak, tc.requests, tc.limit, tc.burst, tc.within, seqs[tc.peakSend])
			}
		})
	}
}

// TestExport_ControlInRecords reads the workbook of a records run back with
// excelize: the Dispatches sheet shows each dispatch's cost, and the Control
// evidence sheet the busiest window in records against the ceiling.
func TestExport_ControlInRecords(t *testing.T) {
	l := recordsLedger([]send{{0, 75, false}, {500 * time.Millisecond, 75, false}})
	b, _ := export(t, newExporter(l), reports.Request{ExportID: "exp-records", RunIDs: []string{recordsRun},
		Filters: "run " + recordsRun, GeneratedAt: generatedAt})
	wb := readWorkbook(t, b)
	seqs := dispatchSeqs(l)

	cells := func(sheet string) []map[string]string {
		rows := wb.sheets[sheet]
		if len(rows) < 2 {
			t.Fatalf("sheet %q has no rows", sheet)
		}
		var out []map[string]string
		for _, r := range rows[1:] {
			m := map[string]string{}
			for i, title := range rows[0] {
				m[title] = r[i]
			}
			out = append(out, m)
		}
		return out
	}
	disp := cells(reports.SheetDispatches)
	if len(disp) != 2 {
		t.Fatalf("Dispatches has %d rows, want 2", len(disp))
	}
	for i, r := range disp {
		if r["Seq"] != fmt.Sprint(seqs[i]) || r["Cost (records)"] != "75" {
			t.Errorf("Dispatches row %d: seq %s cost %s, want seq %d cost 75", i+2, r["Seq"], r["Cost (records)"], seqs[i])
		}
	}
	ctl := cells(reports.SheetControl)
	want := map[string]string{"Run": recordsRun, "Source": "upload", "Most in one window": "150", "Counted in": "records",
		"Requests in that window": "2", "Limit in force": "120", "Burst": "0", "Window (s)": "1",
		"At seq": fmt.Sprint(seqs[1]), "Within limit": "FALSE"}
	if len(ctl) != 1 {
		t.Fatalf("Control evidence has %d rows, want 1", len(ctl))
	}
	for col, v := range want {
		if ctl[0][col] != v {
			t.Errorf("Control evidence %q = %q, want %q", col, ctl[0][col], v)
		}
	}
}
