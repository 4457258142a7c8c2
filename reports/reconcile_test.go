package reports_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/reports/reportstest"
)

// mutation is a change to the clean fixture (reportstest.Mutation).
type mutation = reportstest.Mutation

// drop removes the fixture events with the given seqs.
func drop(seqs ...uint64) func([]auditd.Event) []auditd.Event {
	return func(evs []auditd.Event) []auditd.Event {
		return slices.DeleteFunc(evs, func(e auditd.Event) bool { return slices.Contains(seqs, e.Seq) })
	}
}

func reconcile(tb testing.TB, m mutation) *reports.Report {
	tb.Helper()
	rep, err := newReconciler(m.Apply(tb)).Reconcile(context.Background(), fixtureRun, m.Live)
	if err != nil {
		tb.Fatal(err)
	}
	return rep
}

func statuses(rep *reports.Report) map[string]reports.Status {
	m := make(map[string]reports.Status)
	for _, c := range rep.Checks {
		m[c.ID] = c.Status
	}
	return m
}

func TestReconcile_Clean(t *testing.T) {
	rep := reconcile(t, mutation{Live: cleanLive()})
	if !rep.Balanced {
		t.Errorf("clean fixture not balanced: failed %v", rep.Failed())
	}
	for _, c := range rep.Checks {
		if c.Status != reports.StatusPass {
			t.Errorf("%s = %s (%s), want pass", c.ID, c.Status, c.Note)
		}
		if c.Expected == 0 {
			t.Errorf("%s expected 0: the fixture does not exercise it", c.ID)
		}
	}
	for _, s := range rep.Sources {
		for _, c := range s.Checks {
			if c.Status == reports.StatusFail {
				t.Errorf("source %s: %s failed", s.SourceID, c.ID)
			}
		}
	}
	want := reports.LedgerCounts{Events: 58, Queued: 6, Succeeded: 3, Cached: 1, Failed: 1, Shed: 1, Dispatches: 11,
		FirstAttempts: 6, Retries: 5, Status2xx: 5, Status429: 1, Status5xx: 2, StatusOther: 1, TransportErrors: 1,
		Interrupted: 1, Throttles: 1, Waits: 4, Breaker: 3, BreakerOpens: 1, Registry: 5, Staged: 3, CacheServed: 1, Acknowledged: 4}
	if rep.Counts != want {
		t.Errorf("counts\n got %+v\nwant %+v", rep.Counts, want)
	}
	if rep.Run.FirstSeq != 1 || rep.Run.LastSeq != 59 || rep.Run.Award.FAIN != "NA24OAR4310001" || rep.Run.Status != "partial" {
		t.Errorf("run summary %+v", rep.Run)
	}

	var buf bytes.Buffer
	if err := reports.WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	goldenCompare(t, "clean.reconciliation.json", buf.Bytes())
}

// A run with no request yet (a proxy run just named) reconciles with empty
// arrays where the contract promises arrays, not nulls.
func TestReconcile_NoRequestsHasEmptyArrays(t *testing.T) {
	rep := reconcile(t, mutation{Before: func(evs []auditd.Event) []auditd.Event {
		return slices.DeleteFunc(evs, func(e auditd.Event) bool { return e.SourceID != "" })
	}})
	var buf bytes.Buffer
	if err := reports.WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var got map[string]json.RawMessage
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{"sources", "control", "checks"} {
		if !bytes.HasPrefix(got[field], []byte("[")) {
			t.Errorf("%s = %s, want an array", field, got[field])
		}
	}
}

func TestReconcile_NotApplicable(t *testing.T) {
	rep := reconcile(t, mutation{Before: drop(56, 57, 58, 59)})
	got := statuses(rep)
	if got[reports.R7] != reports.StatusNA || got[reports.R10] != reports.StatusNA {
		t.Errorf("R7 = %s, R10 = %s; want n/a without live counters and acknowledgements", got[reports.R7], got[reports.R10])
	}
	if !rep.Balanced {
		t.Errorf("n/a checks must not unbalance: failed %v", rep.Failed())
	}
}

