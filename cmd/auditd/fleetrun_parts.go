package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
)

// fleetBlockMargin is how long before a part's start a block it used may
// have been reserved: a block holds about a second of slots (fleet.Block)
// and is reserved its lead before the last runs out.
const fleetBlockMargin = 10 * time.Second

// errPeerConflict is a peer's 409: a part already finished, say.
var errPeerConflict = errors.New("conflict")

// errPeerRefused is a peer's 401 or 403 to the caller's token.
var errPeerRefused = errors.New("refused the caller's token")

// peerFailed is the problem for a fleet call that a peer's err failed:
// a 403 when a peer refused the caller's token (a token only some nodes
// accept: asking again will not help), else a 503 (a node down or cut
// off), its message format and args, then err.
func peerFailed(err error, format string, args ...any) error {
	code := auditd.EUNAVAILABLE
	if errors.Is(err, errPeerRefused) {
		code = auditd.EFORBIDDEN
	}
	return auditd.Errorf(code, "%s: %v", fmt.Sprintf(format, args...), err)
}

// peerURL returns node's API base URL as the fleet published it.
func (f *fleetRuns) peerURL(ctx context.Context, node string) (string, error) {
	peers, err := f.dir.Peers(ctx)
	if err != nil {
		return "", err
	}
	url, ok := peers[node]
	if !ok {
		return "", fmt.Errorf("node %s published no API address", node)
	}
	return url, nil
}

// peerDo calls node's API with the caller's authorization and returns
// the response of a 2xx; the caller closes its body.
func (f *fleetRuns) peerDo(ctx context.Context, node, method, path, authorization string, body any) (*http.Response, error) {
	url, err := f.peerURL(ctx, node)
	if err != nil {
		return nil, err
	}
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url+path, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", authorization)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := f.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", node, err)
	}
	if got := resp.Header.Get(api.HeaderNode); got != node {
		resp.Body.Close()
		return nil, fmt.Errorf("node %s: its published address %s answered as node %q: set --fleet-advertise on %s to a URL the other nodes reach it at", node, url, got, node)
	}
	if resp.StatusCode/100 == 2 {
		return resp, nil
	}
	defer resp.Body.Close()
	answer, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode == http.StatusConflict {
		return nil, fmt.Errorf("node %s: %w: %s", node, errPeerConflict, peerProblem(answer))
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return nil, fmt.Errorf("node %s %w (%s %s: %s): a node calls the others with its caller's token, so every node of the fleet must accept the same tokens (docs/FLEET.md)", node, errPeerRefused, method, path, resp.Status)
	}
	return nil, fmt.Errorf("node %s: %s %s: %s: %s", node, method, path, resp.Status, peerProblem(answer))
}

// peerProblem is what a peer's answer says: its problem's detail, or the
// body as it came when it is not a problem.
func peerProblem(body []byte) string {
	var p struct {
		Detail string `json:"detail"`
	}
	if json.Unmarshal(body, &p) == nil && p.Detail != "" {
		return p.Detail
	}
	return strings.TrimSpace(string(body))
}

// peerCall is peerDo with the JSON answer decoded into out (nil: dropped).
func (f *fleetRuns) peerCall(ctx context.Context, node, method, path, authorization string, body, out any) error {
	resp, err := f.peerDo(ctx, node, method, path, authorization, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("node %s: %s: %w", node, path, err)
	}
	return nil
}

