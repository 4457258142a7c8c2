package sim_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestRetryAfterForms sends each upstream of retry_after_forms.yaml two
// requests 300ms after the start; the second is over its 1-per-10s limit,
// so the true wait is 9.7s, up to the window's end at 00:00:10.
func TestRetryAfterForms(t *testing.T) {
	f := mustServe(t, mustLoad(t, "retry_after_forms.yaml"))
	f.at(300 * time.Millisecond)
	tests := []struct {
		upstream   string
		status     int
		retryAfter string // "" means absent
		date       string
	}{
		{"delta", 429, "10", "Thu, 01 Jan 2026 00:00:00 GMT"},
		{"imf-fixdate", 429, "Thu, 01 Jan 2026 00:00:10 GMT", "Thu, 01 Jan 2026 00:00:00 GMT"},
		{"rfc850", 429, "Thursday, 01-Jan-26 00:00:10 GMT", "Thu, 01 Jan 2026 00:00:00 GMT"},
		{"asctime", 429, "Thu Jan  1 00:00:10 2026", "Thu, 01 Jan 2026 00:00:00 GMT"},
		{"silent", 429, "", "Thu, 01 Jan 2026 00:00:00 GMT"},
		// Five minutes slow: the date and the HTTP-date hint are both in its past.
		{"skewed-date", 503, "Wed, 31 Dec 2025 23:55:10 GMT", "Wed, 31 Dec 2025 23:55:00 GMT"},
		{"absurd-hint", 429, "86400", "Thu, 01 Jan 2026 00:00:00 GMT"},
	}
	for _, tt := range tests {
		t.Run(tt.upstream, func(t *testing.T) {
			if r := f.get(tt.upstream, ""); r.status != http.StatusOK {
				t.Fatalf("first request: %d, want 200", r.status)
			}
			r := f.get(tt.upstream, "")
			ra, present := r.header["Retry-After"]
			switch {
			case r.status != tt.status:
				t.Errorf("status %d, want %d", r.status, tt.status)
			case tt.retryAfter == "" && present:
				t.Errorf("Retry-After %q, want none", ra)
			case tt.retryAfter != "" && r.header.Get("Retry-After") != tt.retryAfter:
				t.Errorf("Retry-After %q, want %q", r.header.Get("Retry-After"), tt.retryAfter)
			}
			// The Date header is second-granular, so 300ms in still reads :00.
			if got := r.header.Get("Date"); got != tt.date {
				t.Errorf("Date %q, want %q", got, tt.date)
			}
		})
	}
}

