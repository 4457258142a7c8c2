package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
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
	fs := newFlags("reconcile", "reconcile --run ID (--server URL | --data DIR) [flags]", stdout, stderr)
	server := fs.String("server", "", "`URL` of a running auditd")
	data := fs.String("data", "", "data `directory` of a stopped auditd (offline)")
	runID := fs.String("run", "", "run `id`")
	token := fs.String("token", "", "API `token` (default $AUDITD_TOKEN)")
	format := fs.String("format", "table", "output: table, json or csv")
	allowPartial := fs.Bool("allow-partial", false, "exit 0 for a balanced run that did not succeed (partial, cancelled, unfinished)")
	maxStaleText := fs.String("max-stale", "", "fail (exit 1) when an item was served from a last good copy older than this `duration` (90s, 30m, 24h) when served, or of unknown age; default: any age")
	listCached := fs.Bool("list-cached", false, "list every item served from cache (the table sums them up by source)")
	fleet := fs.Bool("fleet", false, "reconcile the fleet run over every node's part (with --server: any node of the fleet; fleetrun_cli.go); without it, --server answers for the fleet run when the run is one")
	if code, ok := fs.parse(args); !ok {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd reconcile: %v\n", err)
		return 2
	}
	var maxStale time.Duration
	if *maxStaleText != "" {
		d, err := time.ParseDuration(*maxStaleText)
		if err != nil || d < 0 {
			return fs.fail("--max-stale %q: want a duration such as 90s, 30m or 24h", *maxStaleText)
		}
		maxStale = d
	}
	*runID = api.CanonicalRunID(*runID)
	switch {
	case *runID == "":
		return fs.fail("--run is required: the id of the run to reconcile")
	case (*server == "") == (*data == ""):
		return fs.fail("give exactly one of --server URL (a running auditd) or --data DIR (a stopped one's data directory)")
	case *format != "table" && *format != "json" && *format != "csv":
		return fs.fail("--format %q: want table, json or csv", *format)
	}

	if *fleet && *server == "" {
		return fs.fail("--fleet needs --server URL: any node of the fleet")
	}
	if *server != "" {
		tok := cmp.Or(*token, os.Getenv("AUDITD_TOKEN"))
		isFleet := *fleet
		if !isFleet {
			var err error
			if isFleet, err = fleetRunExists(ctx, http.DefaultClient, *server, *runID, tok); err != nil {
				return fail(err)
			}
		}
		if isFleet {
			return reconcileFleet(ctx, *server, *runID, tok, fleetReconcileFlags{
				format: *format, allowPartial: *allowPartial, listCached: *listCached,
				maxStale: maxStale, maxStaleText: *maxStaleText,
			}, stdout, stderr)
		}
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
	verdicts := ciVerdicts(rep, *allowPartial, maxStale, *maxStaleText)
	if *format == "table" {
		err = writeReconcileTable(stdout, rep, *listCached, verdicts)
	} else {
		err = reports.Write(stdout, rep, *format)
	}
	if err != nil {
		return fail(err)
	}
	for _, v := range verdicts {
		fmt.Fprintf(stderr, "auditd reconcile: %s\n", v)
	}
	if len(verdicts) > 0 {
		return 1
	}
	return 0
}

// ciVerdicts says why a reconciliation fails a CI step, if it does: it
// does not balance; the run did not succeed (unless allowPartial); items
// were served from copies older than maxStale (0: no bound, maxStaleText
// as the flag was given), or of an age not on record.
func ciVerdicts(rep *reports.Report, allowPartial bool, maxStale time.Duration, maxStaleText string) []string {
	var out []string
	if !rep.Balanced {
		out = append(out, fmt.Sprintf("the reconciliation does not balance: %s failed", strings.Join(rep.Failed(), ", ")))
	}
	if rep.Run.Status != string(auditd.RunSucceeded) && !allowPartial {
		out = append(out, fmt.Sprintf("run %s is %s, not succeeded (--allow-partial accepts it)", rep.Run.ID, rep.Run.Status))
	}
	return append(out, staleVerdicts(rep.Cached, "", maxStale, maxStaleText)...)
}

// staleVerdicts says which of the items served from cache (of node, in a
// fleet run; "" otherwise) break --max-stale: copies older than maxStale
// (0: no bound, maxStaleText as the flag was given), or of an age not on
// record.
func staleVerdicts(cached []reports.CachedItem, node string, maxStale time.Duration, maxStaleText string) []string {
	if maxStale <= 0 {
		return nil
	}
	var out []string
	var unknown, stale int64
	var oldest *reports.CachedItem
	for i := range cached {
		c := &cached[i]
		switch {
		case !c.AgeKnown():
			unknown++
		case c.Age.D() > maxStale:
			stale++
			if oldest == nil || c.Age > oldest.Age {
				oldest = c
			}
		}
	}
	on := ""
	if node != "" {
		on = " on node " + node
	}
	if unknown > 0 {
		out = append(out, fmt.Sprintf("%s served%s from cached copies of unknown age; --max-stale %s needs the age known",
			wasWere(unknown, "item"), on, maxStaleText))
	}
	if stale > 0 {
		by := "run " + oldest.OriginRun
		if oldest.OriginRun == "" {
			by = "an unrecorded run"
		}
		out = append(out, fmt.Sprintf("%s served%s from copies older than --max-stale %s; the oldest, item %s, was %s old, fetched by %s at %s",
			wasWere(stale, "item"), on, maxStaleText, oldest.ItemKey, humanDuration(oldest.Age.D()), by, oldest.FetchedAt.UTC().Format(proofTime)))
	}
	return out
}

