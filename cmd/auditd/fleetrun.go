package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/witness"
)

// fleetPostEvery is how often a fleet node posts its ledger's checkpoint
// to the fleet log of logs (when it grew) and cosigns the log's head.
const fleetPostEvery = time.Second

// fleetPostTimeout bounds one round of posting and cosigning: a node cut
// off from etcd records the failure rather than wait for the cut to heal.
const fleetPostTimeout = 2 * time.Second

// fleetReadTimeout bounds a read of the fleet's run directory: a node cut
// off from etcd answers 503 rather than hold the request.
const fleetReadTimeout = 5 * time.Second

// fleetPeerTimeout bounds a call to another node of the fleet.
const fleetPeerTimeout = 2 * time.Minute

// fleetRuns is a fleet node's side of fleet runs and of the fleet log of
// logs: it posts the node's checkpoints and cosigns fleet checkpoints on a
// period (post), takes the requests of fleet runs it has no part of yet
// (Proxy), and answers for a fleet run across the nodes (api.Fleet,
// fleetrun_parts.go).
type fleetRuns struct {
	node     string
	lag      time.Duration
	flog     *fleetlog.Log
	dir      *fleetlog.Runs
	cosigner *witness.Cosigner
	db       *bolt.DB
	led      *ledger.Ledger
	loop     *fetch.Loop
	store    *runs.Store
	reps     *reports.Service
	packs    livePacks
	reg      *registry.Registry
	next     api.Proxy
	http     *http.Client
	log      *slog.Logger

	// postMu makes a post and the pack proven at its checkpoint one step,
	// so that no newer post comes between them.
	postMu   sync.Mutex
	scanned  uint64 // ledger events read for grants
	revision int64  // the last grant among them

	mu     sync.Mutex
	status api.FleetLogStatus

	joinMu sync.Mutex // one part created at a time

	partMu sync.Mutex
	partOf map[string]api.FleetPartOf // PartOf's answers by run id; Href "" for a run of this node alone
	kick   chan struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// newFleetRuns wires fleet runs on the fleet's etcd client; start runs it.
func newFleetRuns(o fleetOptions, client *clientv3.Client, dataDir string, led *ledger.Ledger, db *bolt.DB, loop *fetch.Loop,
	store *runs.Store, reps *reports.Service, packs livePacks, reg *registry.Registry, log *slog.Logger) (*fleetRuns, error) {
	cs, err := witness.ReadCosigner(filepath.Join(dataDir, ledger.PrivateKeyFile))
	if err != nil {
		return nil, fmt.Errorf("fleet log: %w", err)
	}
	lag := o.Lag
	if lag == 0 {
		lag = defaultFleetLag
	}
	return &fleetRuns{node: o.Node, lag: lag, flog: fleetlog.New(client, fleetlog.Config{}), dir: fleetlog.NewRuns(client, ""),
		cosigner: cs, db: db, led: led, loop: loop, store: store, reps: reps, packs: packs, reg: reg, next: loop,
		http: &http.Client{Timeout: fleetPeerTimeout}, log: log, status: api.FleetLogStatus{Node: o.Node},
		partOf: map[string]api.FleetPartOf{}, kick: make(chan struct{}, 1), done: make(chan struct{})}, nil
}

// start publishes the node's API address to the fleet and starts posting.
func (f *fleetRuns) start(ctx context.Context, url string) error {
	if err := f.dir.SetPeer(ctx, f.node, url); err != nil {
		return err
	}
	rctx, cancel := context.WithCancel(context.Background())
	f.cancel = cancel
	go f.run(rctx)
	return nil
}

func (f *fleetRuns) run(ctx context.Context) {
	defer close(f.done)
	tick := time.NewTicker(fleetPostEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-f.kick:
		}
		f.postAndCosign(ctx)
	}
}

// close stops posting, and posts once more: the events of a shutdown
// (runs drained, the loop's last records) reach the fleet log.
func (f *fleetRuns) close(ctx context.Context) error {
	if f.cancel == nil {
		return nil
	}
	f.cancel()
	select {
	case <-f.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	f.postAndCosign(ctx)
	return nil
}

// poke asks for a post now (a part finished, say).
func (f *fleetRuns) poke() {
	select {
	case f.kick <- struct{}{}:
	default:
	}
}

// postAndCosign posts the latest checkpoint, then cosigns the fleet log's
// head. A failure is logged and kept in the status (GET /v1/fleet/log).
func (f *fleetRuns) postAndCosign(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, fleetPostTimeout)
	defer cancel()
	f.postMu.Lock()
	note, err := f.led.Checkpoint()
	if err == nil && note != nil && f.grew(note) {
		_, err = f.postLocked(ctx, note)
	}
	f.postMu.Unlock()
	if err != nil {
		f.failed("post", err)
		return
	}
	head, err := f.flog.Head(ctx)
	if err != nil {
		f.failed("cosign", err)
		return
	}
	f.mu.Lock()
	done := f.status.Cosigned >= head.Size
	f.mu.Unlock()
	if done || head.Size == 0 {
		return
	}
	if _, err := f.Cosign(ctx, head.Size); err != nil {
		f.failed("cosign", err)
	}
}

