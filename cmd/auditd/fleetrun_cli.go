package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
)

// fleetReconcileFlags are the flags of `auditd reconcile` that apply to a
// fleet run.
type fleetReconcileFlags struct {
	format       string
	allowPartial bool
	listCached   bool
	maxStale     time.Duration // 0: no bound
	maxStaleText string
}

// reconcileFleet prints a fleet run's reconciliation, over every node's
// part, from any node of the fleet (GET /v1/fleet/runs/{id}/reconciliation).
// Exit codes as for one node's run: 0 balanced and succeeded, 1 not
// balanced or not succeeded (unless allowPartial), or an item served from a
// copy older than --max-stale on any node; 2 on any error.
func reconcileFleet(ctx context.Context, server, runID, token string, f fleetReconcileFlags, stdout, stderr io.Writer) int {
	if f.format == "csv" {
		fmt.Fprintln(stderr, "auditd reconcile: --fleet: --format csv is not there for a fleet run; use table or json")
		return 2
	}
	rep, err := fetchFleetReconciliation(ctx, http.DefaultClient, server, runID, token)
	if err != nil {
		fmt.Fprintf(stderr, "auditd reconcile: %v\n", err)
		return 2
	}
	verdicts := fleetVerdicts(rep, f)
	if f.format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		err = enc.Encode(rep)
	} else {
		err = writeFleetTable(stdout, rep, f.listCached, verdicts)
	}
	if err != nil {
		fmt.Fprintf(stderr, "auditd reconcile: %v\n", err)
		return 2
	}
	for _, v := range verdicts {
		fmt.Fprintf(stderr, "auditd reconcile: %s\n", v)
	}
	if len(verdicts) > 0 {
		return 1
	}
	return 0
}

// fleetVerdicts says why a fleet run's reconciliation fails a CI step, as
// ciVerdicts does for one node's run: --max-stale holds on every node's
// part.
func fleetVerdicts(rep *reports.FleetReport, f fleetReconcileFlags) []string {
	var out []string
	if !rep.Balanced {
		out = append(out, fmt.Sprintf("the fleet reconciliation does not balance: %s failed", strings.Join(rep.Failed(), ", ")))
	}
	switch missing := rep.Missing(); {
	case len(missing) > 0:
		// No flag accepts a part not had: F1 fails.
		out = append(out, fmt.Sprintf("fleet run %s: no part came from %s", rep.RunID, strings.Join(missing, ", ")))
	case rep.Status != "succeeded" && !f.allowPartial:
		out = append(out, fmt.Sprintf("fleet run %s is %s, not succeeded (--allow-partial accepts it)", rep.RunID, rep.Status))
	}
	for _, p := range rep.Parts {
		if p.Report != nil {
			out = append(out, staleVerdicts(p.Report.Cached, p.Node, f.maxStale, f.maxStaleText)...)
		}
	}
	return out
}

// fleetRunExists asks server whether runID is a fleet run (GET
// /v1/fleet/runs/{id}). A 404 says it is not: not_found (no such fleet
// run), not_in_fleet (the server is not in a fleet), or a server older
// than fleet runs. Any other answer but 200 (503: etcd out of reach) is an
// error, since the run may be one and a node's part is not the answer.
func fleetRunExists(ctx context.Context, client *http.Client, server, runID, token string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(server, "/")+"/v1/fleet/runs/"+url.PathEscape(runID), nil)
	if err != nil {
		return false, fmt.Errorf("server URL: %w", err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return true, nil
	case http.StatusNotFound:
		return false, nil
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return false, fmt.Errorf("server: %s", problem(resp))
	}
	return false, fmt.Errorf("server: cannot tell whether run %s is a fleet run: %s", runID, problem(resp))
}

// fetchFleetReconciliation gets GET {server}/v1/fleet/runs/{id}/reconciliation.
func fetchFleetReconciliation(ctx context.Context, client *http.Client, server, runID, token string) (*reports.FleetReport, error) {
	var rep reports.FleetReport
	if err := getReport(ctx, client, server, "/v1/fleet/runs/"+url.PathEscape(runID)+"/reconciliation", token, "fleet reconciliation", &rep); err != nil {
		return nil, err
	}
	if rep.RunID != runID || len(rep.Checks) == 0 {
		return nil, fmt.Errorf("server: response is not the fleet reconciliation of run %s", runID)
	}
	return &rep, nil
}

