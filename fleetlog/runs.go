package fleetlog

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultRunsPrefix is where a Runs keeps its keys unless told otherwise.
const DefaultRunsPrefix = "/auditd/fleetruns/"

// ErrRunExists means a fleet run of that id was created already.
var ErrRunExists = errors.New("fleet run exists")

// Run is a fleet run as etcd holds it: one proxy-mode run id that every
// node of the fleet takes requests for, each node keeping its own part
// (a local run of the same id) in its own ledger.
type Run struct {
	ID          string        `json:"id"`
	Name        string        `json:"name"`
	Node        string        `json:"node"` // the node it was created on
	InitiatedBy string        `json:"initiated_by,omitempty"`
	CreatedAt   time.Time     `json:"created_at"`
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// Parts are the nodes holding a part of the run, by name: filled by
	// Runs.Get, not stored in the run's value.
	Parts []string `json:"-"`
	// FinishedAt is when the run was first finished (Runs.Finish), zero
	// while it takes requests: filled by Runs.Get, not stored in the
	// run's value.
	FinishedAt time.Time `json:"-"`
}

// ErrRunFinished means a fleet run was finished and no node may join it.
var ErrRunFinished = errors.New("fleet run finished")

// Runs is the fleet's directory of fleet runs and of the nodes' API
// addresses, in etcd. Keys, under its prefix (DefaultRunsPrefix):
//
//	run/<id>              the Run, as JSON, written once
//	part/<id>/<node>      the node's part: written by the node when it first takes the run
//	end/<id>              when the run was first finished (RFC 3339): no part joins after
//	peer/<node>           the node's API base URL
type Runs struct {
	client *clientv3.Client
	prefix string
}

// NewRuns returns the directory under prefix (DefaultRunsPrefix when
// empty) on client.
func NewRuns(client *clientv3.Client, prefix string) *Runs {
	if prefix == "" {
		prefix = DefaultRunsPrefix
	}
	return &Runs{client: client, prefix: prefix}
}

func (r *Runs) runKey(id string) string        { return r.prefix + "run/" + id }
func (r *Runs) partDir(id string) string       { return r.prefix + "part/" + id + "/" }
func (r *Runs) peerKey(node string) string     { return r.prefix + "peer/" + node }
func (r *Runs) partKey(id, node string) string { return r.partDir(id) + node }
func (r *Runs) endKey(id string) string        { return r.prefix + "end/" + id }

// Create stores run unless a run of its id exists (ErrRunExists), and
// records its creating node's part.
func (r *Runs) Create(ctx context.Context, run Run) error {
	if !validName(run.Node) || run.ID == "" || strings.ContainsAny(run.ID, "/ \n") {
		return fmt.Errorf("fleet run %q of node %q: %w", run.ID, run.Node, ErrBadLeaf)
	}
	b, err := json.Marshal(run)
	if err != nil {
		return err
	}
	resp, err := r.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.runKey(run.ID)), "=", 0)).
		Then(clientv3.OpPut(r.runKey(run.ID), string(b)), clientv3.OpPut(r.partKey(run.ID, run.Node), "")).Commit()
	if err != nil {
		return fmt.Errorf("create fleet run %s: %w", run.ID, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("fleet run %s: %w", run.ID, ErrRunExists)
	}
	return nil
}

// Get returns the fleet run of id with its parts; ok is false when there
// is none.
func (r *Runs) Get(ctx context.Context, id string) (run Run, ok bool, err error) {
	resp, err := r.client.Txn(ctx).Then(clientv3.OpGet(r.runKey(id)),
		clientv3.OpGet(r.partDir(id), clientv3.WithPrefix(), clientv3.WithKeysOnly()), clientv3.OpGet(r.endKey(id))).Commit()
	if err != nil {
		return Run{}, false, fmt.Errorf("fleet run %s: %w", id, err)
	}
	if _, ok, err = decode(resp.Responses[0].GetResponseRange().Kvs, &run); !ok || err != nil {
		return Run{}, false, err
	}
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		run.Parts = append(run.Parts, string(kv.Key[len(r.partDir(id)):]))
	}
	sort.Strings(run.Parts)
	if kvs := resp.Responses[2].GetResponseRange().Kvs; len(kvs) > 0 {
		if run.FinishedAt, err = parseEnd(kvs[0].Value); err != nil {
			return Run{}, false, fmt.Errorf("fleet run %s: %w", id, err)
		}
	}
	return run, true, nil
}

// parseEnd reads an end/<id> value, written by another node.
func parseEnd(v []byte) (time.Time, error) {
	t, err := time.Parse(time.RFC3339Nano, string(v))
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: end %q", ErrCorrupt, v)
	}
	return t, nil
}

// Finish marks the fleet run id finished at at, unless it was already
// (its first finish stands), so that no node joins it after. It returns
// when the run was first finished.
func (r *Runs) Finish(ctx context.Context, id string, at time.Time) (time.Time, error) {
	k := r.endKey(id)
	resp, err := r.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(k), "=", 0)).
		Then(clientv3.OpPut(k, at.UTC().Format(time.RFC3339Nano))).Else(clientv3.OpGet(k)).Commit()
	if err != nil {
		return time.Time{}, fmt.Errorf("finish fleet run %s: %w", id, err)
	}
	if resp.Succeeded {
		return at.UTC(), nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return time.Time{}, fmt.Errorf("finish fleet run %s: %w: end key gone", id, ErrCorrupt)
	}
	return parseEnd(kvs[0].Value)
}

