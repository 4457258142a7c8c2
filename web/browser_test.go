package web_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/web"
	"github.com/auditd/auditd/web/webtest"
)

const (
	auditorToken = "auditor-secret-token"
	runID        = "01JDQ6ZC7W3N8R5T2M4K9X1A0B"
)

// fakeAPI answers the /v1 routes the UI calls with the fixtures in
// testdata/fakeapi, which follow api/openapi.yaml. The run it serves is
// running on its first fetch and finished (partial) from the second on, so
// the detail page's auto-refresh has something to show.
type fakeAPI struct {
	t *testing.T

	mu         sync.Mutex
	runFetches int
	downloads  map[string]string // path?query -> Authorization header

	tl *reports.Timelines // adds up fixtureLedger, as the real route does
}

func newFakeAPI(t *testing.T) (*fakeAPI, http.Handler) {
	f := &fakeAPI{t: t, downloads: map[string]string{}, tl: fixtureTimelines()}
	mux := http.NewServeMux()
	fixture := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) { f.file(w, name) }
	}
	mux.HandleFunc("GET /v1/runs", func(w http.ResponseWriter, r *http.Request) {
		switch q := r.URL.Query(); {
		case q.Get("cursor") != "":
			f.file(w, "runs-page2.json")
		case q.Get("source") != "":
			f.file(w, "runs-by-source.json") // the run, as it ended
		default:
			fixture("runs.json")(w, r)
		}
	})
	mux.HandleFunc("GET /v1/runs/{id}/timeline", f.runTimeline)
	mux.HandleFunc("GET /v1/sources/{id}/timeline", f.sourceTimeline)
	mux.HandleFunc("GET /v1/runs/{id}", f.run)
	mux.HandleFunc("GET /v1/runs/{id}/reconciliation", func(w http.ResponseWriter, r *http.Request) {
		if format := r.URL.Query().Get("format"); format != "" {
			f.download(w, r, "text/csv; charset=utf-8", "reconciliation-"+r.PathValue("id")+"."+format)
			return
		}
		fixture("reconciliation.json")(w, r)
	})
	mux.HandleFunc("GET /v1/runs/{id}/evidence.xlsx", func(w http.ResponseWriter, r *http.Request) {
		f.download(w, r, "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "evidence-"+r.PathValue("id")+".xlsx")
	})
	mux.HandleFunc("GET /v1/runs/{id}/evidence-pack.zip", func(w http.ResponseWriter, r *http.Request) {
		f.download(w, r, "application/zip", "evidence-pack-"+r.PathValue("id")+".zip")
	})
	mux.HandleFunc("GET /v1/evidence-pack.zip", func(w http.ResponseWriter, r *http.Request) {
		f.download(w, r, "application/zip", "evidence-pack-"+r.URL.Query().Get("award")+".zip")
	})
	mux.HandleFunc("GET /v1/runs/{id}/events", fixture("events.json"))
	mux.HandleFunc("GET /v1/runs/{id}/items", fixture("items.json"))
	mux.HandleFunc("GET /v1/evidence.xlsx", func(w http.ResponseWriter, r *http.Request) {
		f.download(w, r, "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet", "evidence-"+r.URL.Query().Get("award")+".xlsx")
	})
	mux.HandleFunc("GET /v1/sources", fixture("sources.json"))
	mux.HandleFunc("GET /v1/fleet/sources", fixture("fleet-sources.json"))
	mux.HandleFunc("GET /v1/sources/{id}", f.source)
	mux.HandleFunc("GET /v1/ledger/verify", fixture("verify.json"))
	mux.HandleFunc("GET /v1/ledger/checkpoint", fixture("checkpoint.txt"))
	mux.HandleFunc("GET /v1/ledger/public-key", fixture("public-key.txt"))

	return f, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+auditorToken {
			problem(w, http.StatusUnauthorized, "Unauthorized", "The bearer token is missing, unknown or revoked.", "req-401-abc")
			return
		}
		if _, pattern := mux.Handler(r); pattern == "" {
			problem(w, http.StatusNotFound, "Not Found", "No route "+r.URL.Path, "req-404")
			return
		}
		mux.ServeHTTP(w, r)
	})
}

func problem(w http.ResponseWriter, status int, title, detail, reqID string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": title, "status": status, "detail": detail,
		"code": map[int]string{401: "unauthorized", 404: "not_found"}[status], "request_id": reqID,
	})
}

