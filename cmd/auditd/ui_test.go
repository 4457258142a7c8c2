package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/web/webtest"
)

// uiRun is what the test reads of GET /v1/runs/{id}: the fields the run
// page shows, with the counts kept loose so a missing key is seen as such.
type uiRun struct {
	ID          string         `json:"id"`
	Name        string         `json:"name"`
	Status      string         `json:"status"`
	InitiatedBy string         `json:"initiated_by"`
	ConfigHash  string         `json:"config_hash"`
	CodeVersion string         `json:"code_version"`
	CreatedAt   string         `json:"created_at"`
	FinishedAt  string         `json:"finished_at"`
	FirstSeq    uint64         `json:"first_seq"`
	LastSeq     uint64         `json:"last_seq"`
	HeadAtStart string         `json:"head_at_start"`
	HeadAtEnd   string         `json:"head_at_end"`
	ItemCount   int            `json:"item_count"`
	Counts      map[string]any `json:"counts"`
}

// uiReconciliation is what the test reads of a run's reconciliation.
type uiReconciliation struct {
	Balanced bool                         `json:"balanced"`
	Checks   []uiCheck                    `json:"checks"`
	Sources  []struct{ Checks []uiCheck } `json:"sources"`
}

type uiCheck struct {
	ID        string   `json:"id"`
	Scope     string   `json:"scope"`
	Status    string   `json:"status"`
	Expected  int64    `json:"expected"`
	Actual    int64    `json:"actual"`
	Offending []uint64 `json:"offending"`
	Note      string   `json:"note"`
}

// failing says which checks fail, in which scope, at which events.
func (r *uiReconciliation) failing() string {
	var out []string
	all := r.Checks
	for _, s := range r.Sources {
		all = append(all, s.Checks...)
	}
	for _, c := range all {
		if c.Status == "fail" {
			out = append(out, fmt.Sprintf("%s[%s] expected %d actual %d offending %v %s", c.ID, c.Scope, c.Expected, c.Actual, c.Offending, c.Note))
		}
	}
	return strings.Join(out, "; ")
}

// logEvents logs the run's events around the offending ones, to read why.
func (r *uiReconciliation) logEvents(t *testing.T, srv *child, token, runID string) {
	t.Helper()
	var lo, hi uint64 = ^uint64(0), 0
	for _, c := range r.Checks {
		for _, seq := range c.Offending {
			lo, hi = min(lo, seq), max(hi, seq)
		}
	}
	if hi == 0 {
		return
	}
	var page struct{ Events []map[string]any }
	srv.call(t, "GET", "/v1/runs/"+runID+"/events?limit=1000", token, nil, &page)
	for _, e := range page.Events {
		if seq, _ := e["seq"].(float64); uint64(seq)+12 >= lo && uint64(seq) <= hi+3 {
			delete(e, "hash")
			delete(e, "prev_hash")
			delete(e, "run_id")
			t.Logf("event %v", e)
		}
	}
}

// uiCountLabels maps the run page's count cards (web/static/js/runs.js,
// runSummary) to the auditd.Counts fields they show.
var uiCountLabels = map[string]string{
	"Queued": "items", "Succeeded": "succeeded", "Served from cache": "cached", "Failed": "failed",
	"Shed": "shed", "Pending": "pending", "Dispatches": "dispatches", "Retries": "retries",
	"2xx": "status_2xx", "429": "status_429", "5xx": "status_5xx", "Other status": "status_other",
	"Transport errors": "transport_errors", "Interrupted": "interrupted", "Waits": "waits",
	"Breaker opens": "breaker_opens", "Payloads staged": "staged", "Acknowledged": "acknowledged",
}

