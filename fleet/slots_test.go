package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
)

// memBackend is a Backend in memory, with failures the test switches on.
type memBackend struct {
	clock     clock.Clock
	mu        sync.Mutex
	tat       int64
	rev       int64
	fail      error
	calls     int
	pauses    chan fleet.Pause
	pauseAt   int64
	pauseBy   string
	trip      time.Duration // a reservation moves the fake clock this much
	failPause error
}

func newMemBackend(c clock.Clock) *memBackend {
	return &memBackend{clock: c, pauses: make(chan fleet.Pause, 8)}
}

// Reserve grants a.Count slots: one node alone, never sharing the key.
func (m *memBackend) Reserve(ctx context.Context, key string, a fleet.Ask) (fleet.Block, error) {
	from, count, interval := a.From, a.Count, a.Interval
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if m.fail != nil {
		return fleet.Block{}, m.fail
	}
	first := max(m.tat, from.UnixNano())
	m.tat = first + int64(count)*int64(interval)
	m.rev++
	if fc, ok := m.clock.(*clock.Fake); ok && m.trip > 0 {
		fc.Advance(m.trip)
	}
	return fleet.Block{Key: key, First: time.Unix(0, first), Interval: interval, Count: count, Revision: m.rev}, nil
}

func (m *memBackend) PauseFor(ctx context.Context, key string, until time.Time, breaker string) (fleet.Pause, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.failPause != nil {
		return fleet.Pause{}, m.failPause
	}
	m.rev++
	if u := until.UnixNano(); u > m.pauseAt {
		m.pauseAt, m.pauseBy = u, breaker
	}
	m.tat = max(m.tat, until.UnixNano())
	return fleet.Pause{Key: key, Until: time.Unix(0, m.pauseAt), Revision: m.rev, Breaker: m.pauseBy}, nil
}