// wasWere is "1 item was", "2 items were".
func wasWere(n int64, noun string) string {
	if n == 1 {
		return plural(n, noun) + " was"
	}
	return plural(n, noun) + " were"
}

// checkMeanings say in a few words what each identity holds to (the
// report's descriptions give the counts each compares).
var checkMeanings = map[string]string{
	reports.R1:  "every item queued ended (succeeded, cached, failed, shed) or is pending",
	reports.R2:  "every request sent has an outcome",
	reports.R3:  "every retry follows a failed attempt of the same request",
	reports.R4:  "every throttle (429, pause) was waited out before sending again",
	reports.R5:  "the breaker was obeyed: nothing sent open, only probes half-open",
	reports.R6:  "every success's payload is staged and its hash verifies",
	reports.R7:  "the live counters equal a recount of the ledger's events",
	reports.R8:  "the run's events are contiguous and their hash chain verifies",
	reports.R9:  "every request was within the limit in force (plus burst)",
	reports.R10: "every item delivered was acknowledged by the pipeline",
	reports.F1:  "every node holding a part of the fleet run answered with it",
	reports.F2:  "every part's events are in its node's checkpoint in the fleet log",
}

// writeReconcileTable writes rep for a person at a terminal: the verdict,
// each identity with what it means, the sources that failed, the items
// served from cache summed up by source (each one with listCached), and
// the exit status with its reasons.
func writeReconcileTable(w io.Writer, rep *reports.Report, listCached bool, verdicts []string) error {
	verdict := "BALANCED: every identity holds"
	if !rep.Balanced {
		verdict = "NOT BALANCED: failed " + strings.Join(rep.Failed(), ", ")
	}
	fmt.Fprintf(w, "run %s  status %s  events %d..%d\n%s\n\n", rep.Run.ID, rep.Run.Status, rep.Run.FirstSeq, rep.Run.LastSeq, verdict)
	if err := writeChecks(w, rep.Checks); err != nil {
		return err
	}
	for _, s := range rep.Sources {
		if s.Balanced {
			continue
		}
		var failed []string
		for _, c := range s.Checks {
			if c.Status == reports.StatusFail {
				failed = append(failed, c.ID)
			}
		}
		fmt.Fprintf(w, "source %s: failed %s\n", s.SourceID, strings.Join(failed, ", "))
	}
	if len(rep.Cached) > 0 {
		if err := writeCached(w, rep.Cached, listCached); err != nil {
			return err
		}
	}
	why := "the run succeeded"
	if rep.Run.Status != string(auditd.RunSucceeded) {
		why = "the run is " + rep.Run.Status + ", accepted by --allow-partial"
	}
	return writeExit(w, verdicts, why)
}

// writeChecks writes the identities checked, each with what it holds to.
func writeChecks(w io.Writer, checks []reports.Check) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CHECK\tWHAT IT HOLDS TO\tSTATUS\tEXPECTED\tACTUAL\tDIFF\tFIRST OFFENDING\tNOTE")
	for _, c := range checks {
		meaning := checkMeanings[c.ID]
		if meaning == "" {
			meaning = c.Description
		}
		offending := make([]string, len(c.Offending))
		for i, seq := range c.Offending {
			offending[i] = strconv.FormatUint(seq, 10)
		}
		diff := strconv.FormatInt(c.Difference, 10)
		if c.Difference > 0 {
			diff = "+" + diff
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", c.ID, meaning, c.Status, c.Expected, c.Actual, diff,
			cmp.Or(strings.Join(offending, " "), "-"), c.Note)
	}
	return tw.Flush()
}

// writeExit ends a reconciliation table with the exit status: 0 and why
// (no verdicts), or 1 and the verdicts.
func writeExit(w io.Writer, verdicts []string, why string) error {
	if len(verdicts) == 0 {
		_, err := fmt.Fprintf(w, "\nexit 0: balanced, and %s\n", why)
		return err
	}
	fmt.Fprintln(w, "\nexit 1:")
	for _, v := range verdicts {
		fmt.Fprintf(w, "  %s\n", v)
	}
	return nil
}