func (f *fakeAPI) file(w http.ResponseWriter, name string) {
	b, err := os.ReadFile(filepath.Join("testdata", "fakeapi", name))
	if err != nil {
		f.t.Errorf("fixture: %v", err)
		http.Error(w, err.Error(), 500)
		return
	}
	if strings.HasSuffix(name, ".json") {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	}
	w.Write(b)
}

func (f *fakeAPI) run(w http.ResponseWriter, r *http.Request) {
	b, err := os.ReadFile(filepath.Join("testdata", "fakeapi", "runs.json"))
	if err != nil {
		f.t.Fatal(err)
	}
	var list struct{ Runs []map[string]any }
	if err := json.Unmarshal(b, &list); err != nil {
		f.t.Fatal(err)
	}
	var run map[string]any
	for _, x := range list.Runs {
		if x["id"] == r.PathValue("id") {
			run = x
		}
	}
	if run == nil {
		problem(w, http.StatusNotFound, "Not Found", "No run "+r.PathValue("id"), "req-404")
		return
	}
	f.mu.Lock()
	f.runFetches++
	n := f.runFetches
	f.mu.Unlock()
	if n > 1 && run["status"] == "running" {
		run["status"] = "partial"
		run["finished_at"] = "2026-11-29T19:10:02.004Z"
		run["last_seq"] = 11251
		run["head_at_end"] = "c0ffee"
		delete(run, "estimated_finish")
		c := run["counts"].(map[string]any)
		c["succeeded"], c["failed"], c["pending"] = 230.0, 4.0, 0.0
		c["by_source"] = map[string]any{"travis-gis": map[string]any{"items": 160, "done": 160}, "hays-gis": map[string]any{"items": 80, "done": 80}}
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(run)
}

func (f *fakeAPI) source(w http.ResponseWriter, r *http.Request) {
	b, err := os.ReadFile(filepath.Join("testdata", "fakeapi", "sources.json"))
	if err != nil {
		f.t.Fatal(err)
	}
	var list struct{ Sources []json.RawMessage }
	if err := json.Unmarshal(b, &list); err != nil {
		f.t.Fatal(err)
	}
	for _, raw := range list.Sources {
		var src struct{ ID string }
		if err := json.Unmarshal(raw, &src); err == nil && src.ID == r.PathValue("id") {
			w.Header().Set("Content-Type", "application/json")
			w.Write(raw)
			return
		}
	}
	problem(w, http.StatusNotFound, "Not Found", "No source "+r.PathValue("id"), "req-404")
}

// runTimeline answers GET /v1/runs/{id}/timeline for the run of runs.json:
// its 30 minutes, without ?bucket= in buckets of 10 s, as the API would.
func (f *fakeAPI) runTimeline(w http.ResponseWriter, r *http.Request) {
	if r.PathValue("id") != runID {
		problem(w, http.StatusNotFound, "Not Found", "No run "+r.PathValue("id"), "req-404")
		return
	}
	q := auditd.TimelineQuery{Bucket: autoBucket(30 * time.Minute)}
	if src := r.URL.Query().Get("source"); src != "" {
		q.Sources = strings.Split(src, ",")
	}
	if b := r.URL.Query().Get("bucket"); b != "" {
		q.Bucket, _ = time.ParseDuration(b)
	}
	f.timelineJSON(w, func() (*auditd.Timeline, error) { return f.tl.RunTimeline(r.Context(), runID, q) })
}

// sourceTimeline answers GET /v1/sources/{id}/timeline for the sources of
// sources.json over ?from= and ?to=.
func (f *fakeAPI) sourceTimeline(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if id != "hays-gis" && id != "travis-gis" {
		problem(w, http.StatusNotFound, "Not Found", "No source "+id, "req-404")
		return
	}
	from, err1 := time.Parse(time.RFC3339Nano, r.URL.Query().Get("from"))
	to, err2 := time.Parse(time.RFC3339Nano, r.URL.Query().Get("to"))
	if err1 != nil || err2 != nil {
		f.t.Errorf("%s: the UI sends from and to as RFC 3339: %v %v", r.URL, err1, err2)
		problem(w, http.StatusBadRequest, "Bad Request", "from and to", "req-400")
		return
	}
	q := auditd.TimelineQuery{Bucket: autoBucket(to.Sub(from)), From: from, To: to}
	f.timelineJSON(w, func() (*auditd.Timeline, error) { return f.tl.SourceTimeline(r.Context(), id, q) })
}

func (f *fakeAPI) timelineJSON(w http.ResponseWriter, get func() (*auditd.Timeline, error)) {
	tl, err := get()
	if errors.Is(err, context.Canceled) {
		return // the page went elsewhere
	}
	if err != nil {
		f.t.Errorf("timeline: %v", err)
		problem(w, http.StatusBadRequest, "Bad Request", err.Error(), "req-400")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(tl)
}

func (f *fakeAPI) download(w http.ResponseWriter, r *http.Request, ctype, name string) {
	f.mu.Lock()
	f.downloads[r.URL.RequestURI()] = r.Header.Get("Authorization")
	f.mu.Unlock()
	w.Header().Set("Content-Type", ctype)
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", name))
	fmt.Fprintf(w, "fake %s\n", name)
}

func TestBrowser(t *testing.T) {
	exe := webtest.Chromium(t)

	mux := http.NewServeMux()
	api, apiHandler := newFakeAPI(t)
	mux.Handle("/v1/", apiHandler)
	mux.Handle("/", web.Handler())
	srv := httptest.NewServer(mux)
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, webtest.AllocatorOptions(exe, t.TempDir())...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()

	// Anything the page logs as an error (an exception, a CSP refusal) fails
	// the test; the 401 of the wrong token is expected and is a network entry.
	console := chromedp.Console(bctx)
	var consoleErrs []string
	var consoleMu sync.Mutex
	go func() {
		for m, err := range console {
			if err != nil {
				return
			}
			if (m.Type == chromedp.ConsoleError || m.IsException()) && !strings.Contains(m.Text, "401") {
				consoleMu.Lock()
				consoleErrs = append(consoleErrs, m.String())
				consoleMu.Unlock()
			}
		}
	}()

	dlDir := t.TempDir()
	if _, err := chromedp.CallBrowser(bctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: dlDir,
	}); err != nil {
		t.Fatalf("set download behaviour: %v", err)
	}

	must := func(step string, err error) {
		t.Helper()
		if err != nil {
			consoleMu.Lock()
			defer consoleMu.Unlock()
			html, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById('main').outerHTML`))
			t.Fatalf("%s: %v\nconsole: %q\nmain: %.2000s", step, err, consoleErrs, html)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS(sel)))
		must("text of "+sel, err)
		return s
	}
	contains := func(sel string, want ...string) {
		t.Helper()
		got := text(sel)
		for _, w := range want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %q lacks %q", sel, got, w)
			}
		}
	}

	// chartShot saves a PNG of the page with its charts in shotsDir.
	shots := webtest.ShotsDir(t)
	chartShot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		must("screenshot "+name, err)
		path := filepath.Join(shots, name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Error(err)
		}
		t.Logf("screenshot of the %s page: %s", name, path)
	}

	// shot saves a PNG of the page to path, and to $AUDITD_UI_SHOTS/name.png
	// when that is set, for a person to look at.
	shot := func(name, path string) {
		t.Helper()
		png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
		must("screenshot "+name, err)
		if dir := os.Getenv("AUDITD_UI_SHOTS"); dir != "" && path == "" {
			path = filepath.Join(dir, name+".png")
		}
		if path != "" {
			if err := os.WriteFile(path, png, 0o644); err != nil {
				t.Log(err)
			}
		}
	}

	// Sign-in: a wrong token is refused with the API's words and request id.
	must("open", chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/"),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
		chromedp.SendKeys(chromedp.CSS("#token"), "wrong-token"),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#signin-status .problem")),
	))
	contains("#signin-status", "Token refused", "HTTP 401", "req-401-abc")
	navShown, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`getComputedStyle(document.getElementById('nav')).display !== 'none' || getComputedStyle(document.getElementById('signout')).display !== 'none'`))
	must("nav on sign-in", err)
	if navShown {
		t.Error("navigation or sign-out shows before sign-in")
	}
	shot("signin", "")

	must("sign in", chromedp.Do(bctx,
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#token').value = ''`),
		chromedp.SendKeys(chromedp.CSS("#token"), auditorToken),
		chromedp.Click(chromedp.CSS("#signin-submit")),
		chromedp.WaitVisible(chromedp.CSS("#runs-table tbody tr")),
	))
	contains("#runs-table", "Parcels refresh, Travis and Hays counties", "running", "158 / 240", "EMW-2024-FG-05123", "partial")
	shot("runs", "")
	noRawValues(t, bctx, "runs")

	// The next-page cursor.
	must("next page", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#runs-next")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#runs-table') && document.querySelector('#runs-table').textContent.includes('Geocoder backfill')`, chromedp.WithPollingTimeout(5*time.Second)),
	))

	// Award evidence for a period, with the token.
	must("award evidence", chromedp.Do(bctx,
		chromedp.SendKeys(chromedp.CSS("#award-fain"), "EMW-2024-FG-05123"),
		chromedp.Click(chromedp.CSS("#award-xlsx")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#award-status').textContent.includes('Saved evidence-EMW-2024-FG-05123.xlsx')`, chromedp.WithPollingTimeout(5*time.Second)),
	))
	must("award evidence pack", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#award-pack")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#award-status').textContent.includes('Saved evidence-pack-EMW-2024-FG-05123.zip')`, chromedp.WithPollingTimeout(5*time.Second)),
	))

	// Run detail: counts, progress, the reconciliation with R4 failing.
	// The run's id pasted in lower case is the run, shown in capitals.
	must("open run", chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/#/runs/"+strings.ToLower(runID)),
		chromedp.WaitVisible(chromedp.CSS("#counts")),
		chromedp.WaitVisible(chromedp.CSS(`#checks tr[data-check="R10"]`)),
	))
	if hash, err := chromedp.Run(bctx, chromedp.Evaluate[string](`location.hash`)); err != nil || hash != "#/runs/"+runID {
		t.Errorf("a run id in lower case left the page at %q (%v), want #/runs/%s", hash, err, runID)
	}
	contains("#run-summary", "158 of 240 items done", "Estimated finish", "travis-gis", "120 / 160", "hays-gis")
	contains("#verdict", "Not balanced", "R4")
	contains(`#checks tr.row-fail[data-check="R4"]`, "FAIL", "\u22121", "10877")
	contains(`#checks tr[data-check="R10"]`, "n/a")
	contains("#cached", "hays/parcels/19", "1d 2h", "01JQ8Z6X0RUN00000000000009", "breaker open")
	fails, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#checks tr.row-fail').length`))
	must("count failing rows", err)
	if fails != 1 {
		t.Errorf("failing rows highlighted = %d, want 1 (R4)", fails)
	}

	// The charts, one per source: what uPlot was given is the API's timeline.
	must("run charts", chromedp.Do(bctx,
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:hays-gis"][data-rendered]`)),
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:travis-gis"][data-rendered]`)),
	))
	runTL := getTimeline(t, bctx, apiHandler)
	// Each chart in buckets sized to its source's pace: hays-gis's window
	// is a second, so the API's 10 s buckets; travis-gis's is a minute.
	var refused, failed, cached, waits int
	for _, b := range webtest.CheckTimelineChart(bctx, t, runTL, "hays-gis", 10) {
		refused, failed, cached, waits = refused+b.Refused, failed+b.Failed, cached+b.Cached, waits+b.Waits
	}
	if refused != 3 || failed != 5 || cached != 1 || waits != 8 {
		t.Errorf("hays-gis chart marks %d refusals, %d 5xx, %d cache answers and %d waits; want the fixture's 3, 5, 1 and 8", refused, failed, cached, waits)
	}
	// travis-gis keeps its limit of 30, then 20, a minute: no bucket of the
	// chart stands above what it was allowed.
	travis := webtest.CheckTimelineChart(bctx, t, runTL, "travis-gis", 60)
	for i, b := range travis {
		if b.Allowed == 0 || float64(b.Sent) > b.Allowed {
			t.Errorf("travis-gis bucket %d (%s): %d sent against %v allowed; a compliant source must not look over its limit", i, b.Start.Format(time.TimeOnly), b.Sent, b.Allowed)
		}
	}
	for _, c := range []struct {
		at   string
		want bool
	}{{"18:52:20", true}, {"18:45:00", false}} {
		ts, _ := time.Parse(time.DateTime, "2026-11-29 "+c.at)
		got, err := webtest.Shaded(bctx, "timeline:hays-gis", ts)
		must("sample the chart at "+c.at, err)
		if got != c.want {
			t.Errorf("hays-gis chart shaded at %s: %v, want %v (breaker open 18:52:04 to 18:52:34)", c.at, got, c.want)
		}
	}
	contains("#timeline", "hays-gis", "Requests sent", "Allowed by the limit in force", "3 refused (429)", "5 5xx answers", "1 served from cache", "breaker open once", "requests sent in each 1 minute", "requests sent in each 10 seconds")
	checkDrawn := func(width int64, charts ...string) {
		t.Helper()
		// Each chart takes its plot's new width, then two frames pass, by
		// when uPlot has drawn at that width.
		must(fmt.Sprintf("resize to %d", width), chromedp.Do(bctx, chromedp.EmulateViewport(width, 900),
			chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.innerWidth === %d && Object.values(window.auditdCharts).every((u) => Math.abs(u.width - u.root.parentElement.clientWidth) < 1)`, width),
				chromedp.WithPollingTimeout(10*time.Second)),
			chromedp.Evaluate[chromedp.Void](`new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(() => done())))`, chromedp.EvalAwaitPromise)))
		for _, name := range charts {
			checkChartDrawn(t, bctx, name, width)
		}
	}

	shot("run", "")
	checkDrawn(1024, "timeline:hays-gis", "timeline:travis-gis")
	chartShot("run-1024")
	checkDrawn(1400, "timeline:hays-gis", "timeline:travis-gis")
	chartShot("run-1400")
	checkDrawn(1280, "timeline:hays-gis", "timeline:travis-gis")
	noRawValues(t, bctx, "run")

	// The auto-refresh sees the run finish.
	must("auto-refresh", chromedp.Do(bctx, chromedp.Poll[chromedp.Void](
		`document.querySelector('#run-summary') && document.querySelector('#run-summary').textContent.includes('240 of 240 items done')`,
		chromedp.WithPollingTimeout(8*time.Second))))

	// Downloads carry the bearer token and are saved under the server's name.
	must("download evidence", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#dl-evidence")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#download-status').textContent.includes('Saved evidence-')`, chromedp.WithPollingTimeout(5*time.Second)),
	))
	must("download evidence pack", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#dl-pack")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#download-status').textContent.includes('Saved evidence-pack-')`, chromedp.WithPollingTimeout(5*time.Second)),
	))
	must("download reconciliation csv", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#dl-recon-csv")),
		chromedp.Poll[chromedp.Void](`document.querySelector('#download-status').textContent.includes('Saved reconciliation-')`, chromedp.WithPollingTimeout(5*time.Second)),
	))
	want := filepath.Join(dlDir, "evidence-"+runID+".xlsx")
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(want); err == nil {
			break
		}
		if time.Now().After(deadline) {
			entries, _ := os.ReadDir(dlDir)
			t.Errorf("download not saved as %s; dir has %v", want, entries)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}

	// Items of the run.
	must("items", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#items-link")),
		chromedp.WaitVisible(chromedp.CSS("#items-table tbody tr")),
	))
	contains("#items-table", "travis/parcels/1", "5,120", "failed", "503 Service Unavailable", "pending",
		"copy 1d 2h old, fetched by run 01JQ8Z6X0RUN00000000000009")
	shot("items", "")
	noRawValues(t, bctx, "items")
	must("back to run", chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/#/runs/"+runID),
		chromedp.WaitVisible(chromedp.CSS("#events-link")),
	))

	// Events of the run, filtered by type.
	must("events", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#events-link")),
		chromedp.WaitVisible(chromedp.CSS("#events-table tbody tr")),
	))
	contains("#events-table", "throttle", "Retry-After 12", "hays/parcels/18", "name Parcels refresh", "wait 12s")
	fits, err := chromedp.Run(bctx, chromedp.Evaluate[[]int](`[document.documentElement.scrollWidth, window.innerWidth]`))
	must("events width", err)
	if len(fits) != 2 || fits[1] != 1280 || fits[0] > fits[1] {
		t.Errorf("events page is %v px wide in a window of %v; it must fit 1280", fits[0], fits[1])
	}
	clipped, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#events-table td')].filter((td) => td.scrollWidth > td.clientWidth + 1).map((td) => td.textContent)`))
	must("events cells", err)
	if len(clipped) > 0 {
		t.Errorf("events cells wider than their column: %q", clipped)
	}
	raw, err := chromedp.Run(bctx, chromedp.Evaluate[string](`[...document.querySelectorAll('#events-table td.details')].map((d) => d.textContent).find((s) => s.includes('{')) || ''`))
	must("events details", err)
	if raw != "" {
		t.Errorf("an event's details show raw JSON: %q", raw)
	}
	labels, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#events-table td.details dt')].map((d) => d.textContent)`))
	must("events labels", err)
	for _, want := range []string{"status", "Retry-After", "wait", "request", "name"} {
		if !slices.Contains(labels, want) {
			t.Errorf("details label %q missing from %q", want, labels)
		}
	}
	contains("#events-table", "award fain EMW-2024-FG-05123", "award year 2026", "limit 20 per minute", "ceiling 30 per minute", "taught at 2026-11-29 18:39:58.123Z", "advertised limit unknown", "age 21s", "fetched at 2026-11-29 18:51:48.993Z")
	if got := text("#events-table"); strings.Contains(got, "award award") {
		t.Errorf("events repeat a nested label: %q", got)
	}
	shot("events", "")
	noRawValues(t, bctx, "events")

	// Sources: learned limit against the ceiling, what taught it, breaker.
	must("sources", chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/#/sources"),
		chromedp.WaitVisible(chromedp.CSS("#sources-table tbody tr")),
	))
	// One unit for the page: hays-gis goes faster than one a second, so
	// travis-gis's 20 and 30 a minute read per second too.
	contains("#sources-table", "hays-gis", "5 per second", "10 per second", "429", "open", "travis-gis", "0.33 per second", "0.5 per second", "header")
	if got := text("#sources-table"); strings.Contains(got, "per minute") || strings.Contains(got, "strict") {
		t.Errorf("sources table mixes units or shows the undocumented tier: %q", got)
	}
	// A learned limit under the ceiling is how learning works: a note, not a warning.
	note, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`(() => { const el = document.querySelector('#sources-table .learned-below');
		const cs = getComputedStyle(el); return [el.textContent, cs.color, cs.fontWeight,
		getComputedStyle(document.querySelector('.muted')).color]; })()`))
	must("below the ceiling", err)
	if len(note) != 4 || note[0] != "below the ceiling" || note[1] != note[3] || note[2] != "400" {
		t.Errorf("below the ceiling: text, colour, weight, muted colour = %q; want the muted colour at normal weight", note)
	}
	// The fleet's view: sources.json says this node is node-a of a fleet.
	must("fleet view", chromedp.Do(bctx, chromedp.WaitVisible(chromedp.CSS(`#fleet-view tr[data-node="node-c"]`))))
	nodes, err := chromedp.Run(bctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll('#fleet-texas-gateway tbody tr')].map((tr) => tr.dataset.node + ' ' + tr.textContent)`))
	must("fleet rows", err)
	if len(nodes) != 3 || !strings.HasPrefix(nodes[0], "node-a node-a (this node)learner50%250241542.51msnot pausednow") ||
		!strings.Contains(nodes[1], "cut off30%") || !strings.Contains(nodes[1], "no report for") || !strings.Contains(nodes[1], "1.5s") ||
		!strings.Contains(nodes[2], "20%") || !strings.Contains(nodes[2], "13ms") || !strings.Contains(nodes[2], "over the last 43s") {
		t.Errorf("fleet rows of texas-gateway: %q", nodes)
	}
	contains("#fleet-view", "texas-gateway (gateway group) · 10 per second shared, 5 per second learned by the fleet · learner node-a", "travis-gis · 0.5 per second shared", "This node (node-a) reaches etcd")
	if got := text("#fleet-view"); strings.Contains(got, "This node (node-a) is cut off") {
		t.Errorf("another node's cut-off is shown as this node's: %q", got)
	}
	shot("sources", "")
	noRawValues(t, bctx, "sources")
	must("source", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`#sources-table a[href="#/sources/hays-gis"]`)),
		chromedp.WaitVisible(chromedp.CSS("dl.facts")),
	))
	contains("main", "In force now", "5 per second", "below the ceiling", "X-Api-Key (values redacted)", "opens after 5 failures in a row, cooldown 30s")
	// Durations in the UI's one style: "2m", not "2m0s".
	capText, err := chromedp.Run(bctx, chromedp.Evaluate[string](`[...document.querySelectorAll('dl.facts > div')].find((d) => d.querySelector('dt').textContent === 'Retry-After cap').querySelector('dd').textContent`))
	must("retry-after cap", err)
	if capText != "2m" {
		t.Errorf("Retry-After cap shows %q, want 2m", capText)
	}

	// The source's charts cover its latest run: requests against the limit
	// in force, and the learned-limit history against the ceiling.
	must("source charts", chromedp.Do(bctx,
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="timeline:hays-gis"][data-rendered]`)),
		chromedp.WaitVisible(chromedp.CSS(`figure[data-chart="limits:hays-gis"][data-rendered]`)),
	))
	srcTL := getTimeline(t, bctx, apiHandler)
	if srcTL.From.After(fixtureStart) || srcTL.To.Before(fixtureStart.Add(30*time.Minute)) {
		t.Errorf("source timeline %s to %s; want the latest run's (from 18:40:05 to 19:10:02)", srcTL.From, srcTL.To)
	}
	webtest.CheckTimelineChart(bctx, t, srcTL, "hays-gis", 10)
	webtest.CheckLimitChart(bctx, t, srcTL, "hays-gis", 10)
	contains("#limit-changes", "2 per second", "4 per second", "8 per second", "5 per second", "probe_up", "429")
	if rows, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll('#limit-changes tbody tr').length`)); err != nil || rows != 3 {
		t.Errorf("limit changes table has %d rows (%v), want the 3 changes", rows, err)
	}
	contains("#timeline-range", "Latest run", "buckets of 10 seconds")
	checkDrawn(1024, "timeline:hays-gis", "limits:hays-gis")
	chartShot("source-1024")
	checkDrawn(1400, "timeline:hays-gis", "limits:hays-gis")
	chartShot("source-1400")
	checkDrawn(1280, "timeline:hays-gis", "limits:hays-gis")
	noRawValues(t, bctx, "source")
	must("source last hour", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`#range-picker a[data-range="1h"]`)),
		chromedp.Poll[chromedp.Void](`document.querySelector('#timeline') && document.querySelector('#timeline').textContent.includes('Nothing was recorded')`, chromedp.WithPollingTimeout(5*time.Second)),
	))

	// Ledger: verification, checkpoint and key.
	must("ledger", chromedp.Do(bctx,
		chromedp.Navigate(srv.URL+"/#/ledger"),
		chromedp.WaitVisible(chromedp.CSS("#verify-verdict")),
		chromedp.WaitVisible(chromedp.CSS("#public-key-text")),
	))
	contains("#verify-verdict", "Intact", "11,251")
	shot("ledger", "")
	noRawValues(t, bctx, "ledger")
	key, err := chromedp.Run(bctx, chromedp.Value(chromedp.CSS("#public-key-text")))
	must("public key", err)
	if !strings.HasPrefix(key, "auditd.example+") {
		t.Errorf("public key = %q", key)
	}

	// Sign out forgets the token.
	must("sign out", chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS("#signout")),
		chromedp.WaitVisible(chromedp.CSS("#signin")),
	))
	left, err := chromedp.Run(bctx, chromedp.Evaluate[string](`sessionStorage.getItem('auditd.token') || ''`))
	must("session storage", err)
	if left != "" {
		t.Errorf("token still stored after sign-out")
	}

	// A token revoked mid-session: the first 401 returns to sign-in and says why.
	must("revoked token", chromedp.Do(bctx,
		chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem('auditd.token', 'revoked'); location.hash = '#/sources'`),
		chromedp.Poll[chromedp.Void](`document.querySelector('#signin-status') && document.querySelector('#signin-status').textContent.includes('session ended')`, chromedp.WithPollingTimeout(5*time.Second)),
	))

	api.mu.Lock()
	for _, uri := range []string{"/v1/runs/" + runID + "/evidence.xlsx", "/v1/runs/" + runID + "/evidence-pack.zip", "/v1/runs/" + runID + "/reconciliation?format=csv",
		"/v1/evidence.xlsx?award=EMW-2024-FG-05123", "/v1/evidence-pack.zip?award=EMW-2024-FG-05123"} {
		if got, ok := api.downloads[uri]; !ok || got != "Bearer "+auditorToken {
			t.Errorf("download %s: requested %v, Authorization %q", uri, ok, got)
		}
	}
	api.mu.Unlock()

	consoleMu.Lock()
	defer consoleMu.Unlock()
	for _, e := range consoleErrs {
		t.Errorf("browser console: %s", e)
	}
}