func (m *memBackend) Watch(ctx context.Context, key string, ch chan<- fleet.Pause) error {
	for {
		select {
		case p := <-m.pauses:
			select {
			case ch <- p:
			case <-ctx.Done():
				return ctx.Err()
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (m *memBackend) setFail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.fail = err
}

func (m *memBackend) callCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.calls
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// openSlots returns open Slots of 10 per second (interval 103 ms with the
// default guard) on a fake clock and an in-memory backend, and the channel
// its events arrive on.
func openSlots(t *testing.T, cfg fleet.Config) (*fleet.Slots, *clock.Fake, *memBackend, <-chan fleet.Event) {
	t.Helper()
	fc := clock.NewFake(t0)
	mb := newMemBackend(fc)
	reported, events := make(chan fleet.Event, 64), make(chan fleet.Event, 64)
	cfg.Key = "src"
	if cfg.Rate.Limit == 0 {
		cfg.Rate = fleet.Rate{Limit: 10, Window: time.Second}
	}
	cfg.Notify = func(e fleet.Event) { reported <- e }
	s, err := fleet.NewSlots(mb, fc, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.Open()
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	go forwardActedOn(t.Context(), s, reported, events)
	return s, fc, mb, events
}

// forwardActedOn passes on each event of s once s acted on it: a grant,
// reported before it is held, once it is held.
func forwardActedOn(ctx context.Context, s *fleet.Slots, in <-chan fleet.Event, out chan<- fleet.Event) {
	var grants int64
	for {
		var e fleet.Event
		select {
		case e = <-in:
		case <-ctx.Done():
			return
		}
		if e.Kind == fleet.EventReserved {
			grants++
			for {
				changed := s.Changed()
				if s.Stats().Blocks >= grants {
					break
				}
				select {
				case <-changed:
				case <-ctx.Done():
					return
				}
			}
		}
		out <- e
	}
}

// next returns the next event, failing the test if none comes (a guard
// against a hang, not a timing assertion).
func next(t *testing.T, events <-chan fleet.Event) fleet.Event {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return fleet.Event{}
	}
}

func TestIntervalAddsGraceAndSkew(t *testing.T) {
	got := fleet.Interval(fleet.Rate{Limit: 10, Window: time.Second}, 20*time.Millisecond, 10*time.Millisecond)
	if want := 103 * time.Millisecond; got != want {
		t.Fatalf("interval %v, want %v", got, want)
	}
	// Rounded up: 1s+0+0 over 3 is 333333333.33 ns.
	if got := fleet.Interval(fleet.Rate{Limit: 3, Window: time.Second}, 0, 0); got != 333333334 {
		t.Fatalf("interval %v, want rounded up", got)
	}
}

// TestSlotsRateBeyondTheLongestWindow: a rate over a window past
// fleet.MaxWindow (one that saturated parsing, 10^20 s) neither overflows
// the spacing nor becomes the node's rate: the told ceiling stays.
func TestSlotsRateBeyondTheLongestWindow(t *testing.T) {
	huge := fleet.Rate{Limit: 100, Window: math.MaxInt64}
	if got := fleet.Interval(huge, fleet.DefaultGrace, fleet.DefaultMaxSkew); got <= 0 {
		t.Fatalf("interval %v of %v, want positive", got, huge)
	}
	ceiling := fleet.Rate{Limit: 10, Window: time.Second}
	s, _, _, _ := openSlots(t, fleet.Config{Rate: ceiling})
	if got := s.SetRate(huge, fleet.Rate{}); got != ceiling {
		t.Fatalf("SetRate(%v) applied %v, want the ceiling %v", huge, got, ceiling)
	}
	if _, err := fleet.NewSlots(newMemBackend(clock.NewFake(t0)), clock.NewFake(t0), fleet.Config{Rate: huge}); !errors.Is(err, fleet.ErrInvalidRate) {
		t.Fatalf("NewSlots at %v: %v, want ErrInvalidRate", huge, err)
	}
}

func TestSlotsHandOutInOrderAtTheirTimes(t *testing.T) {
	s, fc, _, events := openSlots(t, fleet.Config{})
	if _, ok := s.Earliest(fc.Now(), 1); ok {
		t.Fatal("slot before any reservation")
	}
	b := grow(t, s, fc, events) // took the slot at t0
	if b.Interval != 103*time.Millisecond {
		t.Fatalf("interval %v, want 103ms", b.Interval)
	}
	at, ok := s.Earliest(fc.Now(), 1)
	if !ok || !at.Equal(t0.Add(103*time.Millisecond)) {
		t.Fatalf("next slot %v %v, want t0+103ms", at, ok)
	}
	if s.Take(fc.Now(), 1) {
		t.Fatal("slot taken before its time")
	}
	fc.Advance(102 * time.Millisecond)
	if s.Take(fc.Now(), 1) {
		t.Fatal("slot taken 1ms before its time")
	}
	fc.Advance(time.Millisecond)
	if !s.Take(fc.Now(), 1) {
		t.Fatal("slot refused at its time")
	}
	if st := s.Stats(); st.Used != 2 || st.Wasted != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSlotsWasteWhatExpires(t *testing.T) {
	s, fc, _, events := openSlots(t, fleet.Config{})
	s.Earliest(fc.Now(), 1)
	if b := next(t, events).Block; b.Count != 1 {
		t.Fatalf("a new node's first block holds %d slots, want 1", b.Count)
	}
	// The slot at t0 is good until t0+20ms (grace 20ms).
	fc.Set(t0.Add(19 * time.Millisecond))
	if at, ok := s.Earliest(fc.Now(), 1); !ok || !at.Equal(fc.Now()) {
		t.Fatalf("earliest %v %v inside the grace", at, ok)
	}
	fc.Set(t0.Add(20 * time.Millisecond))
	if _, ok := s.Earliest(fc.Now(), 1); ok {
		t.Fatal("slot handed out past its grace")
	}
	if st := s.Stats(); st.Wasted != 1 || st.Used != 0 {
		t.Fatalf("stats %+v, want the slot wasted", st)
	}
}

// grow takes the first block's slot at t0 and asks for another, which has
// the node reserve a second block of two, and returns it. One slot used is
// no sign of demand: the node reserves nothing more until asked.
func grow(t *testing.T, s *fleet.Slots, fc *clock.Fake, events <-chan fleet.Event) fleet.Block {
	t.Helper()
	s.Earliest(fc.Now(), 1)
	first := next(t, events).Block
	if !s.Take(fc.Now(), 1) {
		t.Fatal("slot 0 refused")
	}
	if _, ok := s.Earliest(fc.Now(), 1); ok {
		t.Fatal("a slot held after the first block's only one was taken")
	}
	b := next(t, events).Block
	if b.Count != 2 || !b.First.Equal(first.End()) {
		t.Fatalf("second block %+v, want two slots from %v", b, first.End())
	}
	return b
}

// takeAt takes the slots of b at the given indexes, each at its time.
func takeAt(t *testing.T, s *fleet.Slots, fc *clock.Fake, b fleet.Block, slots ...int) {
	t.Helper()
	for _, i := range slots {
		fc.Set(b.Slot(i))
		if !s.Take(fc.Now(), 1) {
			t.Fatalf("slot %d at %v refused", i, b.Slot(i))
		}
	}
}

// grow4 spends grow's block of two, which has the node, out of slots and
// having used two, reserve a block of four, and returns it.
func grow4(t *testing.T, s *fleet.Slots, fc *clock.Fake, events <-chan fleet.Event) fleet.Block {
	t.Helper()
	b := grow(t, s, fc, events)
	takeAt(t, s, fc, b, 0, 1)
	c := next(t, events).Block
	if c.Count != 4 || !c.First.Equal(b.End()) {
		t.Fatalf("third block %+v, want four slots from %v", c, b.End())
	}
	return c
}

// TestSlotsReserveAheadBeforeRunningOut has a Lead longer than half a
// block: once the node has used two slots of its block and its last slot
// is within Lead, it reserves the next block while it still holds slots.
func TestSlotsReserveAheadBeforeRunningOut(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Block: time.Second, Lead: 250 * time.Millisecond})
	c := grow4(t, s, fc, events) // slots 103ms apart: its last is 309ms after its first
	takeAt(t, s, fc, c, 0, 1)
	e := next(t, events)
	if e.Kind != fleet.EventReserved || !e.Block.First.Equal(c.End()) {
		t.Fatalf("prefetch %+v, want a block at %v", e, c.End())
	}
	if st := s.Stats(); st.Held != 2+e.Block.Count || st.Blocks != 4 {
		t.Fatalf("stats %+v, want the third block's last two slots and the fourth held", st)
	}
	if mb.callCount() != 4 {
		t.Fatalf("%d reservations, want 4", mb.callCount())
	}
}

// TestSlotsReserveOnceHalfTheBlockIsUsed has a Lead far below half a block:
// a node reserves its next block once half its last block's span is left,
// so that a reservation that comes late leaves no gap between its blocks.
func TestSlotsReserveOnceHalfTheBlockIsUsed(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Block: time.Second, Lead: time.Millisecond})
	c := grow4(t, s, fc, events)
	takeAt(t, s, fc, c, 0, 1)
	d := next(t, events).Block
	if d.Count != 8 || !d.First.Equal(c.End()) {
		t.Fatalf("fourth block %+v, want eight slots from %v", d, c.End())
	}
	takeAt(t, s, fc, c, 2, 3)
	takeAt(t, s, fc, d, 0, 1, 2, 3) // four of eight: half its span is left
	e := next(t, events).Block
	if e.Count != 9 || !e.First.Equal(d.End()) {
		t.Fatalf("fifth block %+v, want nine slots (a second's worth) from %v", e, d.End())
	}
	if st := s.Stats(); st.Held != 4+e.Count {
		t.Fatalf("stats %+v, want the fourth block's last four slots and the fifth held", st)
	}
	if n := mb.callCount(); n != 5 {
		t.Fatalf("%d reservations, want 5", n)
	}
}

