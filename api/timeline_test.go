package api_test

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// TestTimelines reads the timelines of the env's run (one dispatch, one 200,
// all at the start) through the API: the default buckets, the source filter,
// a source's range. Every response is checked against openapi.yaml.
func TestTimelines(t *testing.T) {
	e := newEnv(t)
	auditor := e.secret[auth.RoleAuditor]
	get := func(path string) auditd.Timeline {
		t.Helper()
		r := e.do(request{path: path, secret: auditor})
		if r.status != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, r.status, r.body)
		}
		var tl auditd.Timeline
		r.decode(t, &tl)
		return tl
	}
	dispatches := func(tl auditd.Timeline) (n, ok int) {
		for _, s := range tl.Sources {
			for _, b := range s.Buckets {
				n, ok = n+b.Dispatches, ok+b.Status2xx
			}
		}
		return n, ok
	}

	t.Run("Run", func(t *testing.T) {
		tl := get("/v1/runs/" + e.runID + "/timeline")
		if tl.RunID != e.runID || tl.Bucket.D() != time.Second || !tl.From.Equal(start) || !tl.To.Equal(start.Add(time.Second)) {
			t.Errorf("run %s from %s to %s in %s; want the run's second in a bucket of 1s (the default for a short run)", tl.RunID, tl.From, tl.To, tl.Bucket.D())
		}
		if len(tl.Sources) != 1 || tl.Sources[0].SourceID != "county" {
			t.Fatalf("sources %+v, want county", tl.Sources)
		}
		if n, ok := dispatches(tl); n != 1 || ok != 1 {
			t.Errorf("%d dispatches, %d 2xx; want the run's one, a 200", n, ok)
		}
	})
	t.Run("RunBucket", func(t *testing.T) {
		tl := get("/v1/runs/" + e.runID + "/timeline?bucket=1m")
		if tl.Bucket.D() != time.Minute || tl.BucketSeconds != 60 || !tl.From.Equal(start.Truncate(time.Minute)) {
			t.Errorf("bucket %s (%v s) from %s", tl.Bucket.D(), tl.BucketSeconds, tl.From)
		}
	})
	t.Run("RunOtherSource", func(t *testing.T) {
		if tl := get("/v1/runs/" + e.runID + "/timeline?source=state"); len(tl.Sources) != 0 {
			t.Errorf("sources %+v, want none: the run has no events of state", tl.Sources)
		}
	})
	t.Run("RunSources", func(t *testing.T) {
		for _, q := range []string{"source=state,county", "source=state&source=county"} {
			if tl := get("/v1/runs/" + e.runID + "/timeline?" + q); len(tl.Sources) != 1 || tl.Sources[0].SourceID != "county" {
				t.Errorf("%s: sources %+v, want county", q, tl.Sources)
			}
		}
	})
	t.Run("Source", func(t *testing.T) {
		to := start.Add(time.Minute)
		tl := get("/v1/sources/county/timeline?to=" + url.QueryEscape(to.Format(time.RFC3339)))
		if tl.SourceID != "county" || !tl.From.Equal(to.Add(-time.Hour)) || !tl.To.Equal(to) || tl.Bucket.D() != 15*time.Second {
			t.Errorf("source %s from %s to %s in %s; want the hour before to in 240 buckets of 15s", tl.SourceID, tl.From, tl.To, tl.Bucket.D())
		}
		if n, ok := dispatches(tl); n != 1 || ok != 1 {
			t.Errorf("%d dispatches, %d 2xx; want the one of the run", n, ok)
		}
		if len(tl.Sources) != 1 || len(tl.Sources[0].Buckets) != 240 {
			t.Errorf("sources %d, want county with 240 buckets", len(tl.Sources))
		}
	})
}

// TestTimelineBadInput: bad buckets, ranges and filters are 4xx problems
// naming the parameter, and write nothing.
func TestTimelineBadInput(t *testing.T) {
	e := newEnv(t)
	run := "/v1/runs/" + e.runID + "/timeline"
	src := "/v1/sources/county/timeline"
	cases := []struct {
		name   string
		path   string
		status int
		field  string
	}{
		{"BucketZero", run + "?bucket=0s", 400, "bucket"},
		{"BucketNegative", run + "?bucket=-1s", 400, "bucket"},
		{"BucketWords", run + "?bucket=fast", 400, "bucket"},
		{"BucketNoUnit", run + "?bucket=60", 400, "bucket"},
		{"BucketTooNarrow", run + "?bucket=50ms", 400, "bucket"},
		{"BucketTooWide", run + "?bucket=25h", 400, "bucket"},
		{"SourceBucketWords", src + "?bucket=1x", 400, "bucket"},
		{"RunSourceTooLong", run + "?source=" + strings.Repeat("s", 101), 400, "source"},
		{"RunSourceNotASCII", run + "?source=%E2%9C%93", 400, "source"},
		{"RunSourceEmpty", run + "?source=county,", 400, "source"},
		{"RunSourcesTooMany", run + "?source=" + strings.Repeat("s,", 50) + "s", 400, "source"},
		{"RunUnknown", "/v1/runs/01JNOPE/timeline", 404, ""},
		{"SourceUnknown", "/v1/sources/nowhere/timeline", 404, ""},
		{"FromNotTime", src + "?from=yesterday", 400, "from"},
		{"ToNotTime", src + "?to=03/02/2026", 400, "to"},
		{"ToBeforeFrom", src + "?from=2026-03-02&to=2026-03-01", 400, "to"},
		{"FromEqualsTo", src + "?from=2026-03-02&to=2026-03-02", 400, "to"},
		{"FromAfterNow", src + "?from=2099-01-01", 400, "from"},
		{"RangeTooLong", src + "?from=1990-01-01&to=2026-03-02&bucket=24h", 400, "from"},
		{"TooManyBuckets", src + "?from=2026-03-01&to=2026-03-02&bucket=1s", 400, "bucket"},
		{"TooManyBucketsDefaultRange", src + "?bucket=100ms", 400, "bucket"},
	}
	head := e.head()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(request{path: tc.path, secret: e.secret[auth.RoleAuditor]})
			if r.status != tc.status {
				t.Fatalf("%d, want %d; body %s", r.status, tc.status, r.body)
			}
			p := r.problem(t)
			if p.Status != tc.status || p.Field != tc.field || p.RequestID == "" {
				t.Errorf("problem %+v, want status %d on field %q", p, tc.status, tc.field)
			}
		})
	}
	if got := e.eventsAfter(head); len(got) != 0 {
		t.Errorf("rejected requests wrote %d ledger events", len(got))
	}
}
