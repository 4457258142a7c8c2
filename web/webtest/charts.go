package webtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd"
)

// ShotsDir is where the browser tests leave screenshots of the pages with
// charts for a person to look at: $AUDITD_UI_SHOTS, or auditd-ui-shots in
// the temporary directory.
func ShotsDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("AUDITD_UI_SHOTS")
	if dir == "" {
		dir = filepath.Join(os.TempDir(), "auditd-ui-shots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	return dir
}

// TimelineURL is the timeline the page on show fetched for its charts
// (web/static/js: the #timeline section's data-src), path and query.
func TimelineURL(ctx context.Context) (string, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('#timeline').dataset.src || ''`))
}

// Chart is what a test reads of a uPlot chart on the page: the data it was
// given, its series' labels, the rate unit of its figure in seconds.
type Chart struct {
	Data   [][]*float64 `json:"data"`
	Labels []string     `json:"labels"`
	Unit   float64      `json:"unit"`
}

// ReadChart reads the chart the page keeps as window.auditdCharts[name].
func ReadChart(ctx context.Context, name string) (Chart, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[Chart](fmt.Sprintf(`(() => {
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

// unix is t as the charts' x values: seconds, to the millisecond.
func unix(t time.Time) float64 { return float64(t.UnixMilli()) / 1000 }

func show(v *float64) string {
	if v == nil {
		return "null"
	}
	return fmt.Sprint(*v)
}

// CheckTimelineChart compares the chart "timeline:<source>" with the
// source's part of the timeline the API returned: one x per bucket start
// and one at the end, requests sent and the limit in force per the chart's
// unit, and the bucket's refusals and waits. It returns how many refusals
// and waits the chart marks.
func CheckTimelineChart(ctx context.Context, t testing.TB, tl auditd.Timeline, source string, wantUnit float64) (throttles, waits int) {
	t.Helper()
	st, ok := sourceOf(tl, source)
	if !ok {
		t.Fatalf("the API's timeline has no source %s", source)
	}
	c, err := ReadChart(ctx, "timeline:"+source)
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
		want := []float64{unix(b.Start), float64(b.Dispatches) * per, b.LimitPerSecond * c.Unit, float64(b.Throttles), float64(w)}
		for k, v := range want {
			if !same(c.Data[k][i], v) {
				t.Errorf("%s bucket %d (%s), series %q: chart %s, API %v", source, i, b.Start.Format(time.TimeOnly), c.Labels[k], show(c.Data[k][i]), v)
			}
		}
	}
	if !same(c.Data[0][n], unix(tl.To)) {
		t.Errorf("%s: last x %s, want the end of the timeline %v", source, show(c.Data[0][n]), unix(tl.To))
	}
	return throttles, waits
}

// CheckLimitChart compares the chart "limits:<source>" with the source's
// learned-limit history: the limit before the first change, a step at each
// change, the ceiling (per second) dashed.
func CheckLimitChart(ctx context.Context, t testing.TB, tl auditd.Timeline, source string, ceiling float64) {
	t.Helper()
	st, _ := sourceOf(tl, source)
	c, err := ReadChart(ctx, "limits:"+source)
	if err != nil {
		t.Fatalf("read chart of %s: %v", source, err)
	}
	rate := func(limit int, w auditd.Duration) float64 { return float64(limit) / w.D().Seconds() * c.Unit }
	ch := st.LimitChanges
	if len(ch) == 0 {
		t.Fatalf("%s: the API's timeline has no limit change; the fixture has three", source)
	}
	x := []float64{unix(tl.From)}
	limit := []float64{rate(ch[0].OldLimit, ch[0].OldWindow)}
	marks := []float64{0}
	for _, l := range ch {
		x = append(x, unix(l.Time))
		limit = append(limit, rate(l.NewLimit, l.NewWindow))
		marks = append(marks, rate(l.NewLimit, l.NewWindow))
	}
	x = append(x, unix(tl.To))
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

// Shaded reports whether the chart's canvas is tinted red near the top of
// the plot at time ts (where a breaker-open span is drawn).
func Shaded(ctx context.Context, name string, ts time.Time) (bool, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		const x = Math.round(u.valToPos(%d, 'x', true)), y = Math.round(u.bbox.top + u.bbox.height * 0.04);
		const [r, g] = u.ctx.getImageData(x, y, 1, 1).data;
		return r > g + 8;
	})()`, name, ts.Unix())))
}
