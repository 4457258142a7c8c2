package fleet

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/auditd/auditd/clock"
)

// DefaultPrefix is where a Store keeps its keys unless told otherwise.
const DefaultPrefix = "/auditd/fleet/"

// Store is the fleet's shared budget state in etcd: per key (a source, or a
// gateway group), the GCRA arrival time that slot reservations advance and
// the pause-until that every node watches. It is safe for concurrent use by
// any number of goroutines, and any number of Stores (one per node) may share
// one etcd cluster.
type Store struct {
	client *clientv3.Client
	clock  clock.Clock
	prefix string

	mu    sync.Mutex
	known map[string]state // last state seen per key: the first CAS of a reservation needs no read
}

// state is a key's arrival time and the revision it was last written at.
type state struct {
	tat int64  // unix nanoseconds; 0 when the key has never been written
	rev int64  // the key's ModRevision; 0 when it does not exist
	by  string // a pause's: the node whose breaker opened it (Pause.Breaker)
}

// NewStore returns a Store on client that keeps its keys under prefix
// (DefaultPrefix when empty) and times Watch's retries on c.
func NewStore(client *clientv3.Client, c clock.Clock, prefix string) *Store {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	return &Store{client: client, clock: c, prefix: prefix, known: make(map[string]state)}
}

// Block is a run of slots granted to one node: Count slots at First,
// First+Interval, ..., in the fleet's time base. No other node is ever
// granted a slot inside [First, First+Count*Interval).
type Block struct {
	Key      string
	First    time.Time
	Interval time.Duration
	Count    int
	// Revision is the etcd revision the block was granted at: the key's
	// ModRevision after the compare-and-swap, unique to this grant.
	Revision int64
}

// Slot returns the time of slot i (0 <= i < Count).
func (b Block) Slot(i int) time.Time { return b.First.Add(time.Duration(i) * b.Interval) }

// End returns when the block's span ends: one interval after its last slot,
// where the next grant may start.
func (b Block) End() time.Time { return b.Slot(b.Count) }

func (s *Store) tatKey(key string) string   { return s.prefix + "budget/" + key + "/tat" }
func (s *Store) pauseKey(key string) string { return s.prefix + "budget/" + key + "/pause" }

// Reserve grants count slots of key spaced interval apart, starting at the
// key's arrival time or at from, whichever is later, and advances the
// arrival time past them. From is the caller's wall time: when it could use
// its first slot (now, plus the time the grant takes to reach it). The advance is a compare-and-swap on the key's
// ModRevision, retried on conflict, so two calls, on any nodes, never get
// overlapping blocks. It fails when etcd cannot commit (no quorum, no
// connection) before ctx ends; nothing is granted then.
func (s *Store) Reserve(ctx context.Context, key string, from time.Time, count int, interval time.Duration) (Block, error) {
	if count < 1 || interval <= 0 {
		return Block{}, fmt.Errorf("reserve %s: count %d, interval %v: %w", key, count, interval, ErrInvalidBlock)
	}
	k := s.tatKey(key)
	cur := s.cached(k)
	for {
		first := max(cur.tat, from.UnixNano())
		next := first + int64(count)*int64(interval)
		resp, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(k), "=", cur.rev)).
			Then(clientv3.OpPut(k, strconv.FormatInt(next, 10))).
			Else(clientv3.OpGet(k)).
			Commit()
		if err != nil {
			return Block{}, fmt.Errorf("reserve %s: %w", key, err)
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			s.remember(k, state{tat: next, rev: rev})
			return Block{Key: key, First: time.Unix(0, first), Interval: interval, Count: count, Revision: rev}, nil
		}
		if cur, err = decodeState(resp.Responses[0].GetResponseRange().Kvs); err != nil {
			return Block{}, fmt.Errorf("reserve %s: %w", key, err)
		}
		s.remember(k, cur)
	}
}

func (s *Store) cached(k string) state {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.known[k]
}

// remember keeps st for k unless a later revision is already known.
func (s *Store) remember(k string, st state) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.rev >= s.known[k].rev {
		s.known[k] = st
	}
}