// TestAdvertisedHeaders: a fixed window of 3 per 10s, asked at 0s, 4s, 4s
// and 4s (rejected): what each header set says about it.
func TestAdvertisedHeaders(t *testing.T) {
	unix := func(d time.Duration) string { return strconv.FormatInt(t0.Add(d).Unix(), 10) }
	tests := []struct {
		advertise string
		want      [4]map[string]string
	}{
		{"x_ratelimit", [4]map[string]string{
			{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "2", "X-RateLimit-Reset": "10"},
			{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "1", "X-RateLimit-Reset": "6"},
			{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "6"},
			{"X-RateLimit-Limit": "3", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "6"},
		}},
		{"x_ratelimit_unix", [4]map[string]string{
			{"X-RateLimit-Remaining": "2", "X-RateLimit-Reset": unix(10 * time.Second)},
			{"X-RateLimit-Remaining": "1", "X-RateLimit-Reset": unix(10 * time.Second)},
			{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": unix(10 * time.Second)},
			{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": unix(10 * time.Second)},
		}},
		{"ietf", [4]map[string]string{
			{"RateLimit-Policy": `"default";q=3;w=10`, "RateLimit": `"default";r=2;t=10`},
			{"RateLimit-Policy": `"default";q=3;w=10`, "RateLimit": `"default";r=1;t=6`},
			{"RateLimit-Policy": `"default";q=3;w=10`, "RateLimit": `"default";r=0;t=6`},
			{"RateLimit-Policy": `"default";q=3;w=10`, "RateLimit": `"default";r=0;t=6`},
		}},
		{"none", [4]map[string]string{
			{"X-RateLimit-Limit": "", "RateLimit": ""}, {}, {}, {"X-RateLimit-Remaining": "", "RateLimit-Policy": ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.advertise, func(t *testing.T) {
			f := mustServe(t, mustParse(t, `
upstreams:
  - name: u
    limit: {shape: fixed_window, requests: 3, window: 10s}
    reject: {advertise: `+tt.advertise+`}
`))
			statuses := [4]int{200, 200, 200, 429}
			for i, d := range []time.Duration{0, 4 * time.Second, 4 * time.Second, 4 * time.Second} {
				f.at(d)
				r := f.get("u", "")
				if r.status != statuses[i] {
					t.Errorf("request %d: status %d, want %d", i, r.status, statuses[i])
				}
				for k, v := range tt.want[i] {
					if got := r.header.Get(k); got != v {
						t.Errorf("request %d: %s %q, want %q", i, k, got, v)
					}
				}
			}
		})
	}
}

// TestLeakyBucketAdvertisesItsLevel: remaining counts what could go back to
// back now, reset is when the bucket is empty.
func TestLeakyBucketAdvertisesItsLevel(t *testing.T) {
	f := mustServe(t, mustParse(t, `
upstreams:
  - name: u
    limit: {shape: leaky_bucket, requests: 2, window: 1s, burst: 3}
    reject: {advertise: x_ratelimit}
`))
	want := []struct{ remaining, reset string }{{"3", "1"}, {"2", "1"}, {"1", "2"}, {"0", "2"}, {"0", "2"}}
	for i, w := range want {
		r := f.get("u", "")
		if r.header.Get("X-RateLimit-Remaining") != w.remaining || r.header.Get("X-RateLimit-Reset") != w.reset {
			t.Errorf("request %d: remaining %q reset %q, want %q %q", i,
				r.header.Get("X-RateLimit-Remaining"), r.header.Get("X-RateLimit-Reset"), w.remaining, w.reset)
		}
	}
}

// TestOutageWindows walks outage.yaml: [from, to) is exact, a drop is a
// transport error with no status, and the stats tie out.
func TestOutageWindows(t *testing.T) {
	f := mustServe(t, mustLoad(t, "outage.yaml"))
	// A dropped connection that had served a request before is retried once
	// by net/http for an idempotent GET, which would count twice; a fresh
	// connection per request keeps the count one to one.
	f.client.Transport = &http.Transport{DisableKeepAlives: true}
	tests := []struct {
		at     time.Duration
		status int // 0: the connection is dropped
	}{
		{0, 200},
		{29 * time.Second, 200},
		{30 * time.Second, 503},
		{89 * time.Second, 503},
		{90 * time.Second, 200},
		{2 * time.Minute, 0},
		{2*time.Minute + 29*time.Second, 0},
		{2*time.Minute + 30*time.Second, 200},
		{3 * time.Minute, 502},
		{3*time.Minute + 30*time.Second, 200},
	}
	for _, tt := range tests {
		f.at(tt.at)
		r, err := f.try(http.MethodGet, "maintenance-county", "", "")
		switch {
		case tt.status == 0 && err == nil:
			t.Errorf("at %s: got %d, want a dropped connection", tt.at, r.status)
		case tt.status != 0 && err != nil:
			t.Errorf("at %s: %v, want %d", tt.at, err, tt.status)
		case tt.status != 0 && r.status != tt.status:
			t.Errorf("at %s: got %d, want %d", tt.at, r.status, tt.status)
		}
	}
	st := f.sim.Stats("maintenance-county")
	if st.Received != 10 || st.Dropped != 2 || st.ByStatus[200] != 5 || st.ByStatus[503] != 2 || st.ByStatus[502] != 1 {
		t.Errorf("stats %+v, want 10 received: 5×200, 2×503, 1×502, 2 dropped", st)
	}
}

// TestBodyErrors: Grants.gov's every-5th errorcode, and ArcGIS token errors
// both for a missing or wrong credential and for a configured period.
func TestBodyErrors(t *testing.T) {
	f := mustServe(t, mustLoad(t, "body_errors.yaml"))
	t.Run("GrantsGovEveryFifth", func(t *testing.T) {
		var codes []int
		for range 10 {
			r := f.do(http.MethodPost, "grants-gov", "", `{"keyword":"parcel","startRecordNum":0,"rows":5}`)
			var body struct {
				ErrorCode int    `json:"errorcode"`
				Msg       string `json:"msg"`
			}
			if r.status != 200 {
				t.Fatalf("status %d, want 200", r.status)
			}
			if err := json.Unmarshal([]byte(r.body), &body); err != nil {
				t.Fatalf("body %q: %v", r.body, err)
			}
			codes = append(codes, body.ErrorCode)
		}
		want := []int{0, 0, 0, 0, 1, 0, 0, 0, 0, 1}
		for i := range want {
			if codes[i] != want[i] {
				t.Fatalf("errorcodes %v, want %v", codes, want)
			}
		}
		if st := f.sim.Stats("grants-gov"); st.BodyErrors != 2 || st.ByStatus[200] != 10 {
			t.Errorf("stats %+v, want 10×200 of which 2 body errors", st)
		}
	})
	t.Run("ArcGISToken", func(t *testing.T) {
		send := func(token string) (code int, features int) {
			u := f.urls["arcgis-token"] + "?resultRecordCount=10"
			req, _ := http.NewRequest(http.MethodGet, u, nil)
			if token != "" {
				req.Header.Set("X-Esri-Authorization", token)
			}
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error    *struct{ Code int } `json:"error"`
				Features []json.RawMessage   `json:"features"`
			}
			if resp.StatusCode != 200 {
				t.Fatalf("status %d, want 200 (ArcGIS reports token errors in the body)", resp.StatusCode)
			}
			if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
				t.Fatal(err)
			}
			if body.Error != nil {
				return body.Error.Code, 0
			}
			return 0, len(body.Features)
		}
		tests := []struct {
			name     string
			at       time.Duration
			token    string
			code     int
			features int
		}{
			{"Missing", 0, "", 499, 0},
			{"Wrong", 0, "Bearer stale", 498, 0},
			{"Right", 0, "Bearer sim-token", 0, 10},
			{"RightDuringTokenOutage", 10 * time.Second, "Bearer sim-token", 498, 0},
			{"RightAfterIt", 20 * time.Second, "Bearer sim-token", 0, 10},
		}
		for _, tt := range tests {
			f.at(tt.at)
			if code, n := send(tt.token); code != tt.code || n != tt.features {
				t.Errorf("%s: error code %d with %d features, want %d with %d", tt.name, code, n, tt.code, tt.features)
			}
		}
	})
}

func TestRequiredHeaderStatus(t *testing.T) {
	for _, status := range []int{401, 403} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			f := mustServe(t, mustParse(t, `
upstreams:
  - name: u
    required_header: {name: X-API-Key, value: k1, status: `+strconv.Itoa(status)+`}
`))
			if r := f.get("u", ""); r.status != status {
				t.Errorf("without the key: %d, want %d", r.status, status)
			}
			req, _ := http.NewRequest(http.MethodGet, f.urls["u"], nil)
			req.Header.Set("X-API-Key", "k1")
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				t.Errorf("with the key: %d, want 200", resp.StatusCode)
			}
		})
	}
}

