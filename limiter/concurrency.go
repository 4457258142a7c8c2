package limiter

import "fmt"

// SetConcurrency sets how many requests to source id may be in flight at
// once, in place of its Config.Concurrency, until set again (a Configure
// keeps it). n of 0 goes back to the configured slots. A rise admits
// waiters at once; a cut takes no slot back: requests in flight finish,
// and the next one waits until fewer than n are. The caller (the registry's
// concurrency learning) keeps n within what the operator configured.
func (l *Limiter) SetConcurrency(id string, n int) error {
	if n < 0 {
		return fmt.Errorf("set concurrency of %s to %d: %w", id, n, ErrInvalidConfig)
	}
	s, err := l.source(id)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.learned != n {
		s.learned = n
		s.broadcast() // waiters at the concurrency gate look again
	}
	return nil
}

// Concurrency returns the slots source id has now: what SetConcurrency
// set, else its configured Concurrency.
func (l *Limiter) Concurrency(id string) (int, error) {
	s, err := l.source(id)
	if err != nil {
		return 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.slots(), nil
}

// slots is how many requests may be in flight. The caller holds s.mu.
func (s *source) slots() int {
	if s.learned > 0 {
		return s.learned
	}
	return s.cfg.Concurrency
}

// admit counts p, which passed every gate, among the requests in flight.
// The caller holds s.mu.
func (s *source) admit(p *Permit) {
	s.admitted++
	p.InFlight = s.admitted
}

// drop takes p out of the requests in flight as its slot is returned; a
// permit that was never admitted was never counted. The caller holds s.mu.
func (s *source) drop(p *Permit) {
	if p.InFlight > 0 {
		s.admitted--
	}
}