// TestUIAgainstRealService drives the auditor UI in headless Chromium
// against auditd serve itself, after a small run against a simulator that
// throttles: the pages must show what the real API says, not what the fake
// API's fixtures say (web/browser_test.go covers those).
func TestUIAgainstRealService(t *testing.T) {
	if testing.Short() {
		t.Skip("starts auditd serve and a browser")
	}
	exe := webtest.Chromium(t)

	// county throttles at 8 requests a second while its ceiling says 40,
	// so auditd gets 429s with Retry-After, waits, and learns a lower
	// limit; state never throttles.
	_, urls := startSim(t, `
name: ui
seed: 1
upstreams:
  - name: county
    path: /q
    limit: {shape: fixed_window, requests: 8, window: 1s}
    reject: {status: 429, retry_after: delta}
    latency: {fixed: 5ms}
  - name: state
    path: /s
    limit: {shape: token_bucket, requests: 200, window: 1s, burst: 50}
    latency: {fixed: 5ms}
`)

	dir := t.TempDir()
	config := filepath.Join(dir, "sources.yaml")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`sources:
  - id: county
    base_url: %s
    limit: 40
    window: 1s
    concurrency: 4
  - id: state
    base_url: %s
    limit: 40
    window: 1s
    concurrency: 4
`, urls["county"], urls["state"])), 0o600); err != nil {
		t.Fatal(err)
	}
	const token = "ui-test-admin-token-0123456789abcdef"
	srv := startServe(t, filepath.Join(dir, "data"), config, token)

	const countyItems, stateItems = 20, 10
	var items []map[string]any
	for i := range countyItems {
		items = append(items, map[string]any{"key": fmt.Sprintf("c%02d", i), "source": "county", "path": fmt.Sprintf("/q?n=%d", i)})
	}
	for i := range stateItems {
		items = append(items, map[string]any{"key": fmt.Sprintf("s%02d", i), "source": "state", "path": fmt.Sprintf("/s?n=%d", i)})
	}
	var created struct {
		ID string `json:"id"`
	}
	const runName = "UI end-to-end: county and state"
	if code := srv.call(t, "POST", "/v1/runs", token, map[string]any{"name": runName, "items": items}, &created); code != http.StatusCreated {
		t.Fatalf("create run: %d\n%s", code, srv.logs)
	}
	var run uiRun
	srv.awaitRun(t, created.ID, token, 15*time.Second, &run)
	if run.Status != string(auditd.RunSucceeded) {
		t.Errorf("run ended %s: %v", run.Status, run.Counts)
	}
	if n, _ := run.Counts["status_429"].(float64); n == 0 {
		t.Errorf("the run saw no 429 (counts %v); the test shows no throttles", run.Counts)
	}
	if len(run.ConfigHash) != 64 {
		t.Errorf("the run carries config hash %q", run.ConfigHash)
	}
	var rec uiReconciliation
	if code := srv.call(t, "GET", "/v1/runs/"+created.ID+"/reconciliation", token, nil, &rec); code != http.StatusOK {
		t.Fatalf("reconciliation: %d", code)
	}
	if !rec.Balanced {
		t.Errorf("the run does not reconcile: %s", rec.failing())
		rec.logEvents(t, srv, token, created.ID)
	}

	b := newUIBrowser(t, exe)

	// Sign in with the admin token; the runs list shows the run, all done.
	b.must("sign in", chromedp.Do(b.ctx,
		chromedp.Navigate(srv.url+"/"),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS("#token"), token),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#runs-table tbody tr")),
	))
	total := countyItems + stateItems
	link := fmt.Sprintf(`#runs-table a[href="#/runs/%s"]`, created.ID)
	row := b.rowText(link)
	for _, want := range []string{runName, created.ID, run.Status, fmt.Sprintf("%d / %d", total, total)} {
		if !strings.Contains(row, want) {
			t.Errorf("runs list row %q lacks %q", row, want)
		}
	}
	b.noJunk("runs list")

	// The run: the reconciliation verdict, the counts and the identifiers,
	// each against GET /v1/runs/{id}.
	b.must("open run", chromedp.Do(b.ctx,
		chromedp.Click(chromedp.CSS(link)),
		chromedp.WaitVisible(chromedp.CSS("#counts")),
		chromedp.WaitVisible(chromedp.CSS("#verdict")),
	))
	srv.call(t, "GET", "/v1/runs/"+created.ID, token, nil, &run)
	if verdict := b.text("#verdict"); !strings.Contains(verdict, "Balanced.") {
		failing := b.eval(`[...document.querySelectorAll('tr.row-fail')].map((r) => r.textContent).join(' | ')`)
		t.Errorf("verdict %q, want Balanced; failing rows: %s", verdict, failing)
	}
	shown := b.pairs("#counts dl > div")
	for label, key := range uiCountLabels {
		v, ok := run.Counts[key].(float64)
		if !ok {
			t.Errorf("GET /v1/runs/{id} has no counts.%s (the card %q reads it)", key, label)
			continue
		}
		if got, want := shown[label], groupDigits(int64(v)); got != want {
			t.Errorf("count %q shows %q, API counts.%s = %s", label, got, key, want)
		}
	}
	if got, want := b.text("#run-summary .overall-label"), fmt.Sprintf("%d of %d items done", total, total); !strings.Contains(got, want) {
		t.Errorf("progress %q, want %q", got, want)
	}
	for src, n := range map[string]int{"county": countyItems, "state": stateItems} {
		got := b.rowText(`#source-progress a[href="#/sources/` + src + `"]`)
		if want := fmt.Sprintf("%d / %d", n, n); !strings.Contains(got, want) {
			t.Errorf("progress of %s %q lacks %q", src, got, want)
		}
	}
	facts := b.pairs("#run-summary dl.facts > div")
	for _, f := range []struct{ label, api, want string }{
		{"Status", run.Status, run.Status},
		{"Initiated by", run.InitiatedBy, run.InitiatedBy},
		{"Ledger sequence", fmt.Sprint(run.FirstSeq, run.LastSeq), groupDigits(int64(run.FirstSeq)) + " \u2013 " + groupDigits(int64(run.LastSeq))},
		{"Chain head at start", run.HeadAtStart, prefix(run.HeadAtStart, 16)},
		{"Chain head at end", run.HeadAtEnd, prefix(run.HeadAtEnd, 16)},
		{"Config hash", run.ConfigHash, prefix(run.ConfigHash, 16)},
		{"Code version", run.CodeVersion, run.CodeVersion},
		{"Created", run.CreatedAt, strings.Replace(prefix(run.CreatedAt, 19), "T", " ", 1)},
		{"Finished", run.FinishedAt, strings.Replace(prefix(run.FinishedAt, 19), "T", " ", 1)},
	} {
		got, ok := facts[f.label]
		switch {
		case !ok:
			t.Errorf("identifier %q is not shown", f.label)
		case f.api != "" && !strings.Contains(got, f.want):
			t.Errorf("identifier %q shows %q, API has %q", f.label, got, f.api)
		}
	}
	b.noJunk("run page")
	throttles, _ := run.Counts["status_429"].(float64)
	b.shot("run", "")

	// The run's charts, one per source: what uPlot was given is what
	// GET /v1/runs/{id}/timeline answers, and county's 429s are marked.
	b.must("run charts", chromedp.Do(b.ctx,
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:county"][data-rendered]`)),
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:state"][data-rendered]`)),
	))
	runTL := b.timeline(srv, token)
	pace := func(tl auditd.Timeline, id string) float64 {
		for _, st := range tl.Sources {
			if st.SourceID == id {
				return webtest.Pace(tl, st)
			}
		}
		t.Fatalf("the timeline has no source %s", id)
		return 0
	}
	if refused := refusals(webtest.CheckTimelineChart(b.ctx, t, runTL, "county", pace(runTL, "county"))); refused != int(throttles) || refused == 0 {
		t.Errorf("county's chart marks %d refusals; the run counted %v 429s", refused, throttles)
	}
	webtest.CheckTimelineChart(b.ctx, t, runTL, "state", pace(runTL, "state"))
	b.noJunk("run page with charts")
	b.chartShot("run")

	// Events: every throttle the counts report is listed with its hint.
	b.must("throttle events", chromedp.Do(b.ctx,
		chromedp.Navigate(srv.url+"/#/runs/"+created.ID+"/events?type=throttle"),
		chromedp.WaitVisible(chromedp.CSS("#events-table tbody tr")),
	))
	rows := b.evalList(`[...document.querySelectorAll('#events-table tbody tr:not(:has(td.empty))')].map((r) => r.textContent)`)
	if len(rows) != int(throttles) {
		t.Errorf("events page lists %d throttles, API counts.status_429 = %v", len(rows), throttles)
	}
	for _, r := range rows {
		if !strings.Contains(r, "status 429") || !strings.Contains(r, "Retry-After ") {
			t.Errorf("throttle row %q lacks its status or Retry-After", r)
		}
	}
	b.noJunk("throttle events")
	b.shot("events", "")

	// Sources: the limit county taught auditd, against its ceiling.
	var county struct {
		Learned struct {
			Limit  int    `json:"limit"`
			Window string `json:"window"`
			Cause  string `json:"cause"`
		} `json:"learned"`
	}
	if code := srv.call(t, "GET", "/v1/sources/county", token, nil, &county); code != http.StatusOK {
		t.Fatalf("GET /v1/sources/county: %d", code)
	}
	if county.Learned.Limit == 0 || county.Learned.Limit >= 40 || county.Learned.Cause == "" {
		t.Errorf("county learned %+v; want a limit below the ceiling of 40 and what taught it", county.Learned)
	}
	learned := perSecond(county.Learned.Limit, county.Learned.Window)
	b.must("sources", chromedp.Do(b.ctx,
		chromedp.Click(chromedp.CSS(`#nav a[data-nav="sources"]`)),
		chromedp.WaitVisible(chromedp.CSS(`#sources-table a[href="#/sources/county"]`)),
	))
	cells := b.evalList(`[...document.querySelector('#sources-table a[href="#/sources/county"]').closest('tr').cells].map((c) => c.textContent)`)
	if len(cells) < 4 || !strings.HasPrefix(cells[1], learned) || !strings.Contains(cells[1], "below the ceiling") ||
		cells[2] != "40 per second" || !strings.Contains(cells[3], county.Learned.Cause) {
		t.Errorf("county row %q; want learned %q below the ceiling 40 per second, taught by %q", cells, learned, county.Learned.Cause)
	}
	b.noJunk("sources")
	b.shot("sources", "")
	b.must("source", chromedp.Do(b.ctx,
		chromedp.Click(chromedp.CSS(`#sources-table a[href="#/sources/county"]`)),
		chromedp.WaitVisible(chromedp.CSS("dl.facts")),
	))
	if got := b.pairs("dl.facts > div")["Limit in force"]; !strings.HasPrefix(got, learned) {
		t.Errorf("county page: limit in force %q, want %q", got, learned)
	}
	b.noJunk("source county")

	// county's charts cover the run: its requests against the limit it
	// learned, and that limit's history against the ceiling of 40.
	b.must("source charts", chromedp.Do(b.ctx,
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:county"][data-rendered]`)),
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="limits:county"][data-rendered]`)),
	))
	srcTL := b.timeline(srv, token)
	if refused := refusals(webtest.CheckTimelineChart(b.ctx, t, srcTL, "county", webtest.Pace(srcTL, srcTL.Sources...))); refused != int(throttles) {
		t.Errorf("county's source chart marks %d refusals; the run counted %v 429s", refused, throttles)
	}
	webtest.CheckLimitChart(b.ctx, t, srcTL, "county", 40)
	b.noJunk("source county with charts")
	b.chartShot("source")

	// Ledger: the whole ledger verifies, up to at least the run's end.
	b.must("ledger", chromedp.Do(b.ctx,
		chromedp.Click(chromedp.CSS(`#nav a[data-nav="ledger"]`)),
		chromedp.WaitVisible(chromedp.CSS("#verify-verdict")),
		chromedp.WaitVisible(chromedp.CSS("#public-key-text")),
	))
	if got := b.text("#verify-verdict"); !strings.Contains(got, "Intact.") {
		t.Errorf("ledger verdict %q, want Intact", got)
	}
	var ver struct {
		OK      bool   `json:"ok"`
		HeadSeq uint64 `json:"head_seq"`
	}
	srv.call(t, "GET", "/v1/ledger/verify", token, nil, &ver)
	head, err := strconv.ParseUint(strings.ReplaceAll(b.pairs("#verify dl.facts > div")["Head sequence"], ",", ""), 10, 64)
	if err != nil || head < run.LastSeq || head > ver.HeadSeq || !ver.OK {
		t.Errorf("ledger page head sequence %d (%v); want between the run's last %d and the API's head %d (ok %v)", head, err, run.LastSeq, ver.HeadSeq, ver.OK)
	}
	b.noJunk("ledger")
	b.shot("ledger", "")

	b.consoleErrors()
}

