package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"
	"io"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// The API declares what it needs as small interfaces (api/deps.go); these
// adapters are the only place that knows both sides.

// sourcesAPI serves sources from the registry, with live gate state from the
// limiter; changes go through the fetch loop so the gates follow at once.
type sourcesAPI struct {
	loop *fetch.Loop
	reg  *registry.Registry
	lim  *limiter.Limiter
}

func (a sourcesAPI) PutSource(ctx context.Context, src auditd.Source, principal string) (bool, error) {
	return a.loop.PutSource(ctx, principal, src)
}

func (a sourcesAPI) Source(_ context.Context, id string) (api.SourceState, error) {
	st, err := a.reg.State(id)
	if err != nil {
		return api.SourceState{}, err
	}
	out := api.SourceState{
		Config:  st.Source,
		Learned: api.Learned{Limit: st.Limit, Window: st.Window, Cause: st.Cause, ChangedAt: st.TaughtAt},
		Breaker: api.Breaker{State: string(limiter.BreakerClosed)},
	}
	if st.Group != "" && st.GroupLimit > 0 {
		out.Learned.Limit, out.Learned.Window = st.GroupLimit, st.GroupWindow
		if st.GroupCause != "" {
			out.Learned.Cause, out.Learned.ChangedAt = st.GroupCause, st.GroupTaughtAt
		}
	}
	if ls, err := a.lim.State(id); err == nil {
		out.Breaker = api.Breaker{State: string(ls.Breaker), Failures: ls.Failures}
		out.PausedUntil = ls.PausedUntil
	}
	return out, nil
}

func (a sourcesAPI) Sources(ctx context.Context) ([]api.SourceState, error) {
	var out []api.SourceState
	for _, src := range a.reg.ListSources() {
		st, err := a.Source(ctx, src.ID)
		if err != nil {
			return nil, err
		}
		out = append(out, st)
	}
	return out, nil
}

// runsAPI serves runs and items from the fetch loop.
type runsAPI struct{ loop *fetch.Loop }

func runState(v fetch.RunView) api.RunState {
	c := v.Counts
	out := api.RunState{Run: v.Run, EstimatedFinish: v.EstimatedFinish, Counts: api.RunCounts{
		Items: c.Items, Succeeded: c.Succeeded, Cached: c.Cached, Failed: c.Failed, Shed: c.Shed, Pending: c.Pending(),
		Dispatches: c.Dispatches, Retries: c.Retries, Status2xx: c.Status2xx, Status429: c.Status429,
		Status5xx: c.Status5xx, StatusOther: c.StatusOther, TransportErrors: c.TransportErrors,
		Interrupted: c.Interrupted, Waits: c.Waits, BreakerOpens: c.BreakerOpens, Staged: c.Staged,
		Acknowledged: c.Acknowledged,
	}}
	if len(c.BySource) > 0 {
		out.Counts.BySource = make(map[string]api.SourceProgress, len(c.BySource))
		for id, p := range c.BySource {
			out.Counts.BySource[id] = api.SourceProgress{Items: p.Items, Done: p.Done}
		}
	}
	return out
}

func itemState(v fetch.ItemView) api.ItemState {
	out := api.ItemState{Item: v.Item}
	if r := v.Result; r != nil {
		out.Result = &api.ItemResult{
			Outcome: r.Outcome, Reason: r.Reason, PayloadHash: r.PayloadHash, Bytes: r.Bytes,
			Attempts: r.Attempts, Pages: r.Pages, Records: r.Records, Advertised: r.Advertised, CountMatched: r.CountMatched,
		}
	}
	return out
}

func (a runsAPI) CreateRun(ctx context.Context, nr api.NewRun) (api.RunState, bool, error) {
	v, created, err := a.loop.Submit(ctx, submitRequest(nr))
	return runState(v), created, err
}

func (a runsAPI) RunByIdempotencyKey(_ context.Context, nr api.NewRun) (api.RunState, error) {
	v, err := a.loop.RunByIdempotencyKey(submitRequest(nr))
	return runState(v), err
}

func submitRequest(nr api.NewRun) fetch.SubmitRequest {
	return fetch.SubmitRequest{
		Name: nr.Name, Award: nr.Award, Items: nr.Items, Deadline: nr.Deadline, Replay: nr.Replay,
		IdempotencyKey: nr.IdempotencyKey, Principal: nr.Principal,
	}
}

func (a runsAPI) Run(_ context.Context, id string) (api.RunState, error) {
	v, err := a.loop.Run(id)
	return runState(v), err
}

func (a runsAPI) Runs(_ context.Context, f api.RunFilter) ([]api.RunState, string, error) {
	views, next, err := a.loop.Runs(fetch.RunFilter(f))
	out := make([]api.RunState, len(views))
	for i, v := range views {
		out[i] = runState(v)
	}
	return out, next, err
}

func (a runsAPI) CancelRun(ctx context.Context, id, _ string) (api.RunState, error) {
	v, err := a.loop.Cancel(ctx, id)
	return runState(v), err
}

func (a runsAPI) Acknowledge(ctx context.Context, runID string, keys []string, principal string) (int, error) {
	return a.loop.Acknowledge(ctx, runID, keys, principal)
}

func (a runsAPI) Items(_ context.Context, runID, after string, limit int) ([]api.ItemState, string, error) {
	views, next, err := a.loop.Items(runID, after, limit)
	out := make([]api.ItemState, len(views))
	for i, v := range views {
		out[i] = itemState(v)
	}
	return out, next, err
}

func (a runsAPI) Item(_ context.Context, runID, key string) (api.ItemState, error) {
	v, err := a.loop.Item(runID, key)
	return itemState(v), err
}

func (a runsAPI) Payload(_ context.Context, runID, key string) (io.ReadCloser, error) {
	return a.loop.Payload(runID, key)
}

// integrityAPI verifies the live ledger and proves its events.
type integrityAPI struct {
	db  *bolt.DB
	led *ledger.Ledger
}

func (a integrityAPI) Verify(ctx context.Context) (api.Verification, error) {
	rep, err := ledger.Verify(ctx, a.db, ledger.VerifyOptions{VerifierKey: a.led.PublicKey()})
	if err != nil {
		return api.Verification{}, err
	}
	seq, hash := a.led.Head()
	return api.Verification{
		OK: rep.OK, Events: rep.Events, HeadSeq: seq, HeadHash: hex.EncodeToString(hash[:]),
		FirstBad: rep.FirstBad, Problem: rep.Problem,
	}, nil
}

func (a integrityAPI) Prove(_ context.Context, seq uint64) (api.Proof, error) {
	if head, _ := a.led.Head(); seq == 0 || seq > head {
		return api.Proof{}, auditd.Errorf(auditd.ENOTFOUND, "no event has sequence number %d", seq)
	}
	p, err := a.led.Prove(seq)
	if err != nil {
		return api.Proof{}, err
	}
	_, tree, err := p.Verify(a.led.PublicKey())
	if err != nil {
		return api.Proof{}, err
	}
	out := api.Proof{Seq: p.Seq, TreeSize: tree.Size, RootHash: tree.Root.String(), Checkpoint: string(p.Checkpoint)}
	leaf := tlog.RecordHash(p.Record)
	out.LeafHash = base64.StdEncoding.EncodeToString(leaf[:])
	for _, h := range p.Path {
		out.Hashes = append(out.Hashes, h.String())
	}
	return out, nil
}
