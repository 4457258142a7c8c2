package sim_test

import (
	"net/http"
	"testing"
	"time"
)

// TestShapesAdmitExactly drives each shape with a constant stream of requests
// far above its rate and checks the admitted count against the formula in the
// package doc, to the request. The convergence tests compute "the hidden
// rate" from those formulas, so they must hold exactly.
func TestShapesAdmitExactly(t *testing.T) {
	tests := []struct {
		name     string
		limit    string
		step     time.Duration
		duration time.Duration
		want     int
		per      int // requests at each step; 0 means 1
	}{
		// B+1 at once, then one per 100ms: 6 + floor(19.99s / 100ms).
		{"LeakyBucket", "{shape: leaky_bucket, requests: 10, window: 1s, burst: 5}", 10 * time.Millisecond, 20 * time.Second, 6 + 199, 1},
		// nginx's default burst 0: one per 100ms exactly.
		{"LeakyBucketNoBurst", "{shape: leaky_bucket, requests: 10, window: 1s}", 10 * time.Millisecond, 20 * time.Second, 1 + 199, 1},
		// Four at once every second against 3/s with room for 3: a bucket
		// that rounded a third of a second up would admit only 2 some seconds.
		{"LeakyBucketThirds", "{shape: leaky_bucket, requests: 3, window: 1s, burst: 2}", time.Second, 30 * time.Second, 90, 4},
		// B at once, then one per 200ms: 20 + floor(19.99s / 200ms).
		{"TokenBucket", "{shape: token_bucket, requests: 5, window: 1s, burst: 20}", 10 * time.Millisecond, 20 * time.Second, 20 + 99, 1},
		// Burst defaults to requests.
		{"TokenBucketDefaultBurst", "{shape: token_bucket, requests: 5, window: 1s}", 10 * time.Millisecond, 20 * time.Second, 5 + 99, 1},
		// Windows [0,60s), [60s,120s), [120s,180s): 60 in each.
		{"FixedWindow", "{shape: fixed_window, requests: 60, window: 1m}", 100 * time.Millisecond, 150 * time.Second, 180, 1},
		// 30 at 0-2.9s, again at 10-12.9s and 20-22.9s.
		{"SlidingWindow", "{shape: sliding_window, requests: 30, window: 10s}", 100 * time.Millisecond, 25 * time.Second, 90, 1},
		// 30 in the first 3s, then 5 a second from 3.5s: 3.5-3.9, 4.5-4.9, 5.5-5.9.
		{"SlidingWindowHalving", "{shape: sliding_window, requests: 10, window: 1s, changes: [{after: 3s, requests: 5}]}", 100 * time.Millisecond, 6 * time.Second, 30 + 15, 1},
		// One per 100ms until 3s, then one per 200ms from 3s: 30 + 15.
		{"LeakyBucketHalving", "{shape: leaky_bucket, requests: 10, window: 1s, changes: [{after: 3s, requests: 5}]}", 10 * time.Millisecond, 6 * time.Second, 30 + 15, 1},
		// A longer window at the same count halves the rate too.
		{"TokenBucketWindowDoubles", "{shape: token_bucket, requests: 10, window: 1s, burst: 1, changes: [{after: 3s, requests: 10, window: 2s}]}", 10 * time.Millisecond, 6 * time.Second, 30 + 15, 1},
		{"None", "{shape: none}", 100 * time.Millisecond, 10 * time.Second, 100, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustServe(t, mustParse(t, "upstreams:\n  - name: u\n    limit: "+tt.limit+"\n"))
			n := 0
			for d := time.Duration(0); d < tt.duration; d += tt.step {
				f.at(d)
				for range max(1, tt.per) {
					f.get("u", "")
					n++
				}
			}
			st := f.sim.Stats("u")
			if st.ByStatus[http.StatusOK] != tt.want {
				t.Errorf("admitted %d of %d, want %d", st.ByStatus[http.StatusOK], n, tt.want)
			}
			if st.Received != n || st.ByStatus[http.StatusOK]+st.ByStatus[http.StatusTooManyRequests] != n {
				t.Errorf("stats %+v do not add up to %d requests", st, n)
			}
		})
	}
}