// uiBrowser is a headless Chromium tab that records every console error and
// uncaught exception of the pages it shows.
type uiBrowser struct {
	t   *testing.T
	ctx context.Context

	mu      sync.Mutex
	console []string
}

func newUIBrowser(t *testing.T, exe string) *uiBrowser {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, webtest.AllocatorOptions(exe, t.TempDir())...)
	bctx, cancelBrowser := chromedp.NewContext(actx)
	b := &uiBrowser{t: t, ctx: bctx}
	messages := chromedp.Console(bctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.IsException() {
				b.mu.Lock()
				b.console = append(b.console, m.String())
				b.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		cancelBrowser()
		cancelAlloc()
		cancel()
		<-done
	})
	return b
}

// must ends the test when a step failed, with what the page showed.
func (b *uiBrowser) must(step string, err error) {
	b.t.Helper()
	if err == nil {
		return
	}
	html, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string](`document.getElementById('main').outerHTML`))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.t.Fatalf("%s: %v\nconsole: %q\nmain: %.3000s", step, err, b.console, html)
}

func (b *uiBrowser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	b.must("text of "+sel, err)
	return s
}

func (b *uiBrowser) eval(expr string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](expr))
	b.must(expr, err)
	return s
}

func (b *uiBrowser) evalList(expr string) []string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[[]string](expr))
	b.must(expr, err)
	return s
}