// TestSlotsSparseNodeReservesOnlyWhenAsked has a node use one slot of each
// grant, its takers far apart: it reserves when a taker asks and holds
// nothing ahead to waste.
func TestSlotsSparseNodeReservesOnlyWhenAsked(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Rate: fleet.Rate{Limit: 1000, Window: time.Second}})
	for i := range 5 {
		fc.Advance(time.Second)
		if _, ok := s.Earliest(fc.Now(), 1); ok {
			t.Fatalf("request %d: a slot held a second after the last request", i)
		}
		b := next(t, events).Block // the grant its ask brought, held before it is reported
		if !s.Take(fc.Now(), 1) {
			t.Fatalf("request %d: the slot granted at %v refused at once", i, b.First)
		}
	}
	if n := mb.callCount(); n != 5 {
		t.Fatalf("%d reservations for five requests, want 5", n)
	}
	fc.Advance(time.Second)
	if st := s.Stats(); st.Used != 5 || st.Reserved != 5 || st.Wasted != 0 {
		t.Fatalf("stats %+v, want a slot reserved and used a request, none wasted", st)
	}
}

// TestSlotsGrantReportedBeforeItsSlotsAreHandedOut holds Notify on a grant:
// until it returns, the grant's slots are not handed out.
func TestSlotsGrantReportedBeforeItsSlotsAreHandedOut(t *testing.T) {
	fc := clock.NewFake(t0)
	reported, release := make(chan fleet.Event, 1), make(chan struct{})
	s, err := fleet.NewSlots(newMemBackend(fc), fc, fleet.Config{Key: "src", Rate: fleet.Rate{Limit: 10, Window: time.Second},
		Notify: func(e fleet.Event) {
			if e.Kind == fleet.EventReserved {
				reported <- e
				<-release
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	s.Open()
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	s.Earliest(fc.Now(), 1)
	next(t, reported)
	if _, ok := s.Earliest(fc.Now(), 1); ok {
		t.Fatal("a slot handed out while its grant was being reported")
	}
	changed := s.Changed()
	close(release)
	select {
	case <-changed:
	case <-time.After(10 * time.Second): // a guard against a hang
		t.Fatal("the grant was not held once reported")
	}
	if !s.Take(fc.Now(), 1) {
		t.Fatal("the reported grant's slot refused")
	}
}

func TestSlotsIdleNodeReservesNothing(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{})
	s.Earliest(fc.Now(), 1)
	b := next(t, events).Block
	fc.Set(b.End().Add(time.Hour)) // nobody took anything
	if st := s.Stats(); st.Wasted != int64(b.Count) || st.Held != 0 {
		t.Fatalf("stats %+v, want the whole block wasted", st)
	}
	if n := mb.callCount(); n != 1 {
		t.Fatalf("%d reservations by an idle node, want 1", n)
	}
}

func TestSlotsCutOffStopsAtTheBlockAndRejoins(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Block: time.Second, Lead: 150 * time.Millisecond})
	c := grow4(t, s, fc, events)
	mb.setFail(errors.New("etcd unreachable"))
	takeAt(t, s, fc, c, 0, 1) // half the block used: the node reserves ahead
	if e := next(t, events); e.Kind != fleet.EventCutOff || e.Err == nil {
		t.Fatalf("event %+v, want cut_off", e)
	}
	// What it holds it still hands out...
	takeAt(t, s, fc, c, 2, 3)
	// ...and then nothing: it never guesses.
	fc.Advance(time.Second)
	if _, ok := s.Earliest(fc.Now(), 1); ok {
		t.Fatal("a slot while cut off and out of slots")
	}
	if st := s.Stats(); !st.CutOff || st.Used != 7 || st.Reserved != 7 {
		t.Fatalf("stats %+v, want all 7 reserved used, no more", st)
	}
	fc.WaitForTimers(1) // the loop waits to try again
	mb.setFail(nil)
	fc.Advance(fleet.DefaultRetry)
	if e := next(t, events); e.Kind != fleet.EventRejoined {
		t.Fatalf("event %+v, want rejoined", e)
	}
	if e := next(t, events); e.Kind != fleet.EventReserved {
		t.Fatalf("event %+v, want reserved", e)
	}
	if _, ok := s.Earliest(fc.Now(), 1); !ok || s.Stats().CutOff {
		t.Fatalf("no slot after rejoining: %+v", s.Stats())
	}
}

// TestSlotsFailedReserveAheadIsRetried: a reservation ahead that fails
// while the node still holds slots is tried again every Retry, not only
// once a taker runs dry, and the node rejoins as soon as etcd answers.
func TestSlotsFailedReserveAheadIsRetried(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Block: time.Second, Lead: 150 * time.Millisecond})
	c := grow4(t, s, fc, events)
	mb.setFail(errors.New("etcd unreachable"))
	takeAt(t, s, fc, c, 0, 1) // half the block used: the node reserves ahead
	if e := next(t, events); e.Kind != fleet.EventCutOff {
		t.Fatalf("event %+v, want cut_off", e)
	}
	fc.WaitForTimers(1) // the loop waits to try again
	mb.setFail(nil)
	fc.Advance(fleet.DefaultRetry) // no taker asks meanwhile
	if e := next(t, events); e.Kind != fleet.EventRejoined {
		t.Fatalf("event %+v, want rejoined", e)
	}
	if e := next(t, events); e.Kind != fleet.EventReserved {
		t.Fatalf("event %+v, want the block reserved ahead", e)
	}
	if s.Stats().CutOff {
		t.Fatalf("still cut off after rejoining: %+v", s.Stats())
	}
}

