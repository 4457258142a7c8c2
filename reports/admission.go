package reports

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
)

// Defaults of an Admission.
const (
	// DefaultExportSlots is how many heavy exports run at once. An export
	// holds a core busy compressing and a ledger read transaction open.
	DefaultExportSlots = 2

	// DefaultExportDeadline bounds one export, so a slot is never held for
	// longer and Retry-After always has an honest upper bound.
	DefaultExportDeadline = 10 * time.Minute
)

// ErrBusy means every export slot is taken. The error is a *BusyError, which
// says when to retry.
var ErrBusy = errors.New("exports busy")

// BusyError is returned instead of running an export when every slot is
// taken. Wait is the earliest a slot is expected to free up: the
// expected end of the running export closest to done, judged by how long
// recent exports took, and never later than that export's deadline.
type BusyError struct {
	Wait time.Duration
}

// Error implements error.
func (e *BusyError) Error() string {
	return fmt.Sprintf("exports busy: retry after %s", e.Wait)
}

// RetryAfter returns Wait. An HTTP layer finds it with errors.As and an
// interface of its own (interface{ RetryAfter() time.Duration }), without
// importing this package, and sets the Retry-After header from it.
func (e *BusyError) RetryAfter() time.Duration { return e.Wait }

// Unwrap makes errors.Is(err, ErrBusy) hold, and makes the API map it like
// any domain error (auditd.ETOOMANY: 429, with Retry-After from RetryAfter).
func (e *BusyError) Unwrap() []error {
	return []error{ErrBusy, &auditd.Error{Code: auditd.ETOOMANY, Message: "Too many exports are running; retry later."}}
}

// Admission admits heavy work (evidence exports) a bounded number at a
// time, each under a deadline. It never queues: a caller beyond the bound
// gets a *BusyError at once, so a burst of requests cannot pile up behind
// the slots and the client learns when to come back.
type Admission struct {
	// Slots is how many run at once. Defaults to DefaultExportSlots.
	Slots int
	// Deadline bounds each run. Defaults to DefaultExportDeadline.
	Deadline time.Duration
	// Clock times runs and deadlines. Defaults to clock.Real{}.
	Clock clock.Clock

	mu      sync.Mutex
	next    uint64
	running map[uint64]time.Time // start of each admitted run
	typical time.Duration        // moving average of finished runs; 0 until one finishes
}

// NewAdmission returns an Admission with the default slots and deadline.
func NewAdmission() *Admission {
	return &Admission{Slots: DefaultExportSlots, Deadline: DefaultExportDeadline, Clock: clock.Real{}}
}

// Do runs fn when a slot is free, with a context that ends at the deadline;
// otherwise it returns a *BusyError without running fn.
func (a *Admission) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	id, err := a.acquire()
	if err != nil {
		return err
	}
	start := a.clock().Now()
	defer func() { a.release(id, a.clock().Now().Sub(start)) }()

	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	timer := a.clock().NewTimer(a.deadline())
	defer timer.Stop()
	go func() {
		select {
		case <-timer.C():
			cancel(fmt.Errorf("export deadline %s passed: %w", a.deadline(), context.DeadlineExceeded))
		case <-ctx.Done():
		}
	}()
	if err := fn(ctx); err != nil {
		if cause := context.Cause(ctx); cause != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return cause
		}
		return err
	}
	return nil
}

func (a *Admission) clock() clock.Clock {
	if a.Clock == nil {
		return clock.Real{}
	}
	return a.Clock
}

func (a *Admission) deadline() time.Duration {
	if a.Deadline <= 0 {
		return DefaultExportDeadline
	}
	return a.Deadline
}

func (a *Admission) acquire() (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	slots := a.Slots
	if slots <= 0 {
		slots = DefaultExportSlots
	}
	if len(a.running) >= slots {
		return 0, &BusyError{Wait: a.retryAfter()}
	}
	if a.running == nil {
		a.running = make(map[uint64]time.Time)
	}
	a.next++
	a.running[a.next] = a.clock().Now()
	return a.next, nil
}

// retryAfter is how long until a slot is expected to free: for each running
// export, its expected end (start + typical duration, or its deadline when
// nothing has finished yet or it already ran longer than typical), at
// least one second away (Retry-After counts whole seconds); the earliest.
func (a *Admission) retryAfter() time.Duration {
	now := a.clock().Now()
	best := a.deadline()
	for _, start := range a.running {
		end := start.Add(a.deadline())
		if a.typical > 0 && start.Add(a.typical).After(now) {
			end = start.Add(a.typical)
		}
		if d := end.Sub(now); d < best {
			best = d
		}
	}
	best = (best + time.Second - 1).Truncate(time.Second) // never sooner than expected
	if best < time.Second {
		best = time.Second
	}
	return best
}

func (a *Admission) release(id uint64, took time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.running, id)
	if a.typical == 0 {
		a.typical = took
	} else {
		a.typical = (3*a.typical + took) / 4
	}
}
