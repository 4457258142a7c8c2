package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// reconcileTimeout bounds a reconciliation fetched from a server.
const reconcileTimeout = 2 * time.Minute

// runReconcile prints a run's reconciliation, from a running server or
// offline from a stopped server's data directory, so a CI step is one
// line: exit 0 when it balances and the run succeeded; 1 when it does not
// balance, when the run did not succeed (partial, cancelled, unfinished)
// unless --allow-partial, or when --max-stale is given and an item was
// served from a copy older than it (or of unknown age); 2 on any error.
func runReconcile(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", "", "`URL` of a running auditd")
	data := fs.String("data", "", "data `directory` of a stopped auditd (offline)")
	runID := fs.String("run", "", "run `id`")
	token := fs.String("token", "", "API `token` (default $AUDITD_TOKEN)")
	format := fs.String("format", "table", "output: table, json or csv")
	allowPartial := fs.Bool("allow-partial", false, "exit 0 for a balanced run that did not succeed (partial, cancelled, unfinished)")
	maxStale := fs.Duration("max-stale", 0, "fail (exit 1) when an item was served from a last good copy older than this `duration` when served, or of unknown age; 0: any age")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd reconcile: %v\n", err)
		return 2
	}
	switch {
	case fs.NArg() > 0:
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	case *runID == "":
		return fail(errors.New("--run is required"))
	case (*server == "") == (*data == ""):
		return fail(errors.New("give exactly one of --server (a running auditd) or --data (offline)"))
	case *format != "table" && *format != "json" && *format != "csv":
		return fail(fmt.Errorf("unknown --format %q", *format))
	case *maxStale < 0:
		return fail(errors.New("--max-stale must not be negative"))
	}

	var rep *reports.Report
	var err error
	if *server != "" {
		if *token == "" {
			*token = os.Getenv("AUDITD_TOKEN")
		}
		rep, err = fetchReconciliation(ctx, http.DefaultClient, *server, *runID, *token)
	} else {
		rep, err = reconcileOffline(ctx, *data, *runID)
	}
	if err != nil {
		return fail(err)
	}
	if *format == "table" {
		err = reports.WriteTable(stdout, rep)
	} else {
		err = reports.Write(stdout, rep, *format)
	}
	if err != nil {
		return fail(err)
	}
	verdicts := ciVerdicts(rep, *allowPartial, *maxStale)
	for _, v := range verdicts {
		fmt.Fprintf(stderr, "auditd reconcile: %s\n", v)
	}
	if !rep.Balanced || len(verdicts) > 0 {
		return 1
	}
	return 0
}

// ciVerdicts says why a balanced or unbalanced reconciliation still fails a
// CI step: the run did not succeed (unless allowPartial), or items were
// served from copies older than maxStale (0: no bound), or of an age not
// on record.
func ciVerdicts(rep *reports.Report, allowPartial bool, maxStale time.Duration) []string {
	var out []string
	if rep.Run.Status != string(auditd.RunSucceeded) && !allowPartial {
		out = append(out, fmt.Sprintf("run %s is %s, not succeeded (--allow-partial accepts it)", rep.Run.ID, rep.Run.Status))
	}
	if maxStale <= 0 {
		return out
	}
	for _, c := range rep.Cached {
		switch {
		case !c.AgeKnown():
			out = append(out, fmt.Sprintf("item %s was served from a cached copy of unknown age (cache.served %d); --max-stale %v needs it known", c.ItemKey, c.Seq, maxStale))
		case c.Age.D() > maxStale:
			by := c.OriginRun
			if by == "" {
				by = "an unrecorded run"
			}
			out = append(out, fmt.Sprintf("item %s was served from a copy %v old, fetched by %s at %s: older than --max-stale %v",
				c.ItemKey, c.Age.D(), by, c.FetchedAt.UTC().Format(time.RFC3339), maxStale))
		}
	}
	return out
}

// fetchReconciliation gets GET {server}/v1/runs/{id}/reconciliation, the
// same JSON the offline path computes.
func fetchReconciliation(ctx context.Context, client *http.Client, server, runID, token string) (*reports.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	u := strings.TrimRight(server, "/") + "/v1/runs/" + url.PathEscape(runID) + "/reconciliation"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("server URL: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("server: %s", problem(resp))
	}
	var rep reports.Report
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&rep); err != nil {
		return nil, fmt.Errorf("server: decode reconciliation: %w", err)
	}
	if rep.Run.ID != runID || len(rep.Checks) == 0 {
		return nil, fmt.Errorf("server: response is not the reconciliation of run %s", runID)
	}
	return &rep, nil
}

// problem describes a failed response from its problem+json body when it
// has one.
func problem(resp *http.Response) string {
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if json.Unmarshal(b, &p) == nil && (p.Title != "" || p.Detail != "") {
		return strings.TrimSpace(fmt.Sprintf("%s: %s %s", resp.Status, p.Title, p.Detail))
	}
	return resp.Status
}

// reconcileOffline reconciles a run from the ledger of a stopped server's
// data directory, opened read-only, and re-hashes its staged payloads for
// R6. Live counters belong to the running service, so R7 is n/a; a data
// directory with no payload store (a ledger alone) has R6 count payloads
// without re-hashing them. The report's notes say which.
func reconcileOffline(ctx context.Context, dir, runID string) (*reports.Report, error) {
	db, err := openDB(dir, true)
	if err != nil {
		return nil, err
	}
	defer db.Close()
	r, err := offlineReconciler(db, dir)
	if err != nil {
		return nil, err
	}
	rep, err := r.Reconcile(ctx, runID, nil)
	if errors.Is(err, reports.ErrRunNotFound) {
		return nil, fmt.Errorf("run %s: %w", runID, err)
	}
	return rep, err
}

// offlineReconciler reconciles from db, the read-only bbolt file of the
// stopped server's data directory dir: the ledger's chain re-hashed (R8),
// and the staged payloads too (R6), unless dir holds no payload store.
func offlineReconciler(db *bolt.DB, dir string) (*reports.Reconciler, error) {
	r := reports.NewReconciler(ledger.NewReader(db))
	r.Hash = newLedgerHash()
	switch stage, err := staging.OpenReadOnly(db, filepath.Join(dir, payloadsDir)); {
	case err == nil:
		r.Payloads = stage
	case !errors.Is(err, staging.ErrNoStore):
		return nil, fmt.Errorf("open staged payloads: %w", err)
	}
	return r, nil
}

// newLedgerHash returns the ledger's chain hash for a Reconciler, reusing
// one buffer: a Reconciler calls it from one goroutine.
func newLedgerHash() reports.HashFunc {
	var buf []byte
	return func(prev [32]byte, e *auditd.Event) (h [32]byte) {
		h, buf = ledger.HashEvent(buf, prev, e)
		return h
	}
}
