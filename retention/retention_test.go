package retention_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/retention"
	"github.com/auditd/auditd/staging"
)

var start = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

type world struct {
	t     *testing.T
	db    *bolt.DB
	clock *clock.Fake
	led   *ledger.Ledger
	stage *staging.Store
	k     *retention.Keeper
}

func newWorld(t *testing.T) *world {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w := &world{t: t, db: db, clock: clock.NewFake(start)}
	if w.led, err = ledger.Open(db, ledger.Options{KeyDir: dir, Clock: w.clock}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.led.Close(context.Background()) })
	if w.stage, err = staging.Open(db, filepath.Join(dir, "payloads")); err != nil {
		t.Fatal(err)
	}
	w.k = retention.New(w.led, w.stage)
	w.k.Clock = w.clock
	return w
}

func (w *world) append(e auditd.Event) auditd.Event {
	w.t.Helper()
	e, err := w.led.Append(context.Background(), e)
	if err != nil {
		w.t.Fatal(err)
	}
	return e
}

// run records a run of award fain ("" for none) that staged the bodies
// and was served the cached payloads; it returns the staged hashes.
func (w *world) run(id, fain string, bodies []string, served ...string) []string {
	w.t.Helper()
	w.append(auditd.Event{Type: auditd.EventRunStarted, RunID: id, Detail: fmt.Sprintf(`{"name":"r","award":{"fain":%q}}`, fain)})
	var sums []string
	for i, b := range bodies {
		sum, n, err := w.stage.Put(strings.NewReader(b))
		if err != nil {
			w.t.Fatal(err)
		}
		w.append(auditd.Event{Type: auditd.EventPayloadStaged, RunID: id, ItemKey: fmt.Sprint(i), PayloadHash: sum, Bytes: n})
		sums = append(sums, sum)
	}
	for _, sum := range served {
		w.append(auditd.Event{Type: auditd.EventCacheServed, RunID: id, ItemKey: "c", PayloadHash: sum})
	}
	w.append(auditd.Event{Type: auditd.EventRunFinished, RunID: id, Outcome: auditd.Outcome(auditd.RunSucceeded)})
	return sums
}

func (w *world) head() uint64 { h, _ := w.led.Head(); return h }

func (w *world) purged(sum string) bool {
	err := w.stage.VerifyPayload(sum)
	if err != nil && !errors.Is(err, auditd.ErrPurged) {
		w.t.Fatalf("payload %s: %v", sum[:8], err)
	}
	return err != nil
}

var (
	finalReport = time.Date(2026, 1, 15, 0, 0, 0, 0, time.UTC)
	retainUntil = time.Date(2029, 1, 15, 0, 0, 0, 0, time.UTC) // three years on
)

// TestPurgeAroundTheDate: before the retention date a purge is refused;
// at it and after, it purges; under a hold it is refused at any date,
// with a clear error, and records nothing.
func TestPurgeAroundTheDate(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   time.Time
		hold bool
		want error
	}{
		{"Before", retainUntil.Add(-time.Second), false, retention.ErrRetained},
		{"At", retainUntil, false, nil},
		{"After", retainUntil.AddDate(0, 6, 0), false, nil},
		{"BeforeHeld", retainUntil.Add(-time.Second), true, retention.ErrHeld},
		{"AtHeld", retainUntil, true, retention.ErrHeld},
		{"AfterHeld", retainUntil.AddDate(0, 6, 0), true, retention.ErrHeld},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			sums := w.run("run-a", "F-1", []string{"one", "two"})
			a, err := w.k.SetRetention(context.Background(), "admin", "F-1", finalReport, time.Time{})
			if err != nil || !a.RetainUntil.Equal(retainUntil) {
				t.Fatalf("SetRetention: %+v %v, want retained until %s", a, err, retainUntil)
			}
			if tc.hold {
				if _, err := w.k.PlaceHold(context.Background(), "admin", "F-1", "audit of FY2025"); err != nil {
					t.Fatal(err)
				}
			}
			w.clock.Set(tc.at)
			head := w.head()
			rep, err := w.k.Purge(context.Background(), "admin", "F-1", false)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Purge: %v, want %v", err, tc.want)
			}
			if tc.want != nil {
				if w.head() != head || w.purged(sums[0]) {
					t.Error("a refused purge recorded or deleted something")
				}
				if tc.hold && !strings.Contains(err.Error(), "audit of FY2025") {
					t.Errorf("the refusal does not say why: %v", err)
				}
				return
			}
			if rep.Payloads != 2 || len(rep.Events) != 1 || !w.purged(sums[0]) || !w.purged(sums[1]) {
				t.Fatalf("purge report %+v", rep)
			}
			e, err := w.led.Event(rep.Events[0])
			if err != nil || e.Type != auditd.EventPayloadPurged || !strings.Contains(e.Detail, sums[0]) || e.Principal != "admin" {
				t.Errorf("purge event %+v", e)
			}
			// A second purge finds nothing left to do.
			rep, err = w.k.Purge(context.Background(), "admin", "F-1", false)
			if err != nil || rep.Payloads != 0 || rep.Already != 2 {
				t.Errorf("second purge: %+v %v", rep, err)
			}
			// The ledger still verifies: nothing of it was deleted.
			if r, err := ledger.Verify(context.Background(), w.db, ledger.VerifyOptions{VerifierKey: w.led.PublicKey()}); err != nil || !r.OK {
				t.Errorf("verify after purge: %+v %v", r, err)
			}
		})
	}
}