func TestReconcile_RunNotFound(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	_, err := newReconciler(l).Reconcile(context.Background(), "01JNOSUCHRUN00000000000000", nil)
	if !errors.Is(err, reports.ErrRunNotFound) {
		t.Fatalf("err = %v, want ErrRunNotFound", err)
	}
}

func TestReconcile_Cancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	if _, err := newReconciler(l).Reconcile(ctx, fixtureRun, nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
}

// TestReconcile_Mutations breaks exactly one identity per case and expects
// exactly that check to fail, the others to pass or not apply.
func TestReconcile_Mutations(t *testing.T) {
	for _, tt := range reportstest.Mutations() {
		t.Run(tt.Name, func(t *testing.T) {
			rep := reconcile(t, tt)
			if rep.Balanced {
				t.Errorf("balanced after breaking %s", tt.Breaks)
			}
			for _, c := range rep.Checks {
				switch {
				case c.ID == tt.Breaks && c.Status != reports.StatusFail:
					t.Errorf("%s = %s, want fail", c.ID, c.Status)
				case c.ID != tt.Breaks && c.Status == reports.StatusFail:
					t.Errorf("%s also failed: expected %d actual %d offending %v note %q", c.ID, c.Expected, c.Actual, c.Offending, c.Note)
				case c.ID == tt.Breaks && tt.Offending != 0 && !slices.Contains(c.Offending, tt.Offending):
					t.Errorf("%s offending %v, want it to name seq %d", c.ID, c.Offending, tt.Offending)
				}
			}
		})
	}
}

func TestReconcile_WithoutSeams(t *testing.T) {
	l := newMemLedger(loadFixture(t, "clean.ndjson"))
	l.Events[28].Bytes = 999 // undetectable without re-hashing
	rep, err := reports.NewReconciler(l).Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Checks {
		if (c.ID == reports.R6 || c.ID == reports.R8) && (c.Status != reports.StatusPass || c.Note == "") {
			t.Errorf("%s = %s note %q: want pass with a note saying what was not verified", c.ID, c.Status, c.Note)
		}
	}
}

func TestReport_JSONRoundTrip(t *testing.T) {
	rep := reconcile(t, mutation{Live: cleanLive()})
	var buf bytes.Buffer
	if err := reports.WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	var back reports.Report
	if err := json.Unmarshal(buf.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := reports.WriteJSON(&again, &back); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("report does not survive a JSON round trip (the CLI's server path decodes it)")
	}
}

// TestReconcile_R10NamesItems: an R10 failure says which items, by key, in
// total and in the source's scope, beside the offending events.
func TestReconcile_R10NamesItems(t *testing.T) {
	for _, tc := range []struct {
		name, mutation, source, note string
	}{
		{"NotAcknowledged", "R10/AckMissing", "grants", `not acknowledged: item "budget"`},
		{"NotDelivered", "R10/AckUndelivered", "grants", `acknowledged but not delivered: item "history"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m mutation
			for _, x := range reportstest.Mutations() {
				if x.Name == tc.mutation {
					m = x
				}
			}
			if m.Name == "" {
				t.Fatalf("no mutation %s", tc.mutation)
			}
			rep := reconcile(t, m)
			total := rep.Checks[9]
			if total.ID != reports.R10 || total.Status != reports.StatusFail || total.Note != tc.note {
				t.Errorf("total %s %s, note %q; want a failure noting %q", total.ID, total.Status, total.Note, tc.note)
			}
			for _, s := range rep.Sources {
				c := s.Checks[9]
				switch {
				case s.SourceID == tc.source && c.Note != tc.note:
					t.Errorf("source %s: R10 note %q, want %q", s.SourceID, c.Note, tc.note)
				case s.SourceID != tc.source && c.Status == reports.StatusFail:
					t.Errorf("source %s: R10 fails too (%q)", s.SourceID, c.Note)
				}
			}
		})
	}
	// Several items: the first MaxOffending in ledger order (by the
	// item.finished that delivered them), and how many more.
	r := newReconciler(mutation{Before: drop(56, 57, 58)}.Apply(t))
	r.MaxOffending = 2
	rep, err := r.Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rep.Checks[9].Note, `not acknowledged: items "awards", "parcels" and 1 more`; got != want {
		t.Errorf("note %q, want %q", got, want)
	}
}