// Part reconciles this node's part of the run and reads its dispatches on
// the sources the fleet limits (for R9 over the fleet), then posts the
// node's checkpoint, which then covers every event the report counted.
func (f *fleetRuns) Part(ctx context.Context, id string) (reports.FleetPart, error) {
	rep, err := f.reps.Reconciliation(ctx, id)
	if err != nil {
		return reports.FleetPart{}, err
	}
	ds, err := f.partDispatches(ctx, id)
	if err != nil {
		return reports.FleetPart{}, err
	}
	f.postMu.Lock()
	note, err := f.led.Checkpoint()
	if err == nil {
		_, err = f.postLocked(ctx, note)
	}
	f.postMu.Unlock()
	if err != nil {
		f.failed("post", err)
		return reports.FleetPart{}, auditd.Errorf(auditd.EUNAVAILABLE, "This node's checkpoint cannot be posted to the fleet log: %v", err)
	}
	nt, _, err := f.flog.Node(ctx, f.node)
	if err != nil {
		return reports.FleetPart{}, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet log cannot be read: %v", err)
	}
	return reports.FleetPart{Node: f.node, Report: rep, Logged: nt.Size, FleetLeaf: nt.Leaf, Dispatches: ds}, nil
}

// partDispatches reads the run's dispatch events on the sources the fleet
// limits from this node's ledger, but those closed as not sent, with those
// limits: what the fleet pack's over-limit proof checks, from the same
// events.
func (f *fleetRuns) partDispatches(ctx context.Context, id string) (*reports.PartDispatches, error) {
	limits, err := f.limits(ctx, id)
	if err != nil {
		return nil, err
	}
	out := &reports.PartDispatches{Limits: limits, Sources: make([]reports.SourceDispatches, len(limits))}
	sent := make([]reports.SentScan, len(limits))
	idx := map[string]int{}
	for i, l := range limits {
		out.Sources[i].Source, idx[l.Source] = l.Source, i
	}
	err = ledger.NewReader(f.db).ScanRun(id, 0, func(e *auditd.Event) error {
		i, ok := idx[e.SourceID]
		if !ok {
			return nil
		}
		sent[i].See(e)
		if e.Type == auditd.EventDispatch {
			s := &out.Sources[i]
			s.At, s.Seq = append(s.At, e.Time.UnixNano()), append(s.Seq, e.Seq)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dispatches of run %s: %w", id, err)
	}
	for i := range out.Sources {
		s := &out.Sources[i]
		s.At, s.Seq = reports.Sent(s.At, &sent[i]), reports.Sent(s.Seq, &sent[i])
	}
	return out, nil
}

// Reconciliation asks every node that holds a part of the run for it, at
// once, and sums them; a node that cannot answer is a part missing (F1).
// A node that refuses the caller's token is no missing part but the
// caller's problem: a 403, and no report.
func (f *fleetRuns) Reconciliation(ctx context.Context, id, authorization string) (*reports.FleetReport, error) {
	run, err := f.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	parts := make([]reports.FleetPart, len(run.Parts))
	errs := eachPart(run.Parts, func(i int, node string) (err error) {
		var p reports.FleetPart
		if node == f.node {
			p, err = f.Part(ctx, id)
		} else {
			err = f.peerCall(ctx, node, http.MethodGet, "/v1/fleet/runs/"+id+"/part", authorization, nil, &p)
		}
		switch {
		case err != nil:
			p = reports.FleetPart{Node: node, Error: err.Error()}
		case p.Node != node:
			p = reports.FleetPart{Node: node, Error: fmt.Sprintf("node %s answered as node %q", node, p.Node)}
		}
		parts[i] = p
		return err
	})
	if err := errors.Join(errs...); errors.Is(err, errPeerRefused) {
		return nil, peerFailed(err, "Fleet run %s: no reconciliation", id)
	}
	return reports.CombineFleet(id, parts), nil
}

// WritePart writes this node's part of an ended run: its evidence pack,
// proven against the checkpoint it then posts to the fleet log (no newer
// post comes between), as a fleet pack of one node with the node's fleet
// leaf, the blocks of slots its ledger records from a little before the
// part started, and the limits of the part's sources.
func (f *fleetRuns) WritePart(ctx context.Context, w io.Writer, id string) error {
	v, err := f.store.Run(ctx, id)
	if err != nil {
		return err
	}
	if !v.Status.Terminal() {
		return auditd.Errorf(auditd.ECONFLICT, "Run %s is %s on node %s: its part can be packed once it has ended.", id, v.Status, f.node)
	}
	tmp, err := os.CreateTemp("", "auditd-fleet-part-*.zip")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	f.postMu.Lock()
	p, e, err := f.packAndPost(ctx, tmp, id)
	f.postMu.Unlock()
	if err != nil {
		return err
	}
	raw, err := f.flog.Leaf(ctx, e.Index)
	if err != nil {
		return err
	}
	leaf, err := fleetlog.ParseLeaf(raw)
	if err != nil {
		return err
	}
	st, err := ledger.OpenCheckpoint(p.Checkpoint, f.led.PublicKey())
	if err != nil {
		return err
	}
	blocks, err := f.blocks(v.CreatedAt, st.Size, leaf.Revision)
	if err != nil {
		return err
	}
	limits, err := f.limits(ctx, id)
	if err != nil {
		return err
	}
	m := pack.FleetManifest{Runs: []string{id}, Limits: limits, SlotSlack: int64(fleet.DefaultGrace + f.lag),
		Nodes: []pack.FleetNode{{Name: f.node, Key: f.led.PublicKey(), LeafIndex: e.Index, Leaf: base64.StdEncoding.EncodeToString(raw), Blocks: blocks}}}
	if _, err := tmp.Seek(0, io.SeekStart); err != nil {
		return err
	}
	return pack.WriteFleet(w, pack.FleetParts{Manifest: m, Packs: map[string]io.Reader{f.node: tmp}})
}

// packAndPost writes the node's pack of run id to tmp and posts the
// checkpoint it is proven against. The caller holds postMu.
func (f *fleetRuns) packAndPost(ctx context.Context, tmp *os.File, id string) (*pack.Pack, fleetlog.Entry, error) {
	if err := f.packs.WritePack(ctx, tmp, []string{id}, "fleet run "+id+" on node "+f.node); err != nil {
		return nil, fleetlog.Entry{}, err
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, fleetlog.Entry{}, err
	}
	p, err := pack.Open(tmp, size)
	if err != nil {
		return nil, fleetlog.Entry{}, err
	}
	e, err := f.postLocked(ctx, p.Checkpoint)
	if err != nil {
		f.failed("post", err)
		return nil, fleetlog.Entry{}, auditd.Errorf(auditd.EUNAVAILABLE, "This node's checkpoint cannot be posted to the fleet log: %v", err)
	}
	return p, e, nil
}

// blocks returns the blocks of slots the ledger records from a little
// before from up to event size, granted at most at revision rev.
func (f *fleetRuns) blocks(from time.Time, size uint64, rev int64) ([]pack.FleetBlock, error) {
	r := ledger.NewReader(f.db)
	first, err := r.SeqAt(from.Add(-fleetBlockMargin))
	if err != nil {
		return nil, err
	}
	var out []pack.FleetBlock
	err = r.Scan(first, size, func(e *auditd.Event) error {
		if b, ok := pack.ReservedBlock(e); ok && b.Revision <= rev {
			out = append(out, b)
		}
		return nil
	})
	return out, err
}

// limits are the budgets the fleet shares for the run's sources: each
// source's ceiling, at which its slots are reserved. A source in a gateway
// group shares the group's budget, which the proof does not cover.
func (f *fleetRuns) limits(ctx context.Context, id string) ([]pack.FleetLimit, error) {
	rep, err := f.reps.Reconciliation(ctx, id)
	if err != nil {
		return nil, err
	}
	var out []pack.FleetLimit
	for _, s := range rep.Sources {
		st, err := f.reg.State(s.SourceID)
		if err != nil || st.Group != "" {
			continue
		}
		out = append(out, pack.FleetLimit{Source: s.SourceID, Limit: int64(st.CeilingLimit), Window: int64(st.CeilingWindow)})
	}
	return out, nil
}