func TestSlotsLearnedPauseDropsHeldSlots(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Block: 300 * time.Millisecond, Lead: 150 * time.Millisecond})
	b := grow(t, s, fc, events) // slots held at 103ms and 206ms
	until := b.Slot(1)
	mb.pauses <- fleet.Pause{Key: "src", Until: until, Revision: 99}
	if e := next(t, events); e.Kind != fleet.EventPaused || e.Pause.Revision != 99 {
		t.Fatalf("event %+v, want paused", e)
	}
	at, ok := s.Earliest(fc.Now(), 1)
	if !ok || !at.Equal(until) {
		t.Fatalf("earliest %v %v, want the slot at the pause's end %v", at, ok, until)
	}
	if st := s.Stats(); st.Wasted != 1 || !st.PausedUntil.Equal(until) {
		t.Fatalf("stats %+v, want the slot before the pause wasted", st)
	}
	// The same pause again (a watch echo) is not acted on twice, and a
	// shorter one does not shorten it.
	mb.pauses <- fleet.Pause{Key: "src", Until: until, Revision: 99}
	mb.pauses <- fleet.Pause{Key: "src", Until: b.First, Revision: 98}
	later := until.Add(time.Second)
	mb.pauses <- fleet.Pause{Key: "src", Until: later, Revision: 100}
	if e := next(t, events); e.Kind != fleet.EventPaused || e.Pause.Revision != 100 {
		t.Fatalf("event %+v, want only the longer pause", e)
	}
	if st := s.Stats(); !st.PausedUntil.Equal(later) || st.Held != 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestSlotsOwnPauseAddsSkewAndPushesArrival(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{})
	until := t0.Add(time.Second)
	p, err := s.Pause(context.Background(), until)
	if err != nil {
		t.Fatal(err)
	}
	if want := until.Add(fleet.DefaultMaxSkew); !p.Until.Equal(want) {
		t.Fatalf("pause until %v, want %v (skew added)", p.Until, want)
	}
	if e := next(t, events); e.Kind != fleet.EventPaused {
		t.Fatalf("event %+v", e)
	}
	s.Earliest(fc.Now(), 1)
	if e := next(t, events); e.Block.First.Before(p.Until) {
		t.Fatalf("block at %v inside the pause", e.Block.First)
	}
	_ = mb
}

