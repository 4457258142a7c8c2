package limiter

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// Request describes one attempt to be admitted.
type Request struct {
	// Cost is the units of work the request spends (1 when zero).
	Cost int
	// Deadline, on the limiter's clock, is when to give up and shed. Zero
	// means wait as long as ctx allows.
	Deadline time.Time
	// StopAtReopen makes Acquire return ErrStillDown when, while the
	// request waits at an open breaker, a probe fails and the breaker
	// opens again; the caller counts that as a try of its own.
	StopAtReopen bool
	// NotBefore holds the request back for its own retry backoff (a
	// Verdict's Wait after a 5xx or transport error); the wait is reported
	// under GateBackoff.
	NotBefore time.Time
	// Fallback says the caller has another answer (a last good copy):
	// when the breaker would hold the request (open, or half-open with
	// every probe out), Acquire returns a *DownError at once, also while
	// the request waits out its own backoff, rather than wait for a source
	// known to be down. Past the cooldown the request is a probe like any.
	Fallback bool
	// DownAfter, when above zero, makes Acquire return a *DownError at
	// once while the breaker is open after that many failed probes in a
	// row: a source that stays down ends its requests without a wait.
	DownAfter int
	// DownFor, when above zero, does the same once the breaker has been
	// open that long since it last closed, however many probes failed
	// meanwhile: with short cooldowns the probes come often, and an
	// outage is bounded by its length, not by their number.
	DownFor time.Duration
}

// Wait is one spell a request spent held at one gate: a wait event.
type Wait struct {
	Gate Gate
	// Planned is the wait the gate announced when the spell began; 0 when
	// the gate gives no estimate (a concurrency slot or probe frees when
	// another request ends).
	Planned time.Duration
	// Actual is the time the spell lasted.
	Actual time.Duration
}

// Permit is the result of Acquire: what happened to the request and, when it
// was admitted, the concurrency slot it holds until Observe or Release.
type Permit struct {
	Source string
	Group  string
	Cost   int
	// Admitted is when the request passed every gate (zero when it did not).
	Admitted time.Time
	// SendBy, set when a fleet slot admitted the request (Share), is the
	// latest it may leave: Admitted plus the Shared's Lag. A request not
	// on its way by then would reach the upstream outside the time its
	// slot was spaced for, and must not be sent. Zero without a fleet.
	SendBy time.Time
	// Probe is true when the breaker was half-open and this request is one
	// of its probes (the dispatch event's Cause "probe").
	Probe bool
	// Waits are the gates the request waited at, in order.
	Waits []Wait
	// Breaker holds the transition this Acquire caused (open→half_open),
	// if any. Record it even when Acquire returned an error.
	Breaker []Transition
	// InFlight is how many of the source's requests were admitted and not
	// yet observed or released when this one was admitted, itself
	// included: those the server may have in flight with it, and what the
	// registry's concurrency learning reads a refusal against
	// (registry.Observation.InFlight). Requests that hold a slot while they
	// wait at the pause or rate gates are not among them.
	InFlight int

	l       *Limiter
	src     *source
	budget  *Budget // the budget that admitted it
	admit   int64   // the admission in budget's time
	at      int64   // where budget counts it (admit, until Sent)
	slot    bool    // holds a concurrency slot
	probe   bool    // holds a probe of breaker generation gen
	gen     uint64  // breaker generation at admission
	once    sync.Once
	started time.Time // when the current wait spell began
	// arrival orders the request among those waiting at its source's
	// concurrency gate and its budget's queue: stamped when it first
	// reaches the concurrency gate, kept when it has to go back.
	arrival uint64
	waiting bool // its arrival is in src.waiting
}

