package ledger_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
)

// A disk that refuses writes for a while (WriteFault) stalls the ledger:
// appends wait, in order, while it retries, and are all stored once the
// disk takes writes again; OnStall and Stalled say so meanwhile.
func TestRefusedWritesAreRetried(t *testing.T) {
	db := MustOpenDB(t)
	var full atomic.Bool
	var mu sync.Mutex
	var told []error
	l := MustOpen(t, db, ledger.Options{
		WriteFault: func() error {
			if full.Load() {
				return syscall.ENOSPC
			}
			return nil
		},
		OnStall: func(err error) { mu.Lock(); told = append(told, err); mu.Unlock() },
	})
	if _, err := l.Append(context.Background(), sampleEvent("r", 0)); err != nil {
		t.Fatal(err)
	}
	full.Store(true)

	// Appenders and posters keep adding while the disk is full.
	const n = 8
	var wg sync.WaitGroup
	results := make(chan auditd.Event, 4*n)
	for w := range n {
		wg.Go(func() {
			for i := range 4 {
				e, err := l.Append(context.Background(), sampleEvent("r", 1+w*4+i))
				if err != nil {
					t.Errorf("append: %v", err)
					return
				}
				results <- e
			}
		})
	}
	told1 := make(chan outcome, 1)
	post(t, l, []auditd.Event{sampleEvent("posted", 1)}, nil, told1)

	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := l.Stalled(); errors.Is(err, syscall.ENOSPC) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the ledger never said it stalled")
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // a few retries
	if head, _ := l.Head(); head != 1 {
		t.Fatalf("head %d while the disk is full, want 1", head)
	}
	select {
	case o := <-told1:
		t.Fatalf("a post was told %v while the disk is full", o.err)
	default:
	}
	full.Store(false)
	wg.Wait()
	close(results)
	if o := <-told1; o.err != nil {
		t.Fatalf("post: %v", o.err)
	}
	got := 0
	for range results {
		got++
	}
	if got != 4*n {
		t.Fatalf("%d appends stored, want %d", got, 4*n)
	}
	if head, _ := l.Head(); head != 4*n+2 {
		t.Fatalf("head %d, want %d", head, 4*n+2)
	}
	if _, err := l.Stalled(); err != nil {
		t.Fatalf("still stalled: %v", err)
	}
	mu.Lock()
	if len(told) != 2 || !errors.Is(told[0], syscall.ENOSPC) || told[1] != nil {
		t.Errorf("OnStall told %v, want [ENOSPC <nil>]", told)
	}
	mu.Unlock()
	// Every event's time is the time it was stored, not when it was first
	// refused: times do not decrease along the sequence.
	var prev time.Time
	if err := l.Scan(1, 0, func(e *auditd.Event) error {
		if e.Time.Before(prev) {
			t.Errorf("event %d stamped %v, before the one before it (%v)", e.Seq, e.Time, prev)
		}
		prev = e.Time
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// Closing a stalled ledger fails what it could not write, and returns.
func TestCloseWhileStalled(t *testing.T) {
	db := MustOpenDB(t)
	l, err := ledger.Open(db, ledger.Options{WriteFault: func() error { return syscall.ENOSPC }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := l.Append(context.Background(), sampleEvent("r", 0))
		done <- err
	}()
	for {
		if _, err := l.Stalled(); err != nil {
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("append on a stalled ledger closed: %v, want ENOSPC", err)
	}
	if head, _ := l.Head(); head != 0 {
		t.Fatalf("head %d", head)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}
