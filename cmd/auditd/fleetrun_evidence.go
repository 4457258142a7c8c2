package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// WriteEvidence writes the fleet run's evidence workbook: every node's
// workbook of its part (GET /v1/runs/{id}/evidence.xlsx on the node, this
// one included, so each node's access log records the download), merged
// row for row behind a Node column, with the fleet reconciliation's checks
// (reports.WriteFleetEvidence). Nothing is written unless every node's
// workbook came.
func (f *fleetRuns) WriteEvidence(ctx context.Context, w io.Writer, id, authorization string) error {
	run, err := f.Run(ctx, id)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "auditd-fleet-evidence-*")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	parts := make([]reports.FleetWorkbook, len(run.Parts))
	errs := eachPart(run.Parts, func(i int, node string) (err error) {
		parts[i], err = f.fetchWorkbook(ctx, filepath.Join(dir, fmt.Sprintf("%d.xlsx", i)), node, id, authorization)
		return err
	})
	for _, p := range parts {
		if c, ok := p.Book.(io.Closer); ok {
			defer c.Close()
		}
	}
	if err := errors.Join(errs...); err != nil {
		return peerFailed(err, "Fleet run %s: not every node's workbook came", id)
	}
	rep, err := f.Reconciliation(ctx, id, authorization)
	if err != nil {
		return err
	}
	return reports.WriteFleetEvidence(w, reports.FleetEvidence{RunID: id, Parts: parts, Report: rep, GeneratedAt: time.Now().UTC()})
}

// fetchWorkbook downloads node's workbook of run id into path.
func (f *fleetRuns) fetchWorkbook(ctx context.Context, path, node, id, authorization string) (reports.FleetWorkbook, error) {
	resp, err := f.peerDo(ctx, node, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/evidence.xlsx", authorization, nil)
	if err != nil {
		return reports.FleetWorkbook{}, err
	}
	defer resp.Body.Close()
	file, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return reports.FleetWorkbook{}, err
	}
	size, err := io.Copy(file, resp.Body)
	if err != nil {
		file.Close()
		return reports.FleetWorkbook{}, fmt.Errorf("node %s: its workbook: %w", node, err)
	}
	return reports.FleetWorkbook{Node: node, Book: file, Size: size}, nil
}

// Timeline is the fleet run's timeline: every node's (GET
// /v1/runs/{id}/timeline on the node, with q's bucket and sources), each
// source's rows naming their node.
func (f *fleetRuns) Timeline(ctx context.Context, id string, q auditd.TimelineQuery, authorization string) (*reports.FleetTimeline, error) {
	run, err := f.Run(ctx, id)
	if err != nil {
		return nil, err
	}
	query := url.Values{"bucket": {q.Bucket.String()}}
	if len(q.Sources) > 0 {
		query.Set("source", strings.Join(q.Sources, ","))
	}
	tls := make([]*auditd.Timeline, len(run.Parts))
	errs := eachPart(run.Parts, func(i int, node string) error {
		tls[i] = &auditd.Timeline{}
		return f.peerCall(ctx, node, http.MethodGet, "/v1/runs/"+url.PathEscape(id)+"/timeline?"+query.Encode(), authorization, nil, tls[i])
	})
	if err := errors.Join(errs...); err != nil {
		return nil, peerFailed(err, "Fleet run %s: not every node's timeline came", id)
	}
	parts := map[string]*auditd.Timeline{}
	for i, node := range run.Parts {
		parts[node] = tls[i]
	}
	return reports.CombineFleetTimelines(id, parts)
}
