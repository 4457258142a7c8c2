package fleet

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

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

	smu      sync.Mutex
	sessions map[int]*concurrency.Session // by lease TTL in seconds: the campaigns' (session)
	terms    map[string]chan struct{}     // by key: held by the learner campaigning or leading (campaign)
}

// state is a key's time (arrival time, or pause-until) and the revision it
// was last written at.
type state struct {
	tat int64  // unix nanoseconds; 0 when the key has never been written
	rev int64  // the key's ModRevision; 0 when it does not exist
	by  string // a pause's: the node whose breaker opened it (Pause.Breaker)
	// The arrival time's: the nodes that reserved lately, each with the
	// end of its last grant.
	sharers []sharer
}

// sharer is a node that reserved a key's slots: where its last grant ended
// (unix nanoseconds) and how many slots it held.
type sharer struct {
	node  string
	end   int64
	count int
}

// ShareSpan is how long after its last grant ends a node still counts as
// sharing a key: long enough that a busy node, which reserves before its
// held slots run out, is always counted, and one whose demand stopped is
// soon not.
const ShareSpan = 2 * time.Second

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

// Ask is one reservation: what a node asks Reserve for.
type Ask struct {
	// Node names the asking node in the key's state, where it counts as
	// sharing the key for ShareSpan after its grant ends; empty: the ask
	// is not recorded.
	Node string
	// From is the asking node's wall time when it could use its first
	// slot: now, plus the time the grant takes to reach it.
	From     time.Time
	Count    int // slots wanted
	Interval time.Duration
	// Full is the most slots a node alone is granted (a Block's worth of
	// the rate). While other nodes share the key a grant holds at most
	// what their last grants left of Full, but never fewer than Full over
	// the nodes sharing, than Least (the most a taker asks for at once) or
	// one. Zero: Count, uncapped.
	Full  int
	Least int
}

// grant returns how many slots a is granted while others share the key.
func (a Ask) grant(others []sharer) int {
	if len(others) == 0 || a.Full == 0 {
		return a.Count
	}
	left := a.Full
	for _, sh := range others {
		left -= sh.count
	}
	return min(a.Count, max(left, a.Full/(len(others)+1), a.Least, 1))
}

// Reserve grants slots of key spaced a.Interval apart, starting at the
// key's arrival time or at a.From, whichever is later, and advances the
// arrival time past them: a.Count of them, fewer when other nodes share
// the key (Ask.Full). The advance is a compare-and-swap on the key's
// ModRevision, retried on conflict, so two calls, on any nodes, never get
// overlapping blocks, and the nodes counted as sharing the key are those
// of the state the grant was made on. It fails when etcd cannot commit
// (no quorum, no connection) before ctx ends; nothing is granted then.
func (s *Store) Reserve(ctx context.Context, key string, a Ask) (Block, error) {
	if a.Count < 1 || a.Interval <= 0 {
		return Block{}, fmt.Errorf("reserve %s: count %d, interval %v: %w", key, a.Count, a.Interval, ErrInvalidBlock)
	}
	k := s.tatKey(key)
	cur := s.cached(k)
	from := a.From.UnixNano()
	for {
		others := cur.sharersAfter(from-int64(ShareSpan), a.Node)
		count := a.grant(others)
		first := max(cur.tat, from)
		next := state{tat: first + int64(count)*int64(a.Interval), sharers: others}
		if a.Node != "" {
			next.sharers = append(next.sharers, sharer{node: a.Node, end: next.tat, count: count})
		}
		rev, now, err := s.putAt(ctx, k, cur.rev, encodeTat(next))
		if err != nil {
			return Block{}, fmt.Errorf("reserve %s: %w", key, err)
		}
		if rev != 0 {
			next.rev = rev
			s.remember(k, next)
			return Block{Key: key, First: time.Unix(0, first), Interval: a.Interval, Count: count, Revision: next.rev}, nil
		}
		if cur, err = decodeTat(now); err != nil {
			return Block{}, fmt.Errorf("reserve %s: %w", key, err)
		}
		s.remember(k, cur)
	}
}

// putAt puts val at k when k's ModRevision is still rev (0: k does not
// exist), and every guard holds: the compare-and-swap every shared value
// is written by. It returns the revision it wrote at, or 0 and k as it now
// stands.
func (s *Store) putAt(ctx context.Context, k string, rev int64, val string, guard ...clientv3.Cmp) (int64, []*mvccpb.KeyValue, error) {
	resp, err := s.client.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", rev)}, guard...)...).
		Then(clientv3.OpPut(k, val)).
		Else(clientv3.OpGet(k)).
		Commit()
	switch {
	case err != nil:
		return 0, nil, err
	case resp.Succeeded:
		return resp.Header.Revision, nil, nil
	}
	return 0, resp.Responses[0].GetResponseRange().Kvs, nil
}

// sharersAfter returns, in a new slice, the sharers other than node whose
// last grant ended after since.
func (st state) sharersAfter(since int64, node string) []sharer {
	var out []sharer
	for _, sh := range st.sharers {
		if sh.end > since && sh.node != node {
			out = append(out, sh)
		}
	}
	return out
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

// encodeTat is an arrival-time key's value: the arrival time in unix
// nanoseconds, then, for each node sharing the key, a space, the end of its
// last grant in unix nanoseconds, a colon, the grant's slots, a colon and
// the node's name (path-escaped). A build before sharers were kept reads
// the first field alone, and writes it alone; such a key reads as shared
// by nobody.
func encodeTat(st state) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(st.tat, 10))
	for _, sh := range st.sharers {
		fmt.Fprintf(&b, " %d:%d:%s", sh.end, sh.count, url.PathEscape(sh.node))
	}
	return b.String()
}

// decodeTat reads an arrival-time key (encodeTat) from a range response;
// an absent key is the zero state.
func decodeTat(kvs []*mvccpb.KeyValue) (state, error) {
	if len(kvs) == 0 {
		return state{}, nil
	}
	fields := strings.Fields(string(kvs[0].Value))
	corrupt := fmt.Errorf("key %s: %w", kvs[0].Key, ErrCorrupt)
	if len(fields) == 0 {
		return state{}, corrupt
	}
	t, err := strconv.ParseInt(fields[0], 10, 64)
	if err != nil {
		return state{}, corrupt
	}
	st := state{tat: t, rev: kvs[0].ModRevision}
	for _, f := range fields[1:] {
		sh, ok := decodeSharer(f)
		if !ok {
			return state{}, corrupt
		}
		st.sharers = append(st.sharers, sh)
	}
	return st, nil
}

// decodeSharer reads one sharer of encodeTat: end:count:node.
func decodeSharer(f string) (sharer, bool) {
	e, rest, _ := strings.Cut(f, ":")
	c, n, _ := strings.Cut(rest, ":")
	end, err1 := strconv.ParseInt(e, 10, 64)
	count, err2 := strconv.Atoi(c)
	node, err3 := url.PathUnescape(n)
	if err1 != nil || err2 != nil || err3 != nil || node == "" {
		return sharer{}, false
	}
	return sharer{node: node, end: end, count: count}, true
}