// Acquire waits until source id may send a request of req.Cost, passing, in
// order, the request's own backoff, the breaker, a concurrency slot, the
// pause and the rate gates, all re-checked together at the moment of
// admission. It returns a non-nil *Permit in every case, carrying the waits
// to record.
//
// It sheds with a *ShedError (errors.Is ErrShed) as soon as a gate's wait is
// known to end after req.Deadline, or when the deadline passes at a gate
// with no estimate. A cost above capacity is ErrCostExceedsCapacity at once.
// When ctx ends first it returns ctx.Err(). In all error cases the permit
// holds no slot: nothing leaks.
//
// It is over a hundred lines on purpose: one loop that checks every gate
// under the source's lock, in one order, and on its way out gives back
// what it took (leave). Split across functions, which gate a wait is at,
// and what the permit holds when it leaves, would be state passed between
// them; the steps with logic of their own are methods (down, slotFor,
// beginWait, endWait).
func (l *Limiter) Acquire(ctx context.Context, id string, req Request) (*Permit, error) {
	s, err := l.source(id)
	if err != nil {
		return &Permit{Source: id}, err
	}
	if req.Cost == 0 {
		req.Cost = 1
	}
	s.mu.Lock()
	p := &Permit{Source: id, Group: s.cfg.Group, Cost: req.Cost, l: l, src: s}
	b := s.budget
	b.mu.Lock()
	err = b.checkCost(req.Cost)
	b.mu.Unlock()
	sh := l.sharedOf(id, s.cfg)
	s.mu.Unlock()
	if err != nil {
		return p, fmt.Errorf("acquire %s: %w", id, err)
	}
	if err := checkShared(sh, id, req.Cost); err != nil {
		return p, err
	}

	var (
		queued   *Budget // budget whose queue holds ticket
		ticket   uint64
		deadline clock.Timer
		openGen  uint64 // breaker generation this request first waited at while open; 0 when none
	)
	leave := func() { // give back everything held while waiting
		if queued != nil {
			queued.mu.Lock()
			queued.dequeue(ticket)
			queued.mu.Unlock()
			queued = nil
		}
		s.mu.Lock()
		s.unqueue(p)
		p.releaseLocked()
		s.mu.Unlock()
	}
	defer func() {
		if deadline != nil {
			deadline.Stop()
		}
	}()

	for {
		if err := ctx.Err(); err != nil {
			leave()
			p.endWait(l.clock.Now())
			return p, err
		}
		s.mu.Lock()
		now := l.clock.Now()
		gate, wait := Gate(""), time.Duration(0)
		var srcCh, budCh, shCh <-chan struct{}

		if p.probe && s.breaker.gen != p.gen {
			// Another probe decided the breaker while this one queued; this
			// request is no longer a probe and must pass the breaker afresh.
			p.probe = false
		}
		if !p.probe && (req.Fallback || req.DownAfter > 0 || req.DownFor > 0) {
			if err := s.down(now, req, p); err != nil {
				s.mu.Unlock()
				leave()
				p.endWait(now)
				return p, err
			}
		}
		if now.Before(req.NotBefore) {
			gate, wait = GateBackoff, req.NotBefore.Sub(now)
		} else if !p.probe {
			pass, w, t := s.breaker.check(now, s.cfg, id)
			if t != nil {
				p.Breaker = append(p.Breaker, *t)
				s.broadcast()
			}
			if !pass {
				gate, wait = GateBreaker, w
				if s.breaker.state == BreakerOpen {
					if openGen == 0 {
						openGen = s.breaker.gen
					} else if req.StopAtReopen && s.breaker.gen != openGen {
						s.mu.Unlock()
						leave()
						p.endWait(now)
						return p, ErrStillDown
					}
				}
			} else if s.breaker.state == BreakerHalfOpen {
				s.breaker.probes++
				p.probe, p.gen = true, s.breaker.gen
			}
		}
		if gate == "" && !p.slot {
			// Slots go in arrival order: a slot that frees wakes every
			// waiter, and only the first in line may take it.
			if p.arrival == 0 {
				p.arrival = l.arrivals.Add(1)
			}
			if !s.slotFor(p) {
				gate = GateConcurrency
			}
		}
		if gate != "" && (p.slot || p.probe || queued != nil || p.waiting) && gate != GateConcurrency {
			// Blocked at a source gate: hold nothing that others could use.
			s.mu.Unlock()
			leave()
			s.mu.Lock()
		}
		if gate == "" {
			b := s.budget
			b.mu.Lock()
			if queued != b {
				if queued != nil {
					queued.mu.Lock() // only after a Configure swapped budgets
					queued.dequeue(ticket)
					queued.mu.Unlock()
				}
				queued, ticket = b, p.arrival
				b.enqueue(ticket)
			}
			bnow := b.now()
			at, g := b.earliest(bnow, int64(req.Cost))
			switch {
			case g != "":
				gate, wait = g, time.Duration(at-bnow)
			case b.queue[0] != ticket:
				gate = GateRate
			}
			if gate == "" {
				// The fleet gate: the budget admits; the node needs a slot.
				if sh = l.sharedOf(id, s.cfg); sh != nil {
					// Checked again: a cut of the fleet's rate since this
					// request queued may have spaced the slots past its
					// cost's grace, and no slots would ever serve it.
					if err := checkShared(sh, id, req.Cost); err != nil {
						b.mu.Unlock()
						s.mu.Unlock()
						leave()
						p.endWait(now)
						return p, err
					}
					var took bool
					if took, wait, shCh = takeShared(sh, now, req.Cost); !took {
						gate = GateFleet
					} else {
						p.SendBy = now.Add(sh.Lag())
					}
				}
			}
			if gate == "" {
				b.commit(bnow, int64(req.Cost))
				b.dequeue(ticket)
				b.mu.Unlock()
				s.admit(p)
				s.mu.Unlock()
				p.budget, p.admit, p.at = b, bnow, bnow
				p.Admitted = now
				p.Probe = p.probe
				p.endWait(now)
				return p, nil
			}
			budCh = b.watch()
			b.mu.Unlock()
		}
		srcCh = s.watch()
		s.mu.Unlock()

		p.beginWait(gate, wait, now)
		if !req.Deadline.IsZero() && (!now.Before(req.Deadline) || (wait > 0 && now.Add(wait).After(req.Deadline))) {
			leave()
			p.endWait(now)
			return p, &ShedError{Gate: gate, Wait: wait}
		}

		var timer clock.Timer
		var timerC <-chan time.Time
		if wait > 0 {
			timer = l.clock.NewTimer(wait)
			timerC = timer.C()
		} else if !req.Deadline.IsZero() && deadline == nil {
			deadline = l.clock.NewTimer(req.Deadline.Sub(now))
		}
		var deadlineC <-chan time.Time
		if deadline != nil {
			deadlineC = deadline.C()
		}
		select {
		case <-timerC:
		case <-deadlineC:
			deadline = nil
		case <-srcCh:
		case <-budCh:
		case <-shCh:
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// slotFor gives p a concurrency slot when one is free and no request that
// arrived before p waits for one; otherwise it queues p in arrival order.
// The caller holds s.mu.
func (s *source) slotFor(p *Permit) bool {
	if !p.waiting {
		s.waiting = insertSorted(s.waiting, p.arrival)
		p.waiting = true
	}
	ahead, _ := slices.BinarySearch(s.waiting, p.arrival)
	if s.inFlight+ahead >= s.slots() {
		return false
	}
	s.unqueue(p)
	s.inFlight++
	p.slot = true
	return true
}

// unqueue takes p out of the concurrency gate's queue; those behind it
// move up. The caller holds s.mu.
func (s *source) unqueue(p *Permit) {
	if !p.waiting {
		return
	}
	p.waiting = false
	if i, found := slices.BinarySearch(s.waiting, p.arrival); found {
		s.waiting = slices.Delete(s.waiting, i, i+1)
		s.broadcast()
	}
}

// down moves the breaker on its clock and returns a *DownError when it
// holds the request and req asks not to wait there (Request.Fallback,
// Request.DownAfter, Request.DownFor). The caller holds s.mu.
func (s *source) down(now time.Time, req Request, p *Permit) error {
	pass, wait, t := s.breaker.check(now, s.cfg, s.id)
	if t != nil {
		p.Breaker = append(p.Breaker, *t)
		s.broadcast()
	}
	b := &s.breaker
	if pass {
		return nil
	}
	stayed := b.state == BreakerOpen &&
		(req.DownAfter > 0 && b.reopens >= req.DownAfter || req.DownFor > 0 && now.Sub(b.downSince) >= req.DownFor)
	if !req.Fallback && !stayed {
		return nil
	}
	return &DownError{State: b.state, Reopens: b.reopens, Wait: wait, Since: b.downSince}
}

// beginWait opens or extends a wait spell at gate.
func (p *Permit) beginWait(gate Gate, planned time.Duration, now time.Time) {
	if n := len(p.Waits); n > 0 && p.Waits[n-1].Gate == gate {
		p.Waits[n-1].Actual = now.Sub(p.started)
		return
	}
	p.endWait(now)
	p.Waits = append(p.Waits, Wait{Gate: gate, Planned: planned})
	p.started = now
}

// endWait closes the open wait spell at now.
func (p *Permit) endWait(now time.Time) {
	if n := len(p.Waits); n > 0 {
		p.Waits[n-1].Actual = now.Sub(p.started)
	}
}

// Sent counts the admitted request, in every window of the budget that
// admitted it, at at: when its dispatch is on record (the ledger's stamp),
// instead of when it passed the gates. The request leaves after its record,
// which may have waited for a busy writer or for a disk that refused it, and
// reconciliation (R9) counts each dispatch at its recorded time: counted at
// its admission, a request admitted as an older one's slot freed could sit
// in one window with it by the record, and by the upstream's count. A time
// before the admission, or after the budget's now, counts as the admission
// or now. Call it once the dispatch is durable.
//
// A ledger stamp is wall time, and the budget keeps monotonic time: at is
// read as its lag after the admission, so that only a step of the wall
// clock inside that lag can misplace it.
func (p *Permit) Sent(at time.Time) {
	if p.budget != nil {
		lag := at.Sub(p.Admitted.Round(0)) // Round(0): wall time, as at is
		p.at = p.budget.move(p.at, p.admit+lag.Nanoseconds(), int64(p.Cost))
	}
}

// Release gives back the permit's concurrency slot and probe without an
// outcome (the request was never sent). It is safe to call more than once
// and after Observe.
func (p *Permit) Release() {
	if p.src == nil {
		return
	}
	p.once.Do(func() {
		p.src.mu.Lock()
		p.releaseLocked()
		p.src.mu.Unlock()
	})
}

// releaseLocked returns the slot and probe; the caller holds src.mu.
func (p *Permit) releaseLocked() {
	s := p.src
	if p.slot {
		s.inFlight--
		s.drop(p)
		p.slot = false
		s.broadcast()
	}
	if p.probe {
		s.breaker.probes = max(s.breaker.probes-1, 0)
		p.probe = false
		s.broadcast()
	}
}
