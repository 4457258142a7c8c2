package fetch_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// wireShared is a node's share of a fleet limit that holds a slot whenever
// one is asked for, and says for each slot taken, in order, how long its
// request may take to leave (limiter.Shared.Lag): lags[i] for the i-th
// take, the last of lags for the rest. onTake, when set, is told of each
// take's number, from 1. With most set, it hands out that many slots and
// then none, as a node cut off from the fleet. With maxCost set, it
// refuses a greater cost, as slots spaced wider than the grace allow.
type wireShared struct {
	mu      sync.Mutex
	lags    []time.Duration
	taken   int
	most    int
	maxCost int
	onTake  func(n int)
}

func (s *wireShared) Check(cost int) error {
	if s.maxCost > 0 && cost > s.maxCost {
		return fmt.Errorf("cost %d at 103ms apart, grace 20ms: cost exceeds the slots' grace", cost)
	}
	return nil
}

func (s *wireShared) Earliest(now time.Time, _ int) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return now, s.most == 0 || s.taken < s.most
}

func (s *wireShared) Take(time.Time, int) bool {
	s.mu.Lock()
	if s.most > 0 && s.taken >= s.most {
		s.mu.Unlock()
		return false
	}
	s.taken++
	n := s.taken
	s.mu.Unlock()
	if s.onTake != nil {
		s.onTake(n)
	}
	return true
}

func (s *wireShared) Changed() <-chan struct{} { return nil } // nothing to wait for: a slot is always held

func (s *wireShared) Pause(time.Time) {}

func (s *wireShared) BreakerOpened(time.Time) {}

func (s *wireShared) Lag() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lags[min(s.taken, len(s.lags))-1]
}

func (s *wireShared) takes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.taken
}

const wireScenario = `
name: wire
seed: 7
upstreams:
  - name: county
    path: /q
    limit: {shape: sliding_window, requests: 100, window: 1s}
    reject: {status: 429, retry_after: delta}
`

// A batch item admitted on a fleet slot is sent only when its dispatch
// record is durable within the fleet's lag of its slot. Here the ledger's
// commit after the slot is held while the clock moves on: past the lag,
// the upstream hears nothing of that attempt, whose dispatch is closed
// with a "not sent" dispatch.interrupted, and the item is sent on its next
// slot, attempt 2; within the lag, it is sent at once.
func TestFleetSlotPassedWhileRecordCommits(t *testing.T) {
	const lag = 40 * time.Millisecond
	for _, tc := range []struct {
		name    string
		held    time.Duration // how far the clock moves while the commit is held
		notSent bool
	}{
		{"RecordPastTheLag", lag + 10*time.Millisecond, true},
		{"RecordWithinTheLag", lag - 10*time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, wireScenario)
			// One attempt a page: a request not sent spends none of them.
			h.source(t, auditd.Source{ID: "county", Limit: 10, Window: auditd.Duration(time.Second), Concurrency: 1, MaxAttempts: 1}, "county")
			sh := &wireShared{lags: []time.Duration{lag}}
			v := holdFirstSlot(t, h, sh, tc.held)
			v = h.finish(t, v.ID)
			if v.Status != auditd.RunSucceeded {
				t.Fatalf("run ended %s: %+v", v.Status, v.Counts)
			}

			events := h.events(t, v.ID)
			var attempts []uint32
			var notSent []auditd.Event
			for _, e := range events {
				switch {
				case e.Type == auditd.EventDispatch:
					attempts = append(attempts, e.Attempt)
				case e.Type == auditd.EventInterrupted:
					notSent = append(notSent, e)
				case e.Type == auditd.EventResponse && e.Attempt != uint32(len(attempts)):
					t.Errorf("response to attempt %d; the attempt sent was %d", e.Attempt, len(attempts))
				}
			}
			received := h.sim.Stats("county").Received
			if received != 1 {
				t.Errorf("the upstream received %d requests, want 1", received)
			}
			if !tc.notSent {
				if len(attempts) != 1 || len(notSent) != 0 || sh.takes() != 1 {
					t.Errorf("dispatches %v, interrupted %d, slots taken %d: want one dispatch sent on its slot", attempts, len(notSent), sh.takes())
				}
				h.reconcile(t, v.ID)
				return
			}
			if fmt.Sprint(attempts) != "[1 2]" || sh.takes() != 2 {
				t.Fatalf("dispatches of attempts %v on %d slots, want attempts [1 2] on 2 slots", attempts, sh.takes())
			}
			if len(notSent) != 1 || notSent[0].Attempt != 1 || !auditd.NotSent(&notSent[0]) ||
				!strings.Contains(notSent[0].Reason, "fleet slot passed") || notSent[0].Path != "/q?n=1" {
				t.Fatalf("want one not-sent dispatch.interrupted of attempt 1, got %+v", notSent)
			}
			// Not an attempt that counts against the item's MaxAttempts, but
			// a number spent: the item records both.
			if v.Counts.Succeeded != 1 {
				t.Errorf("counts %+v", v.Counts)
			}
			h.reconcile(t, v.ID)
		})
	}
}

