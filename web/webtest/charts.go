package webtest

import (
	"context"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd"
)

// ShotsDir is where the browser tests leave screenshots of the pages for a
// person to look at: $AUDITD_UI_SHOTS (kept), or the test's own temporary
// directory (removed with it).
func ShotsDir(tb testing.TB) string {
	tb.Helper()
	dir := os.Getenv("AUDITD_UI_SHOTS")
	if dir == "" {
		dir = tb.TempDir()
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
// given, its series' labels in the order uPlot draws them, and its
// figure's bucket width and rate unit, in seconds.
type Chart struct {
	Data   [][]*float64 `json:"data"`
	Labels []string     `json:"labels"`
	Bucket float64      `json:"bucket"`
	Unit   float64      `json:"unit"`
}

// ReadChart reads the chart the page keeps as window.auditdCharts[name].
func ReadChart(ctx context.Context, name string) (Chart, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[Chart](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		if (!u) throw new Error('no chart %s');
		const d = u.root.closest('figure').dataset;
		return { data: u.data.map((a) => Array.from(a)), labels: u.series.map((s) => s.label),
			bucket: +(d.bucketSeconds || 0), unit: +(d.unitSeconds || 0) };
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

// TimelineSeries are the series of a timeline chart, in the order uPlot
// draws them: the markers last, the 429 refusals on top of all.
var TimelineSeries = []string{"Time (UTC)", "Requests sent", "Allowed", "Waits", "Served from cache", "5xx answers", "429 refusals"}

// Bucket is one bucket of a timeline chart as the API's timeline says it
// should be drawn.
type Bucket struct {
	Start                          time.Time
	Sent                           int
	Allowed                        float64 // what the limit in force allowed in the bucket; 0 when unknown
	Waits, Cached, Failed, Refused int
}

// Buckets merges a source's API buckets k at a time into buckets width
// seconds wide, as the chart should: counts added up, and the allowance
// the most generous limit in force of the merged buckets, its limit for
// every window the bucket touches.
func Buckets(tl auditd.Timeline, st auditd.SourceTimeline, width float64) []Bucket {
	k := max(1, int(math.Round(width/tl.BucketSeconds)))
	var out []Bucket
	for i := 0; i < len(st.Buckets); i += k {
		group := st.Buckets[i:min(i+k, len(st.Buckets))]
		b := Bucket{Start: group[0].Start}
		span := math.Min(width, unix(tl.To)-unix(b.Start))
		for _, g := range group {
			b.Sent += g.Dispatches
			for _, w := range g.Waits {
				b.Waits += w.Count
			}
			b.Cached += g.CacheServed
			b.Failed += g.Status5xx
			b.Refused += g.Throttles
			if w := g.Window.D().Seconds(); g.Limit > 0 && w > 0 {
				b.Allowed = math.Max(b.Allowed, float64(g.Limit)*math.Max(1, math.Ceil(span/w-1e-9)))
			}
		}
		out = append(out, b)
	}
	return out
}

// CheckTimelineChart compares the chart "timeline:<source>" with the
// source's part of the timeline the API returned, merged into buckets
// width seconds wide: one x per bucket start and one at the end of the
// last bucket (a whole bucket after its start, or the timeline's end), the
// requests sent and what the limit in force allowed, and the bucket's
// waits, cache answers, 5xx answers and refusals, in that drawing order.
// It returns the chart's buckets.
func CheckTimelineChart(ctx context.Context, t testing.TB, tl auditd.Timeline, source string, width float64) []Bucket {
	t.Helper()
	st, ok := sourceOf(tl, source)
	if !ok {
		t.Fatalf("the API's timeline has no source %s", source)
	}
	c, err := ReadChart(ctx, "timeline:"+source)
	if err != nil {
		t.Fatalf("read chart of %s: %v", source, err)
	}
	if c.Bucket != width {
		t.Errorf("%s: buckets of %v s, want %v s", source, c.Bucket, width)
	}
	want := Buckets(tl, st, width)
	n := len(want)
	if len(c.Data) != len(TimelineSeries) || len(c.Data[0]) != n+1 {
		t.Fatalf("%s: chart has %d series of %d points; want %d series of %d points", source, len(c.Data), len(c.Data[0]), len(TimelineSeries), n+1)
	}
	for k, label := range TimelineSeries {
		if !strings.HasPrefix(c.Labels[k], label) {
			t.Errorf("%s: series %d is %q, want %q (refusals drawn last, on top)", source, k, c.Labels[k], label)
		}
	}
	for i, b := range want {
		vals := []float64{unix(b.Start), float64(b.Sent), b.Allowed, float64(b.Waits), float64(b.Cached), float64(b.Failed), float64(b.Refused)}
		for k, v := range vals {
			if !same(c.Data[k][i], v) {
				t.Errorf("%s bucket %d (%s), series %q: chart %s, API %v", source, i, b.Start.Format(time.TimeOnly), c.Labels[k], show(c.Data[k][i]), v)
			}
		}
	}
	if end := math.Max(unix(tl.To), unix(want[n-1].Start)+width); n > 0 && !same(c.Data[0][n], end) {
		t.Errorf("%s: last x %s, want the end of the last bucket %v", source, show(c.Data[0][n]), end)
	}
	return want
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

// Box is a label's bounding box on a chart's canvas, in canvas pixels.
type Box struct {
	Axis                     int
	Text                     string
	Left, Top, Right, Bottom float64
}

// LabelBoxes returns the bounding boxes of the tick labels uPlot drew on
// the axes of chart name: each label measured in its axis's font, placed as
// uPlot places it (centred under its tick on the time axis, its lines
// stacked; centred on its tick beside a value axis).
func LabelBoxes(ctx context.Context, name string) ([]Box, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[[]Box](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		const out = [];
		u.ctx.save();
		u.axes.forEach((a, ai) => {
			if (a.show === false || !a._splits) return;
			u.ctx.font = a.font[0];
			const size = a.font[1], gap = size * a.lineGap;
			const sc = u.series[0].scale === a.scale || ai === 0 ? 'x' : a.scale;
			a._splits.forEach((sp, i) => {
				const v = a._values[i];
				if (v === null || v === undefined || v === '') return;
				const lines = String(v).split('\n');
				const w = Math.max(...lines.map((l) => u.ctx.measureText(l).width));
				const pos = u.valToPos(sp, sc, true);
				if (ai === 0) out.push({ Axis: ai, Text: String(v), Left: pos - w / 2, Right: pos + w / 2, Top: 0, Bottom: gap * (lines.length - 1) + size });
				else out.push({ Axis: ai, Text: String(v), Left: 0, Right: w, Top: pos - size / 2, Bottom: pos + size / 2 });
			});
		});
		u.ctx.restore();
		return out;
	})()`, name)))
}

// Overlaps returns the pairs of labels on the same axis whose boxes meet.
func Overlaps(boxes []Box) [][2]Box {
	var out [][2]Box
	for i, a := range boxes {
		for _, b := range boxes[i+1:] {
			if a.Axis == b.Axis && a.Left < b.Right && b.Left < a.Right && a.Top < b.Bottom && b.Top < a.Bottom {
				out = append(out, [2]Box{a, b})
			}
		}
	}
	return out
}

// Marker is what the canvas shows where a marker of a timeline chart was
// drawn: the bucket, the series, and whether the marker's colour is at its
// centre (on top of whatever else is there) or at least within its box
// (visible).
type Marker struct {
	Bucket  int     `json:"bucket"`
	Series  string  `json:"series"`
	Count   float64 `json:"count"`
	OnTop   bool    `json:"onTop"`
	Visible bool    `json:"visible"`
}

// Markers reads back, from the pixels of chart name's canvas, every marker
// of its marker series (from the series index first on): for each point
// with a count, whether its colour shows at its centre and within its box.
func Markers(ctx context.Context, name string, first int) ([]Marker, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[[]Marker](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		const rgb = (c) => { const d = document.createElement('canvas').getContext('2d'); d.fillStyle = c; d.fillRect(0, 0, 1, 1); return d.getImageData(0, 0, 1, 1).data; };
		const near = (p, c) => Math.abs(p[0] - c[0]) + Math.abs(p[1] - c[1]) + Math.abs(p[2] - c[2]) < 60;
		const out = [];
		for (let s = %d; s < u.series.length; s++) {
			const ser = u.series[s], val = (f) => (typeof f === 'function' ? f(u, s) : f), col = rgb(val(ser.points.stroke) || val(ser.stroke));
			const r = Math.ceil(ser.points.size * devicePixelRatio / 2) + 1;
			u.data[s].forEach((v, i) => {
				if (v === null || v === undefined) return;
				const cx = Math.round(u.valToPos(u.data[0][i], 'x', true)), cy = Math.round(u.valToPos(v, ser.scale, true));
				const box = u.ctx.getImageData(cx - r, cy - r, 2 * r + 1, 2 * r + 1).data;
				let visible = false;
				for (let j = 0; j < box.length && !visible; j += 4) visible = near(box.slice(j, j + 3), col);
				const centre = u.ctx.getImageData(cx, cy, 1, 1).data;
				out.push({ bucket: i, series: ser.label, count: v, onTop: near(centre, col), visible });
			});
		}
		return out;
	})()`, name, first)))
}

// AllowanceDrawn reports, for each bucket of timeline chart name with an
// allowance, whether the allowance's colour shows on the canvas at its
// height somewhere across the bucket, clear of its start where markers sit.
func AllowanceDrawn(ctx context.Context, name string) ([]bool, error) {
	return chromedp.Run(ctx, chromedp.Evaluate[[]bool](fmt.Sprintf(`(() => {
		const u = window.auditdCharts[%q];
		const ser = u.series[2];
		const d = document.createElement('canvas').getContext('2d'); d.fillStyle = typeof ser.stroke === 'function' ? ser.stroke(u, 2) : ser.stroke; d.fillRect(0, 0, 1, 1);
		const col = d.getImageData(0, 0, 1, 1).data;
		const out = [];
		const x = u.data[0], a = u.data[2];
		for (let i = 0; i + 1 < x.length; i++) {
			if (a[i] === null) { out.push(true); continue; }
			const x0 = Math.round(u.valToPos(x[i], 'x', true)), x1 = Math.round(u.valToPos(x[i + 1], 'x', true));
			const y = Math.round(u.valToPos(a[i], 'count', true));
			let seen = false;
			for (let px = x0 + Math.ceil((x1 - x0) / 2); px < x1 && !seen; px++) {
				const col2 = u.ctx.getImageData(px, y - 2, 1, 5).data;
				for (let j = 0; j < col2.length && !seen; j += 4) seen = Math.abs(col2[j] - col[0]) + Math.abs(col2[j + 1] - col[1]) + Math.abs(col2[j + 2] - col[2]) < 60;
			}
			out.push(seen);
		}
		return out;
	})()`, name)))
}

// Pace is the bucket width, in seconds, a chart of these sources is drawn
// in (charts.js pace): the API's bucket, widened to as many of
// them as cover the longest window in force.
func Pace(tl auditd.Timeline, sources ...auditd.SourceTimeline) float64 {
	var w float64
	for _, st := range sources {
		for _, b := range st.Buckets {
			w = math.Max(w, b.Window.D().Seconds())
		}
	}
	return tl.BucketSeconds * math.Max(1, math.Ceil(w/tl.BucketSeconds-1e-9))
}
