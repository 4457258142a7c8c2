package web_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd"
)

// shotsDir is where the browser tests leave screenshots of the pages with
// charts for a person to look at: $AUDITD_UI_SHOTS, or auditd-ui-shots in
// the temporary directory.
func shotsDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("AUDITD_UI_SHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "auditd-ui-shots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// getTimeline asks the fake API, in process, for a timeline the page asked
// for, with the query the page sent.
func getTimeline(t *testing.T, api *fakeAPI, h http.Handler, path string) auditd.Timeline {
	t.Helper()
	api.mu.Lock()
	q, ok := api.timelines[path]
	api.mu.Unlock()
	if !ok {
		t.Fatalf("the page never asked for %s", path)
	}
	req := httptest.NewRequest("GET", path+"?"+q, nil)
	req.Header.Set("Authorization", "Bearer "+auditorToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET %s?%s: %d %s", path, q, rec.Code, rec.Body)
	}
	var tl auditd.Timeline
	if err := json.Unmarshal(rec.Body.Bytes(), &tl); err != nil {
		t.Fatal(err)
	}
	return tl
}

// chartState is what a test reads of a uPlot chart on the page: the data
// it was given, its series' labels, the rate unit of its figure.
type chartState struct {
	Data   [][]*float64 `json:"data"`
	Labels []string     `json:"labels"`
	Unit   float64      `json:"unit"`
}

func readChart(ctx context.Context, name string) (chartState, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[chartState](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		if (!u) throw new Error('no chart %s');
		return { data: u.data.map((a) => Array.from(a)), labels: u.series.map((s) => s.label),
			unit: +u.root.closest('figure').dataset.unitSeconds };
	})()`, name, name)))
}

func sourceOf(tl auditd.Timeline, id string) (auditd.SourceTimeline, bool) {
	for _, s := range tl.Sources {
		if s.SourceID == id {
			return s, true
		}
	}
	return auditd.SourceTimeline{}, false
}

// same compares a chart value with the API's: null on the chart is zero.
func same(got *float64, want float64) bool {
	g := 0.0
	if got != nil {
		g = *got
	}
	return math.Abs(g-want) <= 1e-9*math.Max(1, math.Abs(want))
}

func show(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// checkTimelineChart compares the chart "timeline:<source>" with the
// source's part of the timeline the API returned: one x per bucket start
// and one at the end, requests sent and the limit in force per the chart's
// unit, and the bucket's refusals and waits. It returns how many refusals
// and waits the chart marks.
func checkTimelineChart(t *testing.T, ctx context.Context, tl auditd.Timeline, source string, wantUnit float64) (throttles, waits int) {
	t.Helper()
	st, ok := sourceOf(tl, source)
	if !ok {
		t.Fatalf("the API's timeline has no source %s", source)
	}
	c, err := readChart(ctx, "timeline:"+source)
	if err != nil {
		t.Fatalf("read chart of %s: %v", source, err)
	}
	if c.Unit != wantUnit {
		t.Errorf("%s: rates per %v s, want per %v s", source, c.Unit, wantUnit)
	}
	n := len(st.Buckets)
	if len(c.Data) != 5 || len(c.Data[0]) != n+1 {
		t.Fatalf("%s: chart has %d series; the API has %d buckets (want 5 series of %d points)", source, len(c.Data), n, n+1)
	}
	per := c.Unit / tl.BucketSeconds
	for i, b := range st.Buckets {
		w := 0
		for _, x := range b.Waits {
			w += x.Count
		}
		throttles, waits = throttles+b.Throttles, waits+w
		want := []float64{float64(b.Start.Unix()), float64(b.Dispatches) * per, b.LimitPerSecond * c.Unit, float64(b.Throttles), float64(w)}
		for k, v := range want {
			if !same(c.Data[k][i], v) {
				t.Errorf("%s bucket %d (%s), series %q: chart %s, API %v", source, i, b.Start.Format(time.TimeOnly), c.Labels[k], show(c.Data[k][i]), v)
			}
		}
	}
	if !same(c.Data[0][n], float64(tl.To.Unix())) {
		t.Errorf("%s: last x %s, want the end of the timeline %d", source, show(c.Data[0][n]), tl.To.Unix())
	}
	return throttles, waits
}

// checkLimitChart compares the chart "limits:<source>" with the source's
// learned-limit history: the limit before the first change, a step at each
// change, the ceiling (per second) dashed.
func checkLimitChart(t *testing.T, ctx context.Context, tl auditd.Timeline, source string, ceiling float64) {
	t.Helper()
	st, _ := sourceOf(tl, source)
	c, err := readChart(ctx, "limits:"+source)
	if err != nil {
		t.Fatalf("read chart of %s: %v", source, err)
	}
	rate := func(limit int, w auditd.Duration) float64 { return float64(limit) / w.D().Seconds() * c.Unit }
	ch := st.LimitChanges
	if len(ch) == 0 {
		t.Fatalf("%s: the API's timeline has no limit change; the fixture has three", source)
	}
	x := []float64{float64(tl.From.Unix())}
	limit := []float64{rate(ch[0].OldLimit, ch[0].OldWindow)}
	marks := []float64{0}
	for _, l := range ch {
		x = append(x, float64(l.Time.UnixMilli())/1000)
		limit = append(limit, rate(l.NewLimit, l.NewWindow))
		marks = append(marks, rate(l.NewLimit, l.NewWindow))
	}
	x = append(x, float64(tl.To.Unix()))
	limit = append(limit, limit[len(limit)-1])
	marks = append(marks, 0)
	if len(c.Data) != 4 || len(c.Data[0]) != len(x) {
		t.Fatalf("%s: limit chart has %d series, want 4 of %d points", source, len(c.Data), len(x))
	}
	for i := range x {
		for k, v := range []float64{x[i], limit[i], ceiling * c.Unit, marks[i]} {
			if !same(c.Data[k][i], v) {
				t.Errorf("%s limit chart point %d, series %q: chart %s, API %v", source, i, c.Labels[k], show(c.Data[k][i]), v)
			}
		}
	}
}

// shaded reports whether the chart's canvas is tinted red near the top of
// the plot at time ts (where a breaker-open span is drawn).
func shaded(ctx context.Context, name string, ts time.Time) (bool, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		const x = Math.round(u.valToPos(%d, 'x', true)), y = Math.round(u.bbox.top + u.bbox.height * 0.04);
		const [r, g] = u.ctx.getImageData(x, y, 1, 1).data;
		return r > g + 8;
	})()`, name, ts.Unix())))
}
