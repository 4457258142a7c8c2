package reports

import (
	"context"
	"runtime"
	"sync"
	"testing"

	"github.com/auditd/auditd"
)

// Two requests for a running run's reconciliation (at a run's end, the log
// line's and a client's) recount it one after the other, never both at
// once, and leave no lock behind.
func TestServiceRecountsARunOneAtATime(t *testing.T) {
	const run = "01JQ8Z6X0RUN0000000000000A"
	led := &heldLedger{events: []auditd.Event{{Seq: 1, RunID: run, Type: auditd.EventRunStarted}}, entered: make(chan struct{}, 2), release: make(chan struct{})}
	s := NewService(led, runningRuns{})
	var wg sync.WaitGroup
	reconcile := func() {
		defer wg.Done()
		if _, err := s.Reconciliation(context.Background(), run); err != nil {
			t.Error(err)
		}
	}
	wg.Add(2)
	go reconcile()
	<-led.entered // the first recount reads the ledger, and is held there
	go reconcile()
	for s.holders(run) < 2 && len(led.entered) == 0 { // the second waits for the first
		runtime.Gosched()
	}
	select {
	case <-led.entered:
		t.Fatal("a second recount of the run started while the first was under way")
	default:
	}
	close(led.release)
	wg.Wait()
	if len(led.entered) != 1 {
		t.Errorf("the second request read the ledger %d times, want once after the first", len(led.entered))
	}
	if n := len(s.busy); n != 0 {
		t.Errorf("%d run locks left behind", n)
	}
}

func (s *Service) holders(id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.busy[id]; l != nil {
		return l.holders
	}
	return 0
}

// heldLedger serves events; each Scan says it began, then waits for release.
type heldLedger struct {
	events           []auditd.Event
	entered, release chan struct{}
}

func (l *heldLedger) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	for i := range l.events {
		if e := l.events[i]; e.RunID == runID && e.Seq > after {
			if err := fn(&e); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *heldLedger) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	l.entered <- struct{}{}
	<-l.release
	for i := range l.events {
		if e := l.events[i]; e.Seq >= from && e.Seq <= to {
			if err := fn(&e); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *heldLedger) Head() (uint64, [32]byte)    { return uint64(len(l.events)), [32]byte{} }
func (l *heldLedger) Checkpoint() ([]byte, error) { return nil, nil }
func (l *heldLedger) PublicKey() string           { return "" }

// runningRuns says every run is running.
type runningRuns struct{}

func (runningRuns) Run(_ context.Context, id string) (auditd.RunView, error) {
	return auditd.RunView{Run: auditd.Run{ID: id, Status: auditd.RunRunning}}, nil
}

func (runningRuns) Runs(context.Context, auditd.RunFilter) ([]auditd.RunView, string, error) {
	return nil, "", nil
}
