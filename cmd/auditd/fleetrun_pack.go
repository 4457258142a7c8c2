package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/pack"
)

// WritePack writes the fleet pack of the run: every node's part (each
// node's pack and fleet leaf, WritePart), the fleet checkpoint of the log
// once every part is in it, cosigned by every node of the run, and each
// node leaf's inclusion proof in it. Nothing is written unless every part
// and every cosignature came.
func (f *fleetRuns) WritePack(ctx context.Context, w io.Writer, id, authorization string) error {
	run, err := f.Run(ctx, id)
	if err != nil {
		return err
	}
	tmps := make([]*os.File, len(run.Parts))
	for i := range tmps {
		if tmps[i], err = os.CreateTemp("", "auditd-fleet-part-*.zip"); err != nil {
			return err
		}
		defer os.Remove(tmps[i].Name())
		defer tmps[i].Close()
	}
	parts := make([]*pack.FleetPack, len(run.Parts))
	errs := eachPart(run.Parts, func(i int, node string) (err error) {
		parts[i], err = f.fetchPart(ctx, tmps[i], node, id, authorization)
		return err
	})
	for i, err := range errs {
		switch {
		case auditd.ErrorCode(err) == auditd.ECONFLICT: // this node's part
			return auditd.Errorf(auditd.ECONFLICT, "Fleet run %s: %s Finish the fleet run (POST /v1/fleet/runs/%s/finish), then pack it.", id, auditd.ErrorMessage(err), id)
		case errors.Is(err, errPeerConflict):
			return auditd.Errorf(auditd.ECONFLICT, "Fleet run %s: %v Finish the fleet run (POST /v1/fleet/runs/%s/finish), then pack it.", id, err, id)
		case err != nil:
			return peerFailed(err, "Fleet run %s: node %s's part", id, run.Parts[i])
		}
	}
	head, err := f.flog.Head(ctx)
	if err != nil {
		return err
	}
	for _, node := range run.Parts {
		if node == f.node {
			_, err = f.Cosign(ctx, head.Size)
		} else {
			err = f.peerCall(ctx, node, http.MethodPost, "/v1/fleet/log/cosignatures", authorization, map[string]uint64{"size": head.Size}, nil)
		}
		if err != nil {
			return peerFailed(err, "Fleet run %s: node %s does not cosign the fleet log at %d", id, node, head.Size)
		}
	}
	cp, _, err := f.flog.Checkpoint(ctx, head.Size)
	if err != nil {
		return err
	}
	m := pack.FleetManifest{Origin: head.Origin, TreeSize: head.Size, Runs: []string{id}}
	packs := map[string]io.Reader{}
	limits := map[string]pack.FleetLimit{}
	for _, fp := range parts {
		n := fp.Manifest.Nodes[0]
		proof, err := f.flog.ProveLeaf(ctx, n.LeafIndex, head.Size)
		if err != nil {
			return err
		}
		for _, h := range proof {
			n.Inclusion = append(n.Inclusion, base64.StdEncoding.EncodeToString(h[:]))
		}
		m.Nodes = append(m.Nodes, n)
		packs[n.Name] = fp.NodePack(n.Name)
		m.SlotSlack = max(m.SlotSlack, fp.Manifest.SlotSlack)
		for _, l := range fp.Manifest.Limits {
			if old, ok := limits[l.Source]; !ok || l.Limit*old.Window < old.Limit*l.Window {
				limits[l.Source] = l // the strictest a node holds
			}
		}
	}
	for _, src := range slices.Sorted(maps.Keys(limits)) {
		m.Limits = append(m.Limits, limits[src])
	}
	book, err := fleetWorkbook(id, parts)
	if err != nil {
		return err
	}
	defer os.Remove(book.Name())
	defer book.Close()
	return pack.WriteFleet(w, pack.FleetParts{Manifest: m, Checkpoint: cp, Packs: packs, Workbook: book})
}

// fleetWorkbook writes the fleet pack's workbook of the node packs'
// workbooks (pack.WriteFleetWorkbook) to a temporary file, open at its
// start; the caller removes it.
func fleetWorkbook(id string, parts []*pack.FleetPack) (*os.File, error) {
	nodes := map[string]*pack.Pack{}
	for _, fp := range parts {
		node := fp.Manifest.Nodes[0].Name
		nodes[node] = fp.Nodes[node]
	}
	tmp, err := os.CreateTemp("", "auditd-fleet-workbook-*.xlsx")
	if err != nil {
		return nil, err
	}
	err = pack.WriteFleetWorkbook(tmp, id, nodes, "")
	if err == nil {
		_, err = tmp.Seek(0, io.SeekStart)
	}
	if err != nil {
		tmp.Close()
		os.Remove(tmp.Name())
		return nil, fmt.Errorf("fleet run %s: its workbook: %w", id, err)
	}
	return tmp, nil
}

// fetchPart writes node's part of run id to tmp and opens it.
func (f *fleetRuns) fetchPart(ctx context.Context, tmp *os.File, node, id, authorization string) (*pack.FleetPack, error) {
	if node == f.node {
		if err := f.WritePart(ctx, tmp, id); err != nil {
			return nil, err
		}
	} else {
		resp, err := f.peerDo(ctx, node, http.MethodGet, "/v1/fleet/runs/"+id+"/part.zip", authorization, nil)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(tmp, resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
	}
	size, err := tmp.Seek(0, io.SeekCurrent)
	if err != nil {
		return nil, err
	}
	fp, err := pack.OpenFleet(tmp, size)
	if err != nil {
		return nil, err
	}
	if len(fp.Manifest.Nodes) != 1 || fp.Manifest.Nodes[0].Name != node || fp.Nodes[node] == nil {
		return nil, fmt.Errorf("not a part of node %s", node)
	}
	return fp, nil
}