func TestSlotsCostBeyondGrace(t *testing.T) {
	s, _, _, _ := openSlots(t, fleet.Config{Rate: fleet.Rate{Limit: 1000, Window: time.Second}})
	// Interval 1.03ms: 20 slots span 19.57ms < 20ms grace; 21 span 20.6ms.
	if err := s.Check(20); err != nil {
		t.Fatal(err)
	}
	if err := s.Check(21); !errors.Is(err, fleet.ErrCostExceedsGrace) {
		t.Fatalf("err %v, want ErrCostExceedsGrace", err)
	}
}

// TestSlotsCostRefusedAfterACutAsksForNothing: a cost of 2 fits the grace
// at 100/s; after a cut to 40/s its slots are 25.75 ms apart, past the
// grace, so Check refuses it and Earliest asks for no block for it:
// asking would reserve and waste blocks back to back, pushing the key's
// arrival time ahead of every node. The next block is the one a cost of 1
// asks for.
func TestSlotsCostRefusedAfterACutAsksForNothing(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Rate: fleet.Rate{Limit: 100, Window: time.Second}})
	if err := s.Check(2); err != nil {
		t.Fatal(err)
	}
	s.SetRate(fleet.Rate{Limit: 40, Window: time.Second}, fleet.Rate{})
	if err := s.Check(2); !errors.Is(err, fleet.ErrCostExceedsGrace) {
		t.Fatalf("err %v, want ErrCostExceedsGrace after the cut", err)
	}
	if _, ok := s.Earliest(fc.Now(), 2); ok {
		t.Fatal("Earliest found two slots within the grace at 40/s")
	}
	s.Earliest(fc.Now(), 1)
	if b := next(t, events).Block; b.Count != 1 || mb.callCount() != 1 {
		t.Fatalf("first block %+v after %d reservations, want one slot, asked for by the cost of 1", b, mb.callCount())
	}
}