// grew reports whether note is of another size than the last posted.
func (f *fleetRuns) grew(note []byte) bool {
	st, err := ledger.OpenCheckpoint(note, f.led.PublicKey())
	f.mu.Lock()
	defer f.mu.Unlock()
	return err != nil || st.Size != f.status.Posted // a bad note: let the post say why
}

func (f *fleetRuns) failed(what string, err error) {
	f.mu.Lock()
	f.status.Failures++
	f.status.LastError, f.status.LastErrorAt = what+": "+err.Error(), time.Now().UTC()
	f.mu.Unlock()
	f.log.Error("fleet log: "+what, "err", err)
}

// postLocked posts note, the ledger's signed checkpoint, with the revision
// of the last grant the ledger records up to it. The caller holds postMu.
func (f *fleetRuns) postLocked(ctx context.Context, note []byte) (fleetlog.Entry, error) {
	st, err := ledger.OpenCheckpoint(note, f.led.PublicKey())
	if err != nil {
		return fleetlog.Entry{}, err
	}
	rev, err := f.grantsTo(st.Size)
	if err != nil {
		return fleetlog.Entry{}, err
	}
	r := ledger.NewReader(f.db)
	e, err := f.flog.Post(ctx, fleetlog.Post{Node: f.node, Key: f.led.PublicKey(), Checkpoint: note, Revision: rev,
		Prove: func(old uint64) (tlog.TreeProof, error) { return r.ConsistencyProof(old, st.Size) }})
	if err != nil {
		return fleetlog.Entry{}, err
	}
	f.mu.Lock()
	if f.status.Posted != st.Size {
		f.status.Posts++
	}
	f.status.Posted, f.status.Leaf = st.Size, e.Index
	f.mu.Unlock()
	return e, nil
}

