package fleet

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limit is a key's learned limit as etcd holds it.
type Limit struct {
	Key  string
	Rate Rate // zero when nothing was learned yet
	// By names the node that wrote it.
	By string
	// Revision is the etcd revision it was written at; 0 when never written.
	Revision int64
}

// Outcomes are one node's counts of a key's responses since it began
// sharing the key: cumulative, so a report lost or read twice costs nothing.
type Outcomes struct {
	OK      int64 // answered, not refused
	Refused int64 // 429, or a spent quota
}

// perSecond orders rates: a Rate's limit per second.
func (r Rate) perSecond() float64 {
	if r.Window <= 0 {
		return 0
	}
	return float64(r.Limit) / r.Window.Seconds()
}

func (s *Store) limitKey(key string) string  { return s.prefix + "learn/" + key + "/limit" }
func (s *Store) leaderKey(key string) string { return s.prefix + "learn/" + key + "/leader" }
func (s *Store) obsPrefix(key string) string { return s.prefix + "learn/" + key + "/obs/" }

// Limit reads key's learned limit.
func (s *Store) Limit(ctx context.Context, key string) (Limit, error) {
	resp, err := s.client.Get(ctx, s.limitKey(key))
	if err != nil {
		return Limit{}, fmt.Errorf("limit %s: %w", key, err)
	}
	return limitOf(key, resp.Kvs)
}

// Cut lowers key's learned limit to r, fleet-wide, by a compare-and-swap
// on the key's revision, retried on conflict: it never raises it, so a cut
// by any node wins over a raise written meanwhile. It returns the limit in
// force and whether this call wrote it.
func (s *Store) Cut(ctx context.Context, key string, r Rate, by string) (Limit, bool, error) {
	cur, err := s.Limit(ctx, key)
	for err == nil {
		if cur.Revision != 0 && cur.Rate.perSecond() <= r.perSecond() {
			return cur, false, nil
		}
		var ok bool
		if cur, ok, err = s.swapLimit(ctx, key, cur, r, by); ok {
			return cur, true, nil
		}
	}
	return Limit{}, false, fmt.Errorf("cut %s: %w", key, err)
}

// swapLimit writes r over from when key's limit is still at from's revision;
// otherwise it returns the limit found and false.
func (s *Store) swapLimit(ctx context.Context, key string, from Limit, r Rate, by string) (Limit, bool, error) {
	k := s.limitKey(key)
	val := fmt.Sprintf("%d %d %s", r.Limit, r.Window.Nanoseconds(), by)
	resp, err := s.client.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(k), "=", from.Revision)).
		Then(clientv3.OpPut(k, val)).
		Else(clientv3.OpGet(k)).
		Commit()
	if err != nil {
		return Limit{}, false, err
	}
	if resp.Succeeded {
		return Limit{Key: key, Rate: r, By: by, Revision: resp.Header.Revision}, true, nil
	}
	cur, err := limitOf(key, resp.Responses[0].GetResponseRange().Kvs)
	return cur, false, err
}

// Report puts node's outcomes of key, for the key's learner to read.
func (s *Store) Report(ctx context.Context, key, node string, o Outcomes) error {
	_, err := s.client.Put(ctx, s.obsPrefix(key)+node, fmt.Sprintf("%d %d", o.OK, o.Refused))
	if err != nil {
		return fmt.Errorf("report %s: %w", key, err)
	}
	return nil
}

// outcomes reads every node's reported outcomes of key.
func (s *Store) outcomes(ctx context.Context, key string) (map[string]Outcomes, error) {
	p := s.obsPrefix(key)
	resp, err := s.client.Get(ctx, p, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("outcomes %s: %w", key, err)
	}
	out := make(map[string]Outcomes, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var o Outcomes
		if _, err := fmt.Sscanf(string(kv.Value), "%d %d", &o.OK, &o.Refused); err != nil {
			return nil, fmt.Errorf("outcomes %s: %q: %w", kv.Key, kv.Value, err)
		}
		out[strings.TrimPrefix(string(kv.Key), p)] = o
	}
	return out, nil
}

// WatchLimit sends key's learned limit to ch, first as it stands and then
// at every change, until ctx ends.
func (s *Store) WatchLimit(ctx context.Context, key string, ch chan<- Limit) error {
	cur, err := s.Limit(ctx, key)
	if err != nil {
		return err
	}
	if !sendLimit(ctx, ch, cur) {
		return ctx.Err()
	}
	wc := s.client.Watch(clientv3.WithRequireLeader(ctx), s.limitKey(key), clientv3.WithRev(cur.Revision+1))
	for resp := range wc {
		if err := resp.Err(); err != nil {
			return fmt.Errorf("watch limit %s: %w", key, err)
		}
		for _, ev := range resp.Events {
			if ev.Type != clientv3.EventTypePut {
				continue
			}
			l, err := limitOf(key, []*mvccpb.KeyValue{ev.Kv})
			if err != nil {
				return err
			}
			if !sendLimit(ctx, ch, l) {
				return ctx.Err()
			}
		}
	}
	return ctx.Err()
}

func sendLimit(ctx context.Context, ch chan<- Limit, l Limit) bool {
	select {
	case ch <- l:
		return true
	case <-ctx.Done():
		return false
	}
}

var errBadLimit = errors.New("malformed learned limit")

func limitOf(key string, kvs []*mvccpb.KeyValue) (Limit, error) {
	if len(kvs) == 0 {
		return Limit{Key: key}, nil
	}
	f := strings.SplitN(string(kvs[0].Value), " ", 3)
	if len(f) != 3 {
		return Limit{}, fmt.Errorf("%s: %q: %w", key, kvs[0].Value, errBadLimit)
	}
	n, err1 := strconv.Atoi(f[0])
	w, err2 := strconv.ParseInt(f[1], 10, 64)
	if err := errors.Join(err1, err2); err != nil || n <= 0 || w <= 0 {
		return Limit{}, fmt.Errorf("%s: %q: %w", key, kvs[0].Value, errBadLimit)
	}
	return Limit{Key: key, Rate: Rate{Limit: n, Window: time.Duration(w)}, By: f[2], Revision: kvs[0].ModRevision}, nil
}

// SetRate makes r the rate of the slots this node reserves from its next
// block, never above the told ceiling (the Config's Rate): the rate a
// key's learner, or a cut, agreed on. Held blocks keep their spacing. It
// returns the rate applied.
func (s *Slots) SetRate(r Rate) Rate {
	if r.Limit <= 0 || r.Window <= 0 || r.perSecond() > s.cfg.Rate.perSecond() {
		r = s.cfg.Rate
	}
	iv := Interval(r, s.cfg.Grace, s.cfg.MaxSkew).Nanoseconds()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.interval = iv
	s.max = max(1, int(s.cfg.Block.Nanoseconds()/iv))
	return r
}