// TestSlotsGuardKeepsLateTakesUnderTheLimit takes the first slot as late as
// its grace allows and every other at its time: the slots' spacing keeps
// even that inside the limit in every window.
//
// A learned rate at the ceiling or just under it, counted over a longer
// window (fleet.Raise scales 10 a second to 200 per 20 s), holds the guard
// over the ceiling's window too.
func TestSlotsGuardKeepsLateTakesUnderTheLimit(t *testing.T) {
	rate := fleet.Rate{Limit: 10, Window: time.Second}
	for _, learned := range []fleet.Rate{{}, {Limit: 200, Window: 20 * time.Second},
		{Limit: 99, Window: 10 * time.Second}, {Limit: 156, Window: 16 * time.Second}} {
		t.Run(fmt.Sprintf("%d_per_%v", learned.Limit, learned.Window), func(t *testing.T) {
			s, fc, _, _ := openSlots(t, fleet.Config{Rate: rate})
			if learned.Limit > 0 {
				s.SetRate(learned, fleet.Rate{})
			}
			guardedTakes(t, s, fc, rate)
		})
	}
}

// TestSlotsGuardKeepsLateTakesUnderAnAdvertisedQuota: the quota an
// upstream advertises (10 a second) counts over a shorter window than the
// told ceiling (6000 a minute). A learned rate at the quota or just under
// it, counted over a longer window still (200 per 20 s), and the ceiling
// itself are spaced for the quota's window: as late a first take as its
// grace allows puts no more than the quota in any second.
func TestSlotsGuardKeepsLateTakesUnderAnAdvertisedQuota(t *testing.T) {
	ceiling, quota := fleet.Rate{Limit: 6000, Window: time.Minute}, fleet.Rate{Limit: 10, Window: time.Second}
	for _, learned := range []fleet.Rate{{Limit: 200, Window: 20 * time.Second},
		{Limit: 99, Window: 10 * time.Second}, ceiling} {
		t.Run(fmt.Sprintf("%d_per_%v", learned.Limit, learned.Window), func(t *testing.T) {
			s, fc, _, _ := openSlots(t, fleet.Config{Rate: ceiling})
			s.SetRate(learned, quota)
			guardedTakes(t, s, fc, quota)
		})
	}
}

func guardedTakes(t *testing.T, s *fleet.Slots, fc *clock.Fake, rate fleet.Rate) {
	t.Helper()
	var takes []time.Time
	for len(takes) < 3*rate.Limit {
		changed := s.Changed()
		at, ok := s.Earliest(fc.Now(), 1)
		if !ok {
			select {
			case <-changed:
			case <-time.After(10 * time.Second): // a guard against a hang
				t.Fatal("no block")
			}
			continue
		}
		if len(takes) == 0 {
			at = at.Add(fleet.DefaultGrace - time.Nanosecond)
		}
		fc.Set(at)
		if !s.Take(fc.Now(), 1) {
			t.Fatalf("slot at %v refused", at)
		}
		takes = append(takes, at)
	}
	if most, at := busiestWindow(takes, rate.Window); most > rate.Limit {
		t.Fatalf("%d takes in the window from %v, limit %d", most, at, rate.Limit)
	}
}

