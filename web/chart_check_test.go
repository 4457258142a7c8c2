package web_test

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd/web/webtest"
)

// checkChartDrawn reads chart name back from the canvas at a window width:
// no tick label overlaps another, every marker of a timeline chart is
// visible and every refusal is on top, and every bucket's allowance is
// drawn.
func checkChartDrawn(t *testing.T, ctx context.Context, name string, width int64) {
	t.Helper()
	boxes, err := webtest.LabelBoxes(ctx, name)
	if err != nil {
		t.Fatalf("%s at %d px: label boxes: %v", name, width, err)
	}
	if len(boxes) < 4 {
		t.Errorf("%s at %d px: %d tick labels drawn", name, width, len(boxes))
	}
	for _, o := range webtest.Overlaps(boxes) {
		t.Errorf("%s at %d px: labels %q and %q overlap (%v, %v)", name, width, o[0].Text, o[1].Text, o[0], o[1])
	}
	if !strings.HasPrefix(name, "timeline:") {
		return
	}
	markers, err := webtest.Markers(ctx, name, 3)
	if err != nil {
		t.Fatalf("%s at %d px: markers: %v", name, width, err)
	}
	kinds := map[string]int{}
	for _, m := range markers {
		kinds[m.Series]++
		if !m.Visible {
			t.Errorf("%s at %d px: the %s marker of bucket %d (%v) is not visible", name, width, m.Series, m.Bucket, m.Count)
		}
		if m.Series == "429 refusals" && !m.OnTop {
			t.Errorf("%s at %d px: the refusal marker of bucket %d (%v) is not on top", name, width, m.Bucket, m.Count)
		}
	}
	if name == "timeline:hays-gis" && (kinds["429 refusals"] == 0 || kinds["5xx answers"] == 0 || kinds["Served from cache"] == 0 || kinds["Waits"] == 0) {
		t.Errorf("%s at %d px: markers drawn %v; want refusals, 5xx answers, cache answers and waits", name, width, kinds)
	}
	drawn, err := webtest.AllowanceDrawn(ctx, name)
	if err != nil {
		t.Fatalf("%s at %d px: allowance: %v", name, width, err)
	}
	for i, ok := range drawn {
		if !ok {
			t.Errorf("%s at %d px: bucket %d's allowance is not drawn", name, width, i)
		}
	}
}

// noRawValues fails t when the page's main text shows a raw value.
func noRawValues(t *testing.T, ctx context.Context, page string) {
	t.Helper()
	body, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.getElementById('main').innerText`))
	if err != nil {
		t.Fatalf("%s page text: %v", page, err)
	}
	for _, r := range webtest.RawValues(body) {
		t.Errorf("%s page shows %s", page, r)
	}
}
