package clock_test

import (
	"context"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
)

func TestFakeTimersFireInOrderOnAdvance(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f := clock.NewFake(start)
	a := f.NewTimer(2 * time.Microsecond)
	b := f.NewTimer(time.Microsecond)
	f.Advance(time.Microsecond)
	select {
	case got := <-b.C():
		if !got.Equal(start.Add(time.Microsecond)) {
			t.Fatalf("b fired at %v", got)
		}
	default:
		t.Fatal("b did not fire at its deadline")
	}
	select {
	case <-a.C():
		t.Fatal("a fired early")
	default:
	}
	if a.Stop() != true || f.Pending() != 0 {
		t.Fatalf("stop: pending %d", f.Pending())
	}
}

func TestSleepWakesOnAdvanceAndOnCancel(t *testing.T) {
	f := clock.NewFake(time.Unix(0, 0))
	done := make(chan error, 1)
	go func() { done <- clock.Sleep(context.Background(), f, time.Second) }()
	f.WaitForTimers(1)
	f.Advance(time.Second)
	if err := <-done; err != nil {
		t.Fatalf("sleep: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { done <- clock.Sleep(ctx, f, time.Second) }()
	f.WaitForTimers(1)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("cancelled sleep returned %v", err)
	}
}