// grantsTo reads the ledger's fleet grants up to event size and returns
// the revision of the last. The caller holds postMu.
func (f *fleetRuns) grantsTo(size uint64) (int64, error) {
	if size > f.scanned {
		err := ledger.NewReader(f.db).Scan(f.scanned+1, size, func(e *auditd.Event) error {
			if b, ok := pack.ReservedBlock(e); ok && b.Revision > f.revision {
				f.revision = b.Revision
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("read fleet grants: %w", err)
		}
		f.scanned = size
	}
	return f.revision, nil
}

// Cosign cosigns the fleet log's tree of size leaves.
func (f *fleetRuns) Cosign(ctx context.Context, size uint64) (api.FleetTree, error) {
	head, err := f.flog.Head(ctx)
	if err != nil {
		return api.FleetTree{}, err
	}
	if size > head.Size {
		return api.FleetTree{}, &auditd.Error{Code: auditd.EINVALID, Field: "size",
			Message: fmt.Sprintf("The fleet log holds %d leaves; size %d is past it.", head.Size, size)}
	}
	t, err := f.flog.Cosign(ctx, f.cosigner, size)
	if err != nil {
		return api.FleetTree{}, err
	}
	f.mu.Lock()
	f.status.Cosigned = max(f.status.Cosigned, size)
	f.mu.Unlock()
	return api.FleetTree{Origin: t.Origin, Size: t.Size, Root: base64.StdEncoding.EncodeToString(t.Root[:])}, nil
}

// LogStatus is the node's posting to the fleet log.
func (f *fleetRuns) LogStatus(context.Context) api.FleetLogStatus {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.status
}

// Proxy takes a request naming a fleet run this node has no part of yet:
// it joins the run (etcd first, so that a part that fails to start is
// still looked for) and starts its part, a proxy-mode run of the fleet
// run's id; then the loop carries the request as any other.
func (f *fleetRuns) Proxy(ctx context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (auditd.ProxyMeta, error) {
	if req.RunID != "" {
		if err := f.ensurePart(ctx, req.RunID); err != nil {
			return auditd.ProxyMeta{RunID: req.RunID}, err
		}
	}
	return f.next.Proxy(ctx, req, out)
}

func (f *fleetRuns) ensurePart(ctx context.Context, id string) error {
	if _, err := f.store.Run(ctx, id); err == nil || auditd.ErrorCode(err) != auditd.ENOTFOUND {
		return err
	}
	f.joinMu.Lock()
	defer f.joinMu.Unlock()
	if _, err := f.store.Run(ctx, id); err == nil || auditd.ErrorCode(err) != auditd.ENOTFOUND {
		return err
	}
	run, ok, err := f.dir.Get(ctx, id)
	if err != nil {
		return auditd.Errorf(auditd.EUNAVAILABLE, "Run %s is not on this node and the fleet cannot be asked: %v", id, err)
	} else if !ok {
		return nil // not a fleet run: the loop answers for it
	}
	finished := &auditd.Error{Code: auditd.ECONFLICT, Field: "Auditd-Run", Message: fmt.Sprintf("Fleet run %s was finished; it takes no more requests.", id)}
	if !run.FinishedAt.IsZero() {
		return finished
	}
	if err := f.dir.Join(ctx, id, f.node); errors.Is(err, fleetlog.ErrRunFinished) {
		return finished // between the read and the join
	} else if err != nil {
		return auditd.Errorf(auditd.EUNAVAILABLE, "Fleet run %s: this node cannot join it: %v", id, err)
	}
	_, _, err = f.loop.Submit(ctx, auditd.NewRun{ID: id, Name: run.Name, Mode: auditd.RunProxy, IdleTimeout: run.IdleTimeout,
		Principal: run.InitiatedBy})
	if err != nil {
		return err
	}
	// A finish marked after the join but before the part started found
	// no part here to finish: the part ends itself, and the request that
	// started it is answered as one of a finished run.
	if again, ok, err := f.dir.Get(ctx, id); err == nil && ok && !again.FinishedAt.IsZero() {
		if _, err := f.loop.Finish(ctx, id, run.InitiatedBy); err != nil && auditd.ErrorCode(err) != auditd.ECONFLICT {
			return err
		}
		f.poke()
		return finished
	}
	return nil
}

// CreateRun creates a fleet run in etcd and this node's part of it.
func (f *fleetRuns) CreateRun(ctx context.Context, principal, name string, idle time.Duration) (api.FleetRun, error) {
	now := time.Now().UTC()
	run := fleetlog.Run{ID: ulid.MustNew(ulid.Timestamp(now), ulid.DefaultEntropy()).String(), Name: name, Node: f.node,
		InitiatedBy: principal, CreatedAt: now, IdleTimeout: idle}
	if err := f.dir.Create(ctx, run); err != nil {
		return api.FleetRun{}, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet run cannot be created: %v", err)
	}
	if _, _, err := f.loop.Submit(ctx, auditd.NewRun{ID: run.ID, Name: name, Mode: auditd.RunProxy, IdleTimeout: idle, Principal: principal}); err != nil {
		return api.FleetRun{}, err
	}
	return f.Run(ctx, run.ID)
}

// Run returns the fleet run id as etcd has it.
func (f *fleetRuns) Run(ctx context.Context, id string) (api.FleetRun, error) {
	rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	defer cancel()
	run, ok, err := f.dir.Get(rctx, id)
	if err != nil {
		return api.FleetRun{}, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet cannot be asked for run %s: %v", id, err)
	} else if !ok {
		return api.FleetRun{}, auditd.Errorf(auditd.ENOTFOUND, "No fleet run %s.", id)
	}
	return fleetRunJSON(run), nil
}

// PartsOf is PartOf for a page of this node's runs, in one read of etcd
// for those not known yet (at most partOfTimeout), without the parts.
func (f *fleetRuns) PartsOf(ctx context.Context, ids []string) map[string]api.FleetPartOf {
	out := map[string]api.FleetPartOf{}
	var ask []string
	f.partMu.Lock()
	for _, id := range ids {
		switch last, known := f.partOf[id]; {
		case !known:
			ask = append(ask, id)
		case last.Href != "":
			out[id] = last
		}
	}
	f.partMu.Unlock()
	if len(ask) == 0 {
		return out
	}
	rctx, cancel := context.WithTimeout(ctx, partOfTimeout)
	defer cancel()
	exist, err := f.dir.Exist(rctx, ask)
	f.partMu.Lock()
	defer f.partMu.Unlock()
	for _, id := range ask {
		switch {
		case err != nil:
			out[id] = api.FleetPartOf{Node: f.node, Unknown: true}
		case exist[id]:
			out[id] = f.partJSON(id, nil)
			f.rememberPartLocked(id, out[id])
		default:
			f.rememberPartLocked(id, api.FleetPartOf{})
		}
	}
	return out
}

// fleetRunJSON is run as the API shows it.
func fleetRunJSON(run fleetlog.Run) api.FleetRun {
	return api.FleetRun{ID: run.ID, Name: run.Name, Node: run.Node, CreatedAt: run.CreatedAt,
		IdleTimeout: auditd.Duration(run.IdleTimeout), Parts: append([]string{}, run.Parts...), FinishedAt: run.FinishedAt}
}

// Runs lists the fleet's runs as etcd has them, newest first.
func (f *fleetRuns) Runs(ctx context.Context, before string, limit int) ([]api.FleetRun, error) {
	rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	defer cancel()
	runs, err := f.dir.List(rctx, before, limit)
	if err != nil {
		return nil, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet cannot be asked for its runs: %v", err)
	}
	out := make([]api.FleetRun, len(runs))
	for i, run := range runs {
		out[i] = fleetRunJSON(run)
	}
	return out, nil
}

// partOfTimeout bounds PartOf's read of etcd: a run's page must not wait
// on an etcd out of reach.
const partOfTimeout = time.Second

// partOfKept is how many runs' answers PartOf keeps at most.
const partOfKept = 4096

// PartOf says whether this node's run id is its part of a fleet run, with
// the parts etcd holds now, or those last read when etcd cannot be asked
// in time, or (Unknown) that it cannot tell. A run of this node that etcd
// does not hold was never a fleet run (a part is joined before it is
// made) and is remembered as such.
func (f *fleetRuns) PartOf(ctx context.Context, id string) (api.FleetPartOf, bool) {
	f.partMu.Lock()
	last, known := f.partOf[id]
	f.partMu.Unlock()
	if known && last.Href == "" {
		return api.FleetPartOf{}, false
	}
	rctx, cancel := context.WithTimeout(ctx, partOfTimeout)
	defer cancel()
	run, ok, err := f.dir.Get(rctx, id)
	if err != nil && known {
		return last, true
	} else if err != nil {
		return api.FleetPartOf{Node: f.node, Unknown: true}, true
	}
	var part api.FleetPartOf
	if ok {
		part = f.partJSON(id, run.Parts)
	}
	f.partMu.Lock()
	f.rememberPartLocked(id, part)
	f.partMu.Unlock()
	return part, ok
}

// partJSON is this node's part of the fleet run id, held by parts.
func (f *fleetRuns) partJSON(id string, parts []string) api.FleetPartOf {
	return api.FleetPartOf{Node: f.node, Parts: parts, Href: "/v1/fleet/runs/" + id}
}

// rememberPartLocked keeps PartOf's answer for id (Href "" for a run of
// this node alone), partOfKept at most: the store is cleared when full.
// f.partMu is held.
func (f *fleetRuns) rememberPartLocked(id string, part api.FleetPartOf) {
	if len(f.partOf) >= partOfKept {
		clear(f.partOf)
	}
	f.partOf[id] = part
}

// FinishRun finishes every node's part: this node's here, the others'
// through their API, with the caller's token.
func (f *fleetRuns) FinishRun(ctx context.Context, id, principal, authorization string) (api.FleetRun, error) {
	run, err := f.Run(ctx, id)
	if err != nil {
		return api.FleetRun{}, err
	}
	// A token a peer refuses would leave the run half finished: ask
	// every peer for its part first, at once, and finish none if one
	// refuses. A peer down is asked again below, and named.
	asked := eachPart(run.Parts, func(_ int, node string) error {
		if node == f.node {
			return nil
		}
		return f.peerCall(ctx, node, http.MethodGet, "/v1/runs/"+id, authorization, nil, nil)
	})
	if err := errors.Join(asked...); errors.Is(err, errPeerRefused) {
		return api.FleetRun{}, peerFailed(err, "Fleet run %s: no part finished", id)
	}
	// Marked finished first, so that no node joins it after; the parts
	// are read again after the mark, so that every part that joined
	// before it is finished.
	rctx, cancel := context.WithTimeout(ctx, fleetReadTimeout)
	_, err = f.dir.Finish(rctx, id, time.Now())
	cancel()
	if err != nil {
		return api.FleetRun{}, auditd.Errorf(auditd.EUNAVAILABLE, "Fleet run %s cannot be marked finished: %v", id, err)
	}
	if run, err = f.Run(ctx, id); err != nil {
		return api.FleetRun{}, err
	}
	errs := eachPart(run.Parts, func(_ int, node string) error {
		if node == f.node {
			defer f.poke()
			if _, err := f.loop.Finish(ctx, id, principal); err != nil && auditd.ErrorCode(err) != auditd.ECONFLICT {
				return fmt.Errorf("node %s: %w", node, err)
			}
			return nil
		}
		if err := f.peerCall(ctx, node, http.MethodPost, "/v1/runs/"+id+"/finish", authorization, nil, nil); err != nil && !errors.Is(err, errPeerConflict) {
			return err
		}
		return nil
	})
	if err := errors.Join(errs...); err != nil {
		return api.FleetRun{}, peerFailed(err, "Fleet run %s", id)
	}
	return run, nil
}

// eachPart calls do for every node (the i-th of nodes) at once, and
// returns their errors in the nodes' order.
func eachPart(nodes []string, do func(i int, node string) error) []error {
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, node := range nodes {
		wg.Go(func() { errs[i] = do(i, node) })
	}
	wg.Wait()
	return errs
}
