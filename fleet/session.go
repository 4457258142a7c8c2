package fleet

import (
	"context"
	"fmt"

	"go.etcd.io/etcd/client/v3/concurrency"
)

// session returns this node's etcd session whose lease lives ttl seconds,
// shared by every key's campaign (Learner): one lease and one keepalive a
// node, whatever the number of keys, as every key takes the default TTL. A
// session whose lease was lost is replaced by a new one. The lease is
// granted on ctx; its keepalive lives until Release or until the client
// closes.
func (s *Store) session(ctx context.Context, ttl int) (*concurrency.Session, error) {
	s.smu.Lock()
	defer s.smu.Unlock()
	if sess := s.sessions[ttl]; sess != nil {
		select {
		case <-sess.Done():
		default:
			return sess, nil
		}
	}
	// Bounded: without a quorum a grant waits for ever, and every other
	// key's campaign and Release wait on smu behind it.
	gctx, cancel := context.WithTimeout(ctx, DefaultTimeout)
	defer cancel()
	lease, err := s.client.Grant(gctx, int64(ttl))
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	sess, err := concurrency.NewSession(s.client, concurrency.WithLease(lease.ID), concurrency.WithTTL(ttl))
	if err != nil {
		return nil, fmt.Errorf("session: %w", err)
	}
	if s.sessions == nil {
		s.sessions = make(map[int]*concurrency.Session)
	}
	s.sessions[ttl] = sess
	return sess, nil
}

// campaign waits until no other learner of key on this Store campaigns or
// leads, and returns the function that lets the next one: learners of one
// Store share its session, and two campaigns of one session for one key
// share one election key. A second learner (a node remaking a key's share
// when its ceiling changed) would find itself elected at once, and the
// first's resign would then delete the key and elect another node while
// the second still leads: two learners raising one limit.
func (s *Store) campaign(ctx context.Context, key string) (func(), error) {
	s.smu.Lock()
	if s.terms == nil {
		s.terms = make(map[string]chan struct{})
	}
	ch := s.terms[key]
	if ch == nil {
		ch = make(chan struct{}, 1)
		s.terms[key] = ch
	}
	s.smu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Release revokes this node's sessions' leases, so its campaigns end in
// the fleet at once rather than a lease's TTL later; a node calls it as it
// stops, after its learners. A Learner still running campaigns again on a
// new session.
func (s *Store) Release(ctx context.Context) error {
	s.smu.Lock()
	sessions := s.sessions
	s.sessions = nil
	s.smu.Unlock()
	var first error
	for _, sess := range sessions {
		sess.Orphan() // stop its keepalive; the revoke below ends the lease
		if _, err := s.client.Revoke(ctx, sess.Lease()); err != nil && first == nil {
			first = fmt.Errorf("release: %w", err)
		}
	}
	return first
}