// TestUnauthorizedRequestsSpendNoBudget: a request without the credential never
// reaches the limiter, so it cannot use up the budget.
func TestUnauthorizedRequestsSpendNoBudget(t *testing.T) {
	f := mustServe(t, mustParse(t, `
upstreams:
  - name: u
    limit: {shape: fixed_window, requests: 1, window: 1m}
    required_header: {name: X-API-Key, value: k1}
`))
	for range 3 {
		f.get("u", "")
	}
	req, _ := http.NewRequest(http.MethodGet, f.urls["u"], nil)
	req.Header.Set("X-API-Key", "k1")
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("first keyed request: %d, want 200", resp.StatusCode)
	}
	if st := f.sim.Stats("u"); st.ByStatus[401] != 3 || st.Received != 4 {
		t.Errorf("stats %+v, want 3×401 and 4 received", st)
	}
}

func TestPlainBodyIsPaddedToResponseBytes(t *testing.T) {
	f := mustServe(t, mustParse(t, "upstreams:\n  - name: u\n    response_bytes: 4096\n"))
	r := f.get("u", "tile=1")
	if len(r.body) != 4096 || !strings.HasPrefix(r.body, `{"upstream":"u","path":"/?tile=1"`) {
		t.Errorf("body of %d bytes starting %.40q, want 4096 bytes naming the request", len(r.body), r.body)
	}
	if !json.Valid([]byte(r.body)) {
		t.Error("padded body is not valid JSON")
	}
}