// writeCached sums up the items served from a last good copy per source:
// how many, the oldest copy's age and which run fetched it; with list, one
// line per item as well.
func writeCached(w io.Writer, cached []reports.CachedItem, list bool) error {
	type sum struct {
		items, unknown int64
		oldest         *reports.CachedItem
	}
	by := map[string]*sum{}
	var ids []string
	for i := range cached {
		c := &cached[i]
		s := by[c.SourceID]
		if s == nil {
			s = &sum{}
			by[c.SourceID] = s
			ids = append(ids, c.SourceID)
		}
		s.items++
		switch {
		case !c.AgeKnown():
			s.unknown++
		case s.oldest == nil || c.Age > s.oldest.Age:
			s.oldest = c
		}
	}
	slices.Sort(ids)
	fmt.Fprintf(w, "\nserved from cache: %s\n", plural(int64(len(cached)), "item"))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SOURCE\tITEMS\tOLDEST COPY\tFETCHED AT\tBY RUN\tAGE UNKNOWN")
	for _, id := range ids {
		s := by[id]
		age, at, run := "-", "-", "-"
		if o := s.oldest; o != nil {
			age, at, run = humanDuration(o.Age.D()), o.FetchedAt.UTC().Format(proofTime), cmp.Or(o.OriginRun, "-")
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\n", id, s.items, age, at, run, s.unknown)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if !list {
		_, err := fmt.Fprintln(w, "(--list-cached lists every item)")
		return err
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tSOURCE\tITEM\tAGE\tFETCHED AT\tBY RUN\tREASON")
	for _, c := range cached {
		age, at := "unknown", "-"
		if c.AgeKnown() {
			age, at = humanDuration(c.Age.D()), c.FetchedAt.UTC().Format(proofTime)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Seq, c.SourceID, c.ItemKey, age, at, cmp.Or(c.OriginRun, "-"), c.Reason)
	}
	return tw.Flush()
}

// humanDuration says d as a person reads it, as the web UI does: 250ms,
// 1.5s, 12s, 1m 30s, 2m, 3h 5m, 2d 4h.
func humanDuration(d time.Duration) string {
	if d < 0 {
		return "-" + humanDuration(-d)
	}
	two := func(n1 int64, u1 string, n2 int64, u2 string) string {
		if n2 == 0 {
			return fmt.Sprintf("%d%s", n1, u1)
		}
		return fmt.Sprintf("%d%s %d%s", n1, u1, n2, u2)
	}
	switch {
	case d == 0:
		return "0s"
	case d < time.Millisecond:
		return "under 1ms"
	case d < time.Second-time.Millisecond/2:
		return fmt.Sprintf("%dms", d.Round(time.Millisecond).Milliseconds())
	case d < 9950*time.Millisecond:
		return strings.TrimSuffix(fmt.Sprintf("%.1f", d.Round(100*time.Millisecond).Seconds()), ".0") + "s"
	case d < time.Minute-time.Second/2:
		return fmt.Sprintf("%ds", int64(d.Round(time.Second).Seconds()))
	case d < time.Hour-time.Minute/2:
		s := int64(d.Round(time.Second).Seconds())
		return two(s/60, "m", s%60, "s")
	case d < 24*time.Hour-time.Hour/2:
		m := int64(d.Round(time.Minute).Minutes())
		return two(m/60, "h", m%60, "m")
	}
	h := int64(d.Round(time.Hour).Hours())
	return two(h/24, "d", h%24, "h")
}

// fetchReconciliation gets GET {server}/v1/runs/{id}/reconciliation, the
// same JSON the offline path computes.
func fetchReconciliation(ctx context.Context, client *http.Client, server, runID, token string) (*reports.Report, error) {
	var rep reports.Report
	if err := getReport(ctx, client, server, "/v1/runs/"+url.PathEscape(runID)+"/reconciliation", token, "reconciliation", &rep); err != nil {
		return nil, err
	}
	if rep.Run.ID != runID || len(rep.Checks) == 0 {
		return nil, fmt.Errorf("server: response is not the reconciliation of run %s", runID)
	}
	return &rep, nil
}

// getReport decodes the JSON answer to GET {server}{path} into v, what
// names in its errors; any answer but 200 is the server's problem, said as
// it said it.
func getReport(ctx context.Context, client *http.Client, server, path, token, what string, v any) error {
	ctx, cancel := context.WithTimeout(ctx, reconcileTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(server, "/")+path, nil)
	if err != nil {
		return fmt.Errorf("server URL: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("server: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("server: %s", problem(resp))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(v); err != nil {
		return fmt.Errorf("server: decode %s: %w", what, err)
	}
	return nil
}

// problem describes a failed response from its problem+json body when it
// has one.
func problem(resp *http.Response) string {
	var p struct {
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if json.Unmarshal(b, &p) != nil {
		return resp.Status
	}
	if p.Title == http.StatusText(resp.StatusCode) {
		p.Title = "" // the status says it already
	}
	if resp.StatusCode == http.StatusUnauthorized {
		p.Detail = strings.TrimSpace(p.Detail + " Pass --token, or set AUDITD_TOKEN.")
	}
	if msg := strings.TrimSpace(p.Title + " " + p.Detail); msg != "" {
		return resp.Status + ": " + msg
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
