package main

import (
	"context"
	"encoding/base64"
	"encoding/hex"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
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
	st, err := a.reg.PeekState(id) // a view: never waits on a change a stalled ledger holds
	if err != nil {
		return api.SourceState{}, err
	}
	// The contract shows a source's header names, never their values:
	// the API writes "[redacted]" for each.
	cfg := st.Source
	if names, err := a.reg.HeaderNames(id); err == nil && len(names) > 0 {
		cfg.Headers = make(map[string]string, len(names))
		for _, n := range names {
			cfg.Headers[n] = ""
		}
	}
	out := api.SourceState{
		Config:  cfg,
		Learned: api.Learned{Limit: st.Limit, Window: st.Window, Cause: st.Cause, ChangedAt: st.TaughtAt, Concurrency: st.Concurrency},
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

// runsAPI is the API's runs: the store's, created and cancelled by the
// fetch loop.
type runsAPI struct {
	*runs.Store
	loop *fetch.Loop
}

func (a runsAPI) CreateRun(ctx context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	return a.loop.Submit(ctx, nr)
}

func (a runsAPI) CancelRun(ctx context.Context, id, _ string) (auditd.RunView, error) {
	return a.loop.Cancel(ctx, id)
}

func (a runsAPI) FinishRun(ctx context.Context, id, principal string) (auditd.RunView, error) {
	return a.loop.Finish(ctx, id, principal)
}

func (a runsAPI) AddRunItems(ctx context.Context, id string, items []auditd.Item) (auditd.RunView, error) {
	return a.loop.AddItems(ctx, id, items)
}

func (a runsAPI) AddRunItemsStream(ctx context.Context, id string, next func() ([]auditd.Item, error)) (auditd.RunView, error) {
	return a.loop.AddItemsStream(ctx, id, next)
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
		FirstBad: rep.FirstBad, Problem: rep.Problem, Findings: rep.Findings(),
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