// writeFleetTable prints a fleet run's reconciliation as
// writeReconcileTable does one node's run: the verdict, the checks over
// the fleet with what each holds to, each node's part, the items each
// node served from cache (each one with listCached), and the exit status
// with its reasons (verdicts).
func writeFleetTable(w io.Writer, rep *reports.FleetReport, listCached bool, verdicts []string) error {
	verdict := "BALANCED: every identity holds on every node's part"
	if !rep.Balanced {
		verdict = "NOT BALANCED: failed " + strings.Join(rep.Failed(), ", ")
	}
	had := len(rep.Parts) - len(rep.Missing())
	fmt.Fprintf(w, "fleet run %s  status %s  dispatches %d in the parts of %d of %d nodes\n%s\n\n", rep.RunID, rep.Status,
		rep.Counts.Dispatches, had, len(rep.Parts), verdict)
	if err := writeChecks(w, rep.Checks); err != nil {
		return err
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATUS\tBALANCED\tDISPATCHES\tLOGGED")
	for _, p := range rep.Parts {
		if p.Report == nil {
			fmt.Fprintf(tw, "%s\tmissing\t-\t-\t%s\n", p.Node, p.Error)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%t\t%d\tsize %d (fleet leaf %d)\n", p.Node, p.Report.Run.Status, p.Report.Balanced, p.Report.Counts.Dispatches, p.Logged, p.FleetLeaf)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range rep.Parts {
		if p.Report == nil || len(p.Report.Cached) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nnode %s:", p.Node)
		if err := writeCached(w, p.Report.Cached, listCached); err != nil {
			return err
		}
	}
	why := "every part succeeded"
	if rep.Status != "succeeded" {
		why = "the run is " + rep.Status + ", accepted by --allow-partial"
	}
	return writeExit(w, verdicts, why)
}

// packFleet downloads a finished fleet run's evidence pack from any node
// of the fleet (GET /v1/fleet/runs/{id}/evidence-pack.zip) into out, whole
// or not at all, and names what it holds. Exit codes: 0 written, 2 on any
// error (a run still running is the server's 409, said as it said it).
func packFleet(ctx context.Context, server, runID, token, out string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd pack: --fleet: %v\n", err)
		return 2
	}
	// --out is checked before the server builds the pack, charges the
	// token for it and records its download.
	if err := checkOut(out); err != nil {
		return fail(fmt.Errorf("--out %s: %w", out, err))
	}
	u := strings.TrimRight(server, "/") + "/v1/fleet/runs/" + url.PathEscape(runID) + "/evidence-pack.zip"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return fail(fmt.Errorf("server URL: %w", err))
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fail(fmt.Errorf("server: %w", err))
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return fail(fmt.Errorf("server: %s (a run of one node is packed without --fleet)", problem(resp)))
	}
	if resp.StatusCode != http.StatusOK {
		return fail(fmt.Errorf("server: %s", problem(resp)))
	}
	err = writeFileAtomic(out, func(w io.Writer) error {
		_, err := io.Copy(w, resp.Body)
		return err
	})
	if err != nil {
		return fail(fmt.Errorf("write %s: %w", out, err))
	}
	fp, closer, err := pack.OpenFleetFile(out)
	if err != nil {
		os.Remove(out) // not a fleet pack: nothing half-right is left behind
		return fail(fmt.Errorf("the server's answer is not a fleet pack: %w", err))
	}
	defer closer.Close()
	names := make([]string, len(fp.Manifest.Nodes))
	for i, n := range fp.Manifest.Nodes {
		names[i] = n.Name
	}
	fmt.Fprintf(stdout, "wrote %s: fleet run %s, %s (%s), fleet log %s at size %d\n",
		out, runID, plural(int64(len(names)), "node"), strings.Join(names, ", "), fp.Manifest.Origin, fp.Manifest.TreeSize)
	return 0
}
