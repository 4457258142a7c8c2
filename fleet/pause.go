package fleet

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/auditd/auditd/clock"
)

// watchRetry is how long Watch waits before reading a pause again after a
// failed read.
const watchRetry = 100 * time.Millisecond

// Pause is a pause-until of one key as etcd holds it.
type Pause struct {
	Key   string
	Until time.Time // zero when the key was never paused
	// Revision is the etcd revision the pause was written at.
	Revision int64
	// Breaker names the node whose circuit breaker opened the key until
	// Until (PauseFor), empty for any other pause. That node's half-open
	// probe goes at Until; the others hold off BreakerGrace longer, so
	// that one probe, not one a node, finds whether the upstream is back.
	Breaker string
}

// BreakerGrace is how much longer than a breaker's pause the nodes other
// than its own hold off: time for its probe to be answered. When the probe
// succeeds they resume at most this late; when it fails, its node opens
// again and pauses the fleet anew before they resume.
const BreakerGrace = 2 * time.Second

// Pause closes key until until, fleet-wide: in one transaction it writes
// pause-until (keeping a later one already in force) and pushes the arrival
// time to at least until, so no block granted afterwards holds a slot before
// it. Blocks granted earlier are the nodes' to drop, which they do when they
// see the pause (Watch). It returns the pause in force.
//
// Its first try compares against the last state this Store saw, so a pause
// is one round trip unless another node wrote the key meanwhile. Both values
// only grow, so a state seen earlier is a lower bound: when it already
// covers until, nothing needs writing.
func (s *Store) Pause(ctx context.Context, key string, until time.Time) (Pause, error) {
	return s.PauseFor(ctx, key, until, "")
}

// PauseFor is Pause on behalf of node breaker's circuit breaker, which
// opened until until (Pause.Breaker); an empty breaker is a plain Pause. A
// pause already in force as long or longer is kept as it is, with whoever
// wrote it.
func (s *Store) PauseFor(ctx context.Context, key string, until time.Time, breaker string) (Pause, error) {
	tk, pk := s.tatKey(key), s.pauseKey(key)
	u := until.UnixNano()
	tat, cur := s.cached(tk), s.cached(pk)
	for {
		if cur.tat >= u && tat.tat >= u {
			return Pause{Key: key, Until: time.Unix(0, cur.tat), Revision: cur.rev, Breaker: cur.by}, nil
		}
		paused := state{tat: cur.tat, by: cur.by}
		if u > cur.tat {
			paused = state{tat: u, by: breaker}
		}
		resp, err := s.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(tk), "=", tat.rev),
				clientv3.Compare(clientv3.ModRevision(pk), "=", cur.rev)).
			Then(clientv3.OpPut(tk, encodeTat(state{tat: max(tat.tat, u), sharers: tat.sharers})),
				clientv3.OpPut(pk, encodePause(paused))).
			Else(clientv3.OpGet(tk), clientv3.OpGet(pk)).
			Commit()
		if err != nil {
			return Pause{}, fmt.Errorf("pause %s: %w", key, err)
		}
		if resp.Succeeded {
			rev := resp.Header.Revision
			paused.rev = rev
			s.remember(tk, state{tat: max(tat.tat, u), rev: rev, sharers: tat.sharers})
			s.remember(pk, paused)
			return Pause{Key: key, Until: time.Unix(0, paused.tat), Revision: rev, Breaker: paused.by}, nil
		}
		var err1, err2 error
		tat, err1 = decodeTat(resp.Responses[0].GetResponseRange().Kvs)
		cur, err2 = decodeState(resp.Responses[1].GetResponseRange().Kvs)
		if err1 != nil || err2 != nil {
			return Pause{}, fmt.Errorf("pause %s: %w", key, firstErr(err1, err2))
		}
		s.remember(tk, tat)
		s.remember(pk, cur)
	}
}

// Watch sends key's pause on ch: the one in force when it starts, then every
// pause written afterwards, by any node, until ctx ends. A broken watch (a
// compacted revision, a member without a leader) is started again from a
// fresh read, so no pause in force is missed; while etcd is unreachable
// nothing arrives. Watch returns ctx.Err() when ctx ends.
func (s *Store) Watch(ctx context.Context, key string, ch chan<- Pause) error {
	pk := s.pauseKey(key)
	for {
		resp, err := s.client.Get(ctx, pk)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			// No quorum or no connection: read again after a breath.
			if err := clock.Sleep(ctx, s.clock, watchRetry); err != nil {
				return err
			}
			continue
		}
		p, err := pauseOf(key, resp.Kvs)
		if err == nil && !send(ctx, ch, p) {
			return ctx.Err()
		}
		wctx := clientv3.WithRequireLeader(ctx)
		for w := range s.client.Watch(wctx, pk, clientv3.WithRev(resp.Header.Revision+1)) {
			if w.Err() != nil {
				break
			}
			for _, ev := range w.Events {
				if ev.Type != mvccpb.PUT {
					continue
				}
				if p, err := pauseOf(key, []*mvccpb.KeyValue{ev.Kv}); err == nil && !send(ctx, ch, p) {
					return ctx.Err()
				}
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

func send(ctx context.Context, ch chan<- Pause, p Pause) bool {
	select {
	case ch <- p:
		return true
	case <-ctx.Done():
		return false
	}
}

func pauseOf(key string, kvs []*mvccpb.KeyValue) (Pause, error) {
	st, err := decodeState(kvs)
	if err != nil || st.rev == 0 {
		return Pause{Key: key}, err
	}
	return Pause{Key: key, Until: time.Unix(0, st.tat), Revision: st.rev, Breaker: st.by}, nil
}

// encodePause is a pause key's value: its end in unix nanoseconds, then,
// for a breaker's pause, a space and the breaker's node.
func encodePause(st state) string {
	v := strconv.FormatInt(st.tat, 10)
	if st.by != "" {
		v += " " + st.by
	}
	return v
}

// decodeState reads a pause key (pause-until, with the node of a
// breaker's pause) from a range response; an absent key is the zero state.
func decodeState(kvs []*mvccpb.KeyValue) (state, error) {
	if len(kvs) == 0 {
		return state{}, nil
	}
	v, by, _ := strings.Cut(string(kvs[0].Value), " ")
	t, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return state{}, fmt.Errorf("key %s: %w", kvs[0].Key, ErrCorrupt)
	}
	return state{tat: t, rev: kvs[0].ModRevision, by: by}, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