// rowText is the text of the table row holding sel, or "" when there is none.
func (b *uiBrowser) rowText(sel string) string {
	b.t.Helper()
	return b.eval(`(() => { const el = document.querySelector('` + sel + `'); return el ? el.closest('tr').textContent : ''; })()`)
}

// pairs reads <div><dt>term</dt><dd>value</dd></div> groups as a map.
func (b *uiBrowser) pairs(sel string) map[string]string {
	b.t.Helper()
	m, err := chromedp.Run(b.ctx, chromedp.Evaluate[map[string]string](
		`Object.fromEntries([...document.querySelectorAll('`+sel+`')].map((d) => [d.querySelector('dt').textContent, d.querySelector('dd').textContent]))`))
	b.must("pairs "+sel, err)
	return m
}

// noJunk fails when the page shows what a field-name mismatch between the
// UI and the API leaves behind.
func (b *uiBrowser) noJunk(page string) {
	b.t.Helper()
	text := b.text("#main")
	for _, junk := range []string{"NaN", "undefined", "[object Object]", "Invalid Date", "null"} {
		if strings.Contains(text, junk) {
			b.t.Errorf("%s shows %q:\n%s", page, junk, text)
		}
	}
	for _, r := range webtest.RawValues(text) {
		b.t.Errorf("%s shows %s", page, r)
	}
}