// TestSlotsAskForBlocksFromWhenTheyArrive has every reservation take 30ms,
// more than a slot's grace: the first block, asked for from now, arrives
// with its slot expired; the next is asked for from now plus the round trip
// less half the grace, and arrives due and usable.
func TestSlotsAskForBlocksFromWhenTheyArrive(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{Rate: fleet.Rate{Limit: 1000, Window: time.Second}})
	mb.mu.Lock()
	mb.trip = 30 * time.Millisecond
	mb.mu.Unlock()
	s.Earliest(fc.Now(), 1)
	if b := next(t, events).Block; !b.First.Equal(t0) {
		t.Fatalf("first block at %v, want t0", b.First)
	}
	if _, ok := s.Earliest(fc.Now(), 1); ok || s.Stats().Wasted != 1 {
		t.Fatalf("the first slot arrived usable: %+v", s.Stats())
	}
	b := next(t, events).Block
	if want := t0.Add(50 * time.Millisecond); !b.First.Equal(want) {
		t.Fatalf("second block at %v, want %v (asked at t0+30ms, plus 30ms less 10ms)", b.First, want)
	}
	if !fc.Now().Equal(t0.Add(60 * time.Millisecond)) {
		t.Fatalf("clock %v, want t0+60ms after two round trips", fc.Now())
	}
	if !s.Take(fc.Now(), 1) {
		t.Fatalf("slot at %v refused on arrival at %v", b.First, fc.Now())
	}
}

func TestSlotsOwnPauseHoldsHereWhenEtcdFails(t *testing.T) {
	s, fc, mb, events := openSlots(t, fleet.Config{})
	mb.mu.Lock()
	mb.failPause = errors.New("etcd unreachable")
	mb.mu.Unlock()
	until := t0.Add(time.Second)
	if _, err := s.Pause(context.Background(), until); err == nil {
		t.Fatal("a pause etcd refused reported written")
	}
	if e := next(t, events); e.Kind != fleet.EventPaused || e.Pause.Revision != 0 {
		t.Fatalf("event %+v, want a local pause (revision 0)", e)
	}
	if st := s.Stats(); !st.PausedUntil.Equal(until.Add(fleet.DefaultMaxSkew)) {
		t.Fatalf("paused until %v here", st.PausedUntil)
	}
	_ = fc
}

// TestSlotsNodeAtTheRatesPaceGrowsItsBlocks has a node ask for a slot at
// the rate's own pace, its requests further apart than a slot's grace (at
// 10/s, 100 ms apart against a 20 ms grace): it is busy, not sparse, and
// its blocks grow, where it used to reserve one slot a request.
func TestSlotsNodeAtTheRatesPaceGrowsItsBlocks(t *testing.T) {
	s, fc, mb, _ := openSlots(t, fleet.Config{})
	const requests = 30
	for i := range requests {
		for {
			changed := s.Changed()
			at, ok := s.Earliest(fc.Now(), 1)
			if ok {
				if at.After(fc.Now()) {
					fc.Set(at)
				}
				if s.Take(fc.Now(), 1) {
					break
				}
				continue
			}
			select {
			case <-changed:
			case <-time.After(10 * time.Second): // a guard against a hang
				t.Fatalf("request %d: no grant came", i)
			}
		}
		fc.Advance(100 * time.Millisecond) // the node's own budget, at the rate
	}
	st := s.Stats()
	t.Logf("%d reservations for %d requests; stats %+v", mb.callCount(), requests, st)
	if n := mb.callCount(); n > requests/3 {
		t.Fatalf("%d reservations for %d requests at the rate's pace, want at most %d (blocks that grow); stats %+v", n, requests, requests/3, st)
	}
	if st.Used != requests {
		t.Fatalf("stats %+v, want %d used", st, requests)
	}
}