// holdFirstSlot attaches sh to source county's budget, submits a run of
// one item of it, and holds the first ledger commit to start after sh's
// first slot is taken (the dispatch's own, or one before it, which the
// dispatch's waits for) while the clock moves held on.
func holdFirstSlot(t *testing.T, h *harness, sh *wireShared, held time.Duration) auditd.RunView {
	t.Helper()
	var armed, holding atomic.Bool
	release := make(chan struct{})
	sh.onTake = func(n int) { armed.Store(n == 1) }
	fault := func() error {
		if armed.CompareAndSwap(true, false) {
			holding.Store(true)
			<-release
		}
		return nil
	}
	h.fault.Store(&fault)
	h.lim.Share("county", sh)
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "wire", Principal: "test",
		Items: []auditd.Item{{Key: "q1", SourceID: "county", Path: "/q?n=1"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(holding.Load, 100_000) {
		t.Fatal("no commit was held after the slot was taken: the test proves nothing")
	}
	h.clk.Advance(held)
	if got := h.sim.Stats("county").Received; got != 0 {
		t.Fatalf("the upstream received %d requests before the dispatch was durable", got)
	}
	close(release)
	return v
}

// An item whose cost the fleet's slots could not serve at the source's
// rate is refused at submit, naming the fleet and how to split it, rather
// than accepted and failed at dispatch; nothing is recorded or sent.
func TestFleetCostRefusedAtSubmit(t *testing.T) {
	h := newHarness(t, wireScenario)
	h.source(t, auditd.Source{ID: "county", Limit: 10, Window: auditd.Duration(time.Second), Burst: 5}, "county")
	h.lim.Share("county", &wireShared{maxCost: 1, lags: []time.Duration{time.Hour}})
	head, _ := h.ledger.Head()
	_, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "wire", Principal: "test",
		Items: []auditd.Item{{Key: "q1", SourceID: "county", Path: "/q?n=1", Cost: 2}}})
	var ae *auditd.Error
	if !errors.As(err, &ae) || ae.Field != "items[0].cost" || !strings.Contains(ae.Message, "in its fleet") || !strings.Contains(ae.Message, "Split the item") {
		t.Fatalf("submit of cost 2: %v, want items[0].cost refused, naming the fleet and how to split", err)
	}
	if after, _ := h.ledger.Head(); after != head || h.sim.Stats("county").Received != 0 {
		t.Fatalf("the refused item was recorded (head %d to %d) or sent", head, after)
	}
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "wire", Principal: "test",
		Items: []auditd.Item{{Key: "q1", SourceID: "county", Path: "/q?n=1", Cost: 1}}})
	if err != nil {
		t.Fatalf("submit of cost 1: %v", err)
	}
	if v = h.finish(t, v.ID); v.Status != auditd.RunSucceeded {
		t.Fatalf("the run of cost 1 ended %s: %+v", v.Status, v.Counts)
	}
}

// A request not sent for its fleet slot spends none of the page's
// attempts, after a restart too: here the node gets no second slot before
// it stops, and the run, resumed, sends the item on its page's one attempt.
func TestFleetSlotPassedIsNoAttemptAfterRestart(t *testing.T) {
	h := newHarness(t, wireScenario)
	h.source(t, auditd.Source{ID: "county", Limit: 10, Window: auditd.Duration(time.Second), Concurrency: 1, MaxAttempts: 1}, "county")
	v := holdFirstSlot(t, h, &wireShared{lags: []time.Duration{40 * time.Millisecond}, most: 1}, 50*time.Millisecond)
	notSent := func() bool {
		for _, e := range h.events(t, v.ID) {
			if auditd.NotSent(&e) {
				return true
			}
		}
		return false
	}
	if !h.drive(notSent, 100_000) {
		t.Fatal("the dispatch was never closed as not sent")
	}
	h.close(t)
	h.open(t, h.dir) // no fleet now: the gates admit alone
	v = h.finish(t, v.ID)
	if v.Status != auditd.RunSucceeded || v.Counts.Succeeded != 1 {
		t.Fatalf("run ended %s: %+v", v.Status, v.Counts)
	}
	events := h.events(t, v.ID)
	if got := count(events, auditd.EventDispatch, ""); got != 2 || h.sim.Stats("county").Received != 1 {
		t.Errorf("%d dispatches on record, the upstream received %d; want 2 and 1", got, h.sim.Stats("county").Received)
	}
	h.reconcile(t, v.ID)
}

// A proxied request whose dispatch record is durable only after its fleet
// slot's lag is not sent either: its client gets the answer of the next
// slot's attempt, which the upstream is the only one to hear. The first
// slot here allows no lag at all, so its record is late by construction.
func TestFleetSlotPassedProxied(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		fmt.Fprint(w, "ok")
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	sh := &wireShared{lags: []time.Duration{0, time.Hour}}
	e.lim.Share("s", sh)
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/s/x", nil, nil)
	if r.status != 200 || string(r.body) != "ok" || r.header.Get("Auditd-Attempts") != "2" {
		t.Fatalf("got %d %q attempts %q, want 200 ok after 2 attempts", r.status, r.body, r.header.Get("Auditd-Attempts"))
	}
	if got := len(up.requests()); got != 1 || sh.takes() != 2 {
		t.Fatalf("the upstream received %d requests on %d slots, want 1 on 2", got, sh.takes())
	}
	e.finish(id)
	ev := e.events(id)
	var notSent []auditd.Event
	for _, x := range ev {
		if auditd.NotSent(&x) {
			notSent = append(notSent, x)
		}
	}
	if len(notSent) != 1 || notSent[0].Attempt != 1 || countType(ev, auditd.EventDispatch) != 2 || countType(ev, auditd.EventResponse) != 1 {
		t.Fatalf("not sent %+v, dispatches %d, responses %d", notSent, countType(ev, auditd.EventDispatch), countType(ev, auditd.EventResponse))
	}
	e.reconcile(id)
}