// TestPurgeSharedAndHeld: a payload is purged only when every run that
// uses it may be purged; a run without an award keeps its payloads; a
// global purge skips a held award and says so; releasing the hold lets
// it go.
func TestPurgeSharedAndHeld(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	a := w.run("run-a", "F-1", []string{"a-only", "shared"})
	b := w.run("run-b", "F-2", []string{"b-only"}, a[1])
	c := w.run("run-c", "", []string{"no-award"})
	if _, err := w.k.SetRetention(ctx, "admin", "F-1", finalReport, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.k.SetRetention(ctx, "admin", "F-2", finalReport.AddDate(0, 5, 0), time.Time{}); err != nil {
		t.Fatal(err)
	}
	hold, err := w.k.PlaceHold(ctx, "counsel", "F-2", "litigation hold, case 26-cv-001")
	if err != nil {
		t.Fatal(err)
	}
	w.clock.Set(retainUntil.AddDate(1, 0, 0)) // both dates passed

	if _, err := w.k.Purge(ctx, "admin", "F-2", false); !errors.Is(err, retention.ErrHeld) {
		t.Fatalf("purge of a held award: %v", err)
	}
	rep, err := w.k.Purge(ctx, "admin", "", false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Payloads != 1 || rep.Shared != 1 || !w.purged(a[0]) || w.purged(a[1]) || w.purged(b[0]) || w.purged(c[0]) {
		t.Fatalf("global purge under F-2's hold: %+v", rep)
	}
	if len(rep.Kept) != 1 || !strings.Contains(rep.Kept[0], "held") {
		t.Errorf("kept %q, want F-2 named as held", rep.Kept)
	}
	if _, err := w.k.ReleaseHold(ctx, "counsel", "F-2", hold.ID, "case dismissed"); err != nil {
		t.Fatal(err)
	}
	if _, err := w.k.ReleaseHold(ctx, "counsel", "F-2", hold.ID, "again"); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Errorf("releasing twice: %v", err)
	}
	rep, err = w.k.Purge(ctx, "admin", "", false)
	if err != nil || rep.Payloads != 2 || !w.purged(a[1]) || !w.purged(b[0]) || w.purged(c[0]) {
		t.Fatalf("purge after release: %+v %v", rep, err)
	}
	st, err := w.k.Status("F-2")
	if err != nil || !st.Set || len(st.Holds) != 1 || st.Holds[0].Active() || st.Holds[0].ReleaseReason != "case dismissed" || !st.Purgeable {
		t.Errorf("status %+v %v", st, err)
	}
	// The award's retention events, for the workbook: set, placed,
	// released and the purge of its run's payloads, in order.
	var types []auditd.EventType
	w.k.Events([]string{"F-2"}, func(e *auditd.Event) error { types = append(types, e.Type); return nil })
	want := []auditd.EventType{auditd.EventRetentionSet, auditd.EventHoldPlaced, auditd.EventHoldReleased, auditd.EventPayloadPurged}
	if fmt.Sprint(types) != fmt.Sprint(want) {
		t.Errorf("F-2's retention events %v, want %v", types, want)
	}
	// A fresh Keeper reads the same state back from the ledger.
	k2 := retention.New(w.led, w.stage)
	k2.Clock = w.clock
	st2, err := k2.Status("F-2")
	if err != nil || fmt.Sprint(st2) != fmt.Sprint(st) {
		t.Errorf("a fresh keeper sees %+v, want %+v", st2, st)
	}
}

// TestRetentionInput: bad dates, awards and reasons are refused naming
// the field, and record nothing.
func TestRetentionInput(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	head := w.head()
	for _, tc := range []struct {
		name, field string
		err         error
	}{
		{"NoAward", "award", func() error { _, err := w.k.SetRetention(ctx, "a", "", finalReport, time.Time{}); return err }()},
		{"NoReport", "final_report", func() error { _, err := w.k.SetRetention(ctx, "a", "F", time.Time{}, time.Time{}); return err }()},
		{"UntilBeforeReport", "retain_until", func() error {
			_, err := w.k.SetRetention(ctx, "a", "F", finalReport, finalReport.AddDate(-1, 0, 0))
			return err
		}()},
		{"HoldNoReason", "reason", func() error { _, err := w.k.PlaceHold(ctx, "a", "F", " "); return err }()},
		{"ReleaseNoReason", "reason", func() error { _, err := w.k.ReleaseHold(ctx, "a", "F", "h1", ""); return err }()},
	} {
		var e *auditd.Error
		if !errors.As(tc.err, &e) || e.Code != auditd.EINVALID || e.Field != tc.field {
			t.Errorf("%s: %v, want EINVALID naming %s", tc.name, tc.err, tc.field)
		}
	}
	if _, err := w.k.Purge(ctx, "a", "F-NONE", false); !errors.Is(err, retention.ErrNoRetention) {
		t.Errorf("purge of an award without a date: %v", err)
	}
	if w.head() != head {
		t.Error("refused input recorded events")
	}
}