// TestShapeBoundaries checks single requests at the edges of each shape:
// which are admitted and what Retry-After (delta, rounded up) the rest get.
func TestShapeBoundaries(t *testing.T) {
	type step struct {
		at         time.Duration
		status     int
		retryAfter string
	}
	tests := []struct {
		name  string
		limit string
		steps []step
	}{
		{"FixedWindowResetsOnTheBoundary", "{shape: fixed_window, requests: 2, window: 10s}", []step{
			{0, 200, ""}, {0, 200, ""}, {0, 429, "10"},
			{9500 * time.Millisecond, 429, "1"},
			{10 * time.Second, 200, ""}, {10 * time.Second, 200, ""}, {19 * time.Second, 429, "1"},
		}},
		{"SlidingWindowExpiresExactlyAfterWindow", "{shape: sliding_window, requests: 2, window: 10s}", []step{
			{0, 200, ""}, {4 * time.Second, 200, ""},
			{5 * time.Second, 429, "5"},
			{9999 * time.Millisecond, 429, "1"},
			{10 * time.Second, 200, ""},
			{11 * time.Second, 429, "3"},
			{14 * time.Second, 200, ""},
		}},
		{"LeakyBucketBurstPlusOne", "{shape: leaky_bucket, requests: 1, window: 1s, burst: 1}", []step{
			{0, 200, ""}, {0, 200, ""}, {0, 429, "1"},
			{500 * time.Millisecond, 429, "1"},
			{time.Second, 200, ""}, {time.Second, 429, "1"},
			{10 * time.Second, 200, ""}, {10 * time.Second, 200, ""}, {10 * time.Second, 429, "1"},
		}},
		{"TokenBucketCapacityIsBurst", "{shape: token_bucket, requests: 1, window: 2s, burst: 2}", []step{
			{0, 200, ""}, {0, 200, ""}, {0, 429, "2"},
			{2 * time.Second, 200, ""},
			{3 * time.Second, 429, "1"},
			{4 * time.Second, 200, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := mustServe(t, mustParse(t, "upstreams:\n  - name: u\n    limit: "+tt.limit+"\n"))
			for i, s := range tt.steps {
				f.at(s.at)
				r := f.get("u", "")
				if r.status != s.status || r.header.Get("Retry-After") != s.retryAfter {
					t.Errorf("step %d at %s: got %d Retry-After %q, want %d %q",
						i, s.at, r.status, r.header.Get("Retry-After"), s.status, s.retryAfter)
				}
			}
		})
	}
}

// TestSharedGatewayIsOneBudget alternates requests between the two
// hostnames of shared_gateway.yaml: together they get what one would.
func TestSharedGatewayIsOneBudget(t *testing.T) {
	f := mustServe(t, mustLoad(t, "shared_gateway.yaml"))
	names := []string{"north-county", "south-county"}
	for i, d := 0, time.Duration(0); d < 10*time.Second; i, d = i+1, d+10*time.Millisecond {
		f.at(d)
		f.get(names[i%2], "")
	}
	north, south := f.sim.Stats("north-county"), f.sim.Stats("south-county")
	// Leaky bucket 4/s, burst 2: 3 + floor(9.99s / 250ms).
	if got, want := north.ByStatus[200]+south.ByStatus[200], 3+39; got != want {
		t.Errorf("admitted %d across both hostnames, want %d", got, want)
	}
	if north.ByStatus[200] == 0 || south.ByStatus[200] == 0 {
		t.Errorf("one hostname got nothing: north %v, south %v", north.ByStatus, south.ByStatus)
	}
	if north.Received != 500 || south.Received != 500 {
		t.Errorf("received %d and %d, want 500 each", north.Received, south.Received)
	}
}