// List returns up to limit fleet runs with their parts, newest first (a
// run id is a ULID), those older than the run before when it is set.
//
// etcd limits a range as it reads it only in ascending key order: newest
// first, it reads and sorts every older key. So the page is found from the
// keys alone, and only its values and parts are read, at the same
// revision.
func (r *Runs) List(ctx context.Context, before string, limit int) ([]Run, error) {
	opts := []clientv3.OpOption{clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(int64(limit)), clientv3.WithKeysOnly()}
	if before != "" {
		opts = append(opts, clientv3.WithRange(r.runKey(before)))
	} else {
		opts = append(opts, clientv3.WithPrefix())
	}
	keys, err := r.client.Get(ctx, r.prefix+"run/", opts...)
	if err != nil {
		return nil, fmt.Errorf("fleet runs: %w", err)
	}
	if len(keys.Kvs) == 0 {
		return []Run{}, nil
	}
	// The page's values are the keys from its oldest to its newest; its
	// parts, the part keys of the same ids.
	oldest, newest := string(keys.Kvs[len(keys.Kvs)-1].Key), string(keys.Kvs[0].Key)
	oldestID, newestID := oldest[len(r.runKey("")):], newest[len(r.runKey("")):]
	resp, err := r.client.Txn(ctx).Then(
		clientv3.OpGet(oldest, clientv3.WithRange(newest+"\x00"), clientv3.WithRev(keys.Header.Revision)),
		clientv3.OpGet(r.partDir(oldestID), clientv3.WithRange(r.partDir(newestID)+"\xff"),
			clientv3.WithKeysOnly(), clientv3.WithRev(keys.Header.Revision)),
		clientv3.OpGet(r.endKey(oldestID), clientv3.WithRange(r.endKey(newestID)+"\x00"), clientv3.WithRev(keys.Header.Revision))).Commit()
	if err != nil {
		return nil, fmt.Errorf("fleet runs: %w", err)
	}
	values := resp.Responses[0].GetResponseRange().Kvs
	runs := make([]Run, 0, len(values))
	at := map[string]int{}
	for i := len(values) - 1; i >= 0; i-- {
		var run Run
		if err := json.Unmarshal(values[i].Value, &run); err != nil {
			return nil, fmt.Errorf("fleet run %s: %w", values[i].Key, err)
		}
		at[run.ID] = len(runs)
		runs = append(runs, run)
	}
	parts := resp.Responses[1].GetResponseRange()
	for _, kv := range parts.Kvs {
		id, node, ok := strings.Cut(string(kv.Key[len(r.prefix+"part/"):]), "/")
		if i, listed := at[id]; ok && listed {
			runs[i].Parts = append(runs[i].Parts, node)
		}
	}
	for _, kv := range resp.Responses[2].GetResponseRange().Kvs {
		if i, listed := at[string(kv.Key[len(r.endKey("")):])]; listed {
			if runs[i].FinishedAt, err = parseEnd(kv.Value); err != nil {
				return nil, fmt.Errorf("fleet run %s: %w", runs[i].ID, err)
			}
		}
	}
	return runs, nil
}

// Exist reports which of ids are fleet runs, reading at most 64 keys a
// transaction.
func (r *Runs) Exist(ctx context.Context, ids []string) (map[string]bool, error) {
	out := make(map[string]bool, len(ids))
	for chunk := range slices.Chunk(ids, 64) {
		ops := make([]clientv3.Op, len(chunk))
		for i, id := range chunk {
			ops[i] = clientv3.OpGet(r.runKey(id), clientv3.WithKeysOnly())
		}
		resp, err := r.client.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("fleet runs: %w", err)
		}
		for i, id := range chunk {
			out[id] = len(resp.Responses[i].GetResponseRange().Kvs) > 0
		}
	}
	return out, nil
}

// Join records node's part of the fleet run id (again is harmless),
// unless the run was finished: ErrRunFinished.
func (r *Runs) Join(ctx context.Context, id, node string) error {
	if !validName(node) {
		return fmt.Errorf("join fleet run %s: node name %q: %w", id, node, ErrBadLeaf)
	}
	resp, err := r.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(r.endKey(id)), "=", 0)).
		Then(clientv3.OpPut(r.partKey(id, node), "")).Commit()
	if err != nil {
		return fmt.Errorf("join fleet run %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("join fleet run %s: %w", id, ErrRunFinished)
	}
	return nil
}

// SetPeer records node's API base URL, where the other nodes ask for its
// part of a fleet run.
func (r *Runs) SetPeer(ctx context.Context, node, url string) error {
	if _, err := r.client.Put(ctx, r.peerKey(node), url); err != nil {
		return fmt.Errorf("fleet peer %s: %w", node, err)
	}
	return nil
}

// Peers returns every node's API base URL, by name.
func (r *Runs) Peers(ctx context.Context) (map[string]string, error) {
	resp, err := r.client.Get(ctx, r.prefix+"peer/", clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("fleet peers: %w", err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		out[string(kv.Key[len(r.prefix+"peer/"):])] = string(kv.Value)
	}
	return out, nil
}