// shot saves a PNG of the whole page to path, and to
// $AUDITD_UI_SHOTS/real-name.png when that is set, for a person to look at.
func (b *uiBrowser) shot(name, path string) {
	b.t.Helper()
	var paths []string
	if path != "" {
		paths = append(paths, path)
	}
	if dir := os.Getenv("AUDITD_UI_SHOTS"); dir != "" {
		paths = append(paths, filepath.Join(dir, "real-"+name+".png"))
	}
	if len(paths) == 0 {
		return
	}
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	b.must("screenshot "+name, err)
	for _, p := range paths {
		if err := os.WriteFile(p, png, 0o644); err != nil {
			b.t.Error(err)
		}
	}
}

// timeline fetches, from srv, the timeline the page on show drew its charts
// from (the same path and query).
func (b *uiBrowser) timeline(srv *child, token string) auditd.Timeline {
	b.t.Helper()
	url, err := webtest.TimelineURL(b.ctx)
	if err != nil || url == "" {
		b.must("the page's timeline", fmt.Errorf("none (%v)", err))
	}
	var tl auditd.Timeline
	if code := srv.call(b.t, "GET", url, token, nil, &tl); code != http.StatusOK {
		b.t.Fatalf("GET %s: %d", url, code)
	}
	return tl
}

// chartShot saves a PNG of the whole page in webtest.ShotsDir as
// real-name-charts.png, for a person to look at.
func (b *uiBrowser) chartShot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	b.must("screenshot "+name, err)
	path := filepath.Join(webtest.ShotsDir(b.t), "real-"+name+"-charts.png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Error(err)
	}
	b.t.Logf("screenshot of the %s page: %s", name, path)
}

// consoleErrors fails the test for every console error and uncaught
// exception the pages had.
// expectConsole drops from the console what a step provoked on purpose
// (a refused request's status, which the browser logs), keeping the rest
// for consoleErrors.
func (b *uiBrowser) expectConsole(substr string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.console = slices.DeleteFunc(b.console, func(e string) bool { return strings.Contains(e, substr) })
}

func (b *uiBrowser) consoleErrors() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, e := range b.console {
		b.t.Errorf("browser console: %s", e)
	}
}

// groupDigits writes n as the UI's en-US number format does: 12,345.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		return "-" + s
	}
	return s
}

// perWindow names a window as the UI does in a rate: "1s" is "second",
// "1m0s" "minute", "5m0s" "5 minutes".
// perSecond is a limit per window as the UI shows it on a page whose
// rates are per second: "20 per second", "0.5 per second".
func perSecond(limit int, window string) string {
	d, err := time.ParseDuration(window)
	if err != nil || d <= 0 {
		return window
	}
	r := float64(limit) / d.Seconds()
	if r == math.Trunc(r) {
		return groupDigits(int64(r)) + " per second"
	}
	if r < 1 {
		return strconv.FormatFloat(math.Round(r*100)/100, 'f', -1, 64) + " per second"
	}
	return strconv.FormatFloat(math.Round(r*10)/10, 'f', -1, 64) + " per second"
}

// refusals adds up the 429 refusals a timeline chart marks.
func refusals(buckets []webtest.Bucket) int {
	n := 0
	for _, b := range buckets {
		n += b.Refused
	}
	return n
}

func prefix(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
