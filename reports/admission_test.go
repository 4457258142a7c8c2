package reports_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/reports"
)

// holdSlots starts n runs that hold their slot until release is closed.
func holdSlots(t *testing.T, a *reports.Admission, n int, release <-chan struct{}) <-chan error {
	t.Helper()
	started := make(chan struct{}, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			errs <- a.Do(context.Background(), func(ctx context.Context) error {
				started <- struct{}{}
				<-release
				return nil
			})
		}()
	}
	for range n {
		<-started
	}
	return errs
}

func TestAdmission_Busy(t *testing.T) {
	clk := clock.NewFake(fixtureBase)
	a := &reports.Admission{Slots: 2, Deadline: 10 * time.Minute, Clock: clk}
	release := make(chan struct{})
	errs := holdSlots(t, a, 2, release)
	clk.WaitForTimers(2)
	clk.Advance(30 * time.Second)

	ran := false
	err := a.Do(context.Background(), func(context.Context) error { ran = true; return nil })
	var busy *reports.BusyError
	switch {
	case ran:
		t.Fatal("a third export ran with two slots")
	case !errors.As(err, &busy) || !errors.Is(err, reports.ErrBusy):
		t.Fatalf("err = %v, want *BusyError", err)
	case auditd.ErrorCode(err) != auditd.ETOOMANY:
		t.Errorf("code %q, want %q for the API", auditd.ErrorCode(err), auditd.ETOOMANY)
	case !errors.As(err, new(interface{ RetryAfter() time.Duration })):
		t.Error("an HTTP layer cannot find the wait without importing reports")
	case busy.RetryAfter() != 9*time.Minute+30*time.Second:
		// Nothing finished yet: the honest bound is the earliest deadline.
		t.Errorf("RetryAfter = %s, want 9m30s", busy.RetryAfter())
	}

	close(release)
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if err := a.Do(context.Background(), func(context.Context) error { return nil }); err != nil {
		t.Fatalf("slot not released: %v", err)
	}
}

func TestAdmission_RetryAfterLearnsTypicalDuration(t *testing.T) {
	clk := clock.NewFake(fixtureBase)
	a := &reports.Admission{Slots: 1, Deadline: 10 * time.Minute, Clock: clk}
	// One export that takes 40s teaches the typical duration.
	if err := a.Do(context.Background(), func(context.Context) error { clk.Advance(40 * time.Second); return nil }); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	errs := holdSlots(t, a, 1, release)
	clk.Advance(10*time.Second + 500*time.Millisecond)
	var busy *reports.BusyError
	if err := a.Do(context.Background(), func(context.Context) error { return nil }); !errors.As(err, &busy) {
		t.Fatalf("err = %v, want *BusyError", err)
	}
	if busy.RetryAfter() != 30*time.Second {
		t.Errorf("RetryAfter = %s, want 30s (29.5s left of a typical 40s, rounded up)", busy.RetryAfter())
	}
	close(release)
	<-errs
}

func TestAdmission_Deadline(t *testing.T) {
	clk := clock.NewFake(fixtureBase)
	a := &reports.Admission{Slots: 1, Deadline: time.Minute, Clock: clk}
	done := make(chan error, 1)
	go func() {
		done <- a.Do(context.Background(), func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		})
	}()
	clk.WaitForTimers(1)
	clk.Advance(time.Minute)
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want the deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("export outlived its deadline")
	}
}
