package fleet

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// Open starts the Slots' goroutines: the reservation loop and the pause
// watch. Close stops them.
func (s *Slots) Open() {
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel, s.done = cancel, make(chan struct{})
	pauses := make(chan Pause)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.backend.Watch(ctx, s.cfg.Key, pauses) }) // returns ctx.Err() once closed
	wg.Go(func() { s.follow(ctx, pauses) })
	wg.Go(func() { s.reserveLoop(ctx) })
	go func() {
		wg.Wait()
		close(s.done)
	}()
}

// Close stops the goroutines and waits for them, or for ctx. Slots still held
// are wasted: they are never given back.
func (s *Slots) Close(ctx context.Context) error {
	if s.cancel == nil {
		return nil
	}
	s.cancel()
	select {
	case <-s.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Pause closes the key fleet-wide until until plus MaxSkew (so that no node
// whose clock runs ahead ends it early), applies it here at once, and returns
// the pause in force. When etcd does not take it, the pause still holds
// here (reported with Revision 0) and the error says the fleet has not seen
// it.
func (s *Slots) Pause(ctx context.Context, until time.Time) (Pause, error) {
	return s.PauseFor(ctx, until, "")
}

// PauseFor is Pause on behalf of node breaker's circuit breaker, open until
// until (Store.PauseFor); an empty breaker is a plain Pause.
func (s *Slots) PauseFor(ctx context.Context, until time.Time, breaker string) (Pause, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	until = until.Add(s.cfg.MaxSkew)
	p, err := s.backend.PauseFor(ctx, s.cfg.Key, until, breaker)
	if err != nil {
		s.learn(Pause{Key: s.cfg.Key, Until: until, Breaker: breaker})
		return Pause{}, fmt.Errorf("pause %s fleet-wide: %w", s.cfg.Key, err)
	}
	s.learn(p)
	return p, nil
}

// follow applies the pauses the watch reports until ctx ends.
func (s *Slots) follow(ctx context.Context, pauses <-chan Pause) {
	for {
		select {
		case p := <-pauses:
			s.learn(p)
		case <-ctx.Done():
			return
		}
	}
}

// learn applies p when it lengthens the pause kept here, dropping the held
// slots before it, and reports it.
func (s *Slots) learn(p Pause) {
	u := p.Until.UnixNano()
	s.mu.Lock()
	if p.Until.IsZero() || u <= s.pause {
		s.mu.Unlock()
		return
	}
	s.pause = u
	now := s.clock.Now()
	s.expire(now.UnixNano())
	s.broadcast()
	s.mu.Unlock()
	s.notify(Event{Kind: EventPaused, Key: s.cfg.Key, At: now, Pause: p})
}

// reserveLoop reserves a block whenever the node needs one, until ctx ends.
func (s *Slots) reserveLoop(ctx context.Context) {
	for {
		wait, wake, again := s.reserveNext(ctx)
		if ctx.Err() != nil {
			return
		}
		if !again && s.sleep(ctx, wait, wake) != nil {
			return
		}
	}
}

// reserveNext is one turn of the reservation loop: it reserves a block when
// one is due and reports again, to look once more at once; otherwise it
// reports how long to wait before the next turn (0: until woken) and
// whether a taker's poke may end the wait early.
func (s *Slots) reserveNext(ctx context.Context) (wait time.Duration, wake, again bool) {
	s.mu.Lock()
	now := s.clock.Now()
	s.expire(now.UnixNano())
	wait, need := s.due(now.UnixNano())
	count := 0
	if need {
		count = s.size(now.UnixNano())
	}
	cut := s.stats.CutOff
	s.mu.Unlock()

	if !need {
		return wait, true, false
	}
	b, from, err := s.reserve(ctx, count)
	if ctx.Err() != nil {
		return 0, false, false
	}
	if err != nil {
		s.mu.Lock()
		s.retry = true // size counted the run as served: due would wait for a taker
		s.mu.Unlock()
		if !cut {
			s.setCut(true)
			s.notify(Event{Kind: EventCutOff, Key: s.cfg.Key, At: s.clock.Now(), Err: err})
		}
		return s.cfg.Retry, false, false
	}
	if cut {
		s.setCut(false)
		s.notify(Event{Kind: EventRejoined, Key: s.cfg.Key, At: s.clock.Now()})
	}
	// Reported before it is held: a Notify that records the grant
	// durably has it on record before any of its slots is used.
	s.notify(Event{Kind: EventReserved, Key: s.cfg.Key, At: s.clock.Now(), Block: b})
	s.add(b, from)
	return 0, false, true
}

// due reports whether a reservation is needed now and, when not, how long
// until it will be (0: not until a taker asks). The caller holds s.mu.
func (s *Slots) due(now int64) (time.Duration, bool) {
	if s.need > 0 || s.retry {
		return 0, true
	}
	if s.usedRun < 2 {
		// Idle, or sparse: one slot used since the last grant is no sign
		// of demand to reserve ahead for. Hold nothing more (to waste)
		// until a taker asks.
		return 0, false
	}
	last, ok := s.lastLocked()
	if !ok {
		return 0, true
	}
	wait := last - s.ahead() - now
	return time.Duration(wait), wait <= 0
}

// size returns how many slots to reserve at now, and starts counting the
// run the reservation will serve. A node asked for slots after a spell
// with none (idleAfter past its last slot) starts again from what the
// taker asks, as a new node does: sparse demand takes one slot a request
// and wastes none. A node whose last run wasted slots asks for a
// little more than it used, but no less than half its last grant (a taker
// woken late once does not collapse its blocks); one that used at least
// half asks for twice as many, up to Block's worth of the rate, or, when
// it shares the key and busyStreak reservations in a row found it busy,
// for Block's worth at once. The Store caps either at the node's share.
// The caller holds s.mu.
func (s *Slots) size(now int64) int {
	dry := s.need > 0 && s.count() == 0
	s.streak++
	if !s.busy(now, dry) {
		s.streak = 0
	}
	switch {
	case dry && now >= s.lastSlot+s.idleAfter():
		s.want, s.wasted = 1, false
	case s.lostRun > 0:
		s.want, s.wasted = max(s.usedRun+s.usedRun/4+1, s.want/2), true
	case s.behind && !s.wasted && s.streak >= busyStreak:
		s.want = s.max
	case s.usedRun > 0 && s.usedRun >= s.want/2:
		s.want *= 2
	}
	s.want = min(max(s.want, s.need, 1), s.max)
	s.usedRun, s.lostRun, s.lateRun = 0, 0, 0
	return s.want
}

// busyStreak is how many reservations in a row must find a sharing node
// busy before its blocks jump: a burst of requests (a source's
// concurrency) looks busy for one or two.
const busyStreak = 2

// busy reports whether the node's demand kept up with its slots since the
// last reservation: it took them less than half a grace after their times
// and wasted none, and either asked again, holding none, within an
// interval of its last slot (or half a grace, for a taker woken a little
// late at a high rate), or, reserving ahead, used at least half of what it
// asked for. The caller holds s.mu.
func (s *Slots) busy(now int64, dry bool) bool {
	onTime := s.usedRun > 0 && s.lostRun == 0 && s.lateRun < int64(s.cfg.Grace)/2
	if dry {
		return onTime && now < s.lastSlot+max(s.interval, int64(s.cfg.Grace)/2)
	}
	return onTime && s.usedRun >= 2 && s.usedRun >= s.want/2
}

// idleAfter is how long after its last slot a node that asks again counts
// as coming back from a spell with no demand: a grace, and two of the
// rate's intervals. At a low rate the slots are further apart than the
// grace, and a node that asks at the rate's own pace (its budget admits a
// request an interval after the last) is busy, not idle: it keeps growing
// its blocks, rather than reserving one slot a request.
func (s *Slots) idleAfter() int64 {
	return int64(s.cfg.Grace) + 2*s.interval
}

// reserve asks for count slots from half a grace before the grant should
// reach this node (now plus the last reservation's round trip): a block's
// first slot is then due on arrival, so a request waiting for it goes at
// once, and is not past its grace unless the round trip grew by more than
// half of it. It returns the block and the time it was asked from.
func (s *Slots) reserve(ctx context.Context, count int) (Block, time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	s.mu.Lock()
	early := max(s.trip-s.cfg.Grace/2, 0)
	a := Ask{Node: s.cfg.Node, Count: count, Interval: time.Duration(s.interval), Full: s.max, Least: max(s.need, 1)}
	s.mu.Unlock()
	start := s.clock.Now()
	a.From = start.Add(early)
	b, err := s.backend.Reserve(ctx, s.cfg.Key, a)
	if err == nil {
		s.mu.Lock()
		s.trip = min(s.clock.Now().Sub(start), s.cfg.Lead)
		s.mu.Unlock()
	}
	return b, a.From, err
}

// add takes b, asked for from from, into the held slots. A block that
// starts later than from, than this node's last block's end and than the
// pause came after other nodes' slots: the key is shared.
func (s *Slots) add(b Block, from time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = append(s.held, b)
	s.want = min(s.want, b.Count) // a grant the Store capped
	s.behind = b.First.UnixNano() > max(from.UnixNano(), s.end, s.pause)
	s.end = b.End().UnixNano()
	s.span = int64(b.Count) * b.Interval.Nanoseconds()
	s.lastSlot = b.Slot(b.Count - 1).UnixNano()
	s.stats.Blocks++
	s.stats.Reserved += int64(b.Count)
	s.need, s.retry = 0, false
	s.expire(s.clock.Now().UnixNano())
	s.broadcast()
}

func (s *Slots) setCut(cut bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stats.CutOff = cut
	s.broadcast()
}

// sleep waits d (forever when d <= 0), or less when woken and wake is set;
// it returns ctx.Err() once ctx ends.
func (s *Slots) sleep(ctx context.Context, d time.Duration, wake bool) error {
	var timer clock.Timer
	var fire <-chan time.Time
	if d > 0 {
		timer = s.clock.NewTimer(d)
		defer timer.Stop()
		fire = timer.C()
	}
	var kick <-chan struct{}
	if wake {
		kick = s.kick
	}
	select {
	case <-fire:
	case <-kick:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func (s *Slots) notify(e Event) {
	if s.cfg.Notify != nil {
		s.cfg.Notify(e)
	}
}
