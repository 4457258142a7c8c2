package api_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// runOf returns a POST /v1/runs body with n items.
func runOf(n int) string {
	items := make([]string, n)
	for i := range items {
		items[i] = fmt.Sprintf(`{"key":"k%d","source":"county","path":"/q/%d"}`, i, i)
	}
	return `{"name":"batch","items":[` + strings.Join(items, ",") + `]}`
}

// TestTokenOverBudget drives one token over its budget, by the bucket and
// by the window: the 429 carries a Retry-After after which the same request
// is admitted, the refused request created nothing, and a retry with the
// same Idempotency-Key is not charged again.
func TestTokenOverBudget(t *testing.T) {
	cases := []struct {
		name      string
		cfg       limiter.BudgetConfig
		first     int // items of the run that fills the budget (cost n+1)
		second    int // items of the run that does not fit
		wantAfter int // Retry-After, seconds
	}{
		// Bucket of 10 refilled at 1/s: 9 units leave 1, half a second adds
		// 0.5; 6 more need 4.5 s, rounded up.
		{"TokenBucket", limiter.BudgetConfig{Limit: 60, Window: time.Minute, Burst: 10}, 8, 5, 5},
		// Ceiling of 20 units per 10 s: 16 then 6 is 22; the first spend
		// leaves the window 10 s after it was made, 9.5 s from now.
		{"SlidingWindow", limiter.BudgetConfig{Limit: 20, Window: 10 * time.Second, Burst: 20}, 15, 5, 10},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, withTokenBudget(tc.cfg))
			op := e.secret[auth.RoleOperator]
			if r := e.do(request{method: "POST", path: "/v1/runs", secret: op, body: runOf(tc.first)}); r.status != http.StatusCreated {
				t.Fatalf("first run: %d %s", r.status, r.body)
			}
			e.clock.Advance(time.Second / 2)
			second := request{method: "POST", path: "/v1/runs", secret: op, body: runOf(tc.second), header: map[string]string{"Idempotency-Key": "batch-2"}}
			head, runs := e.head(), e.runs.count()

			r := e.do(second)
			if r.status != http.StatusTooManyRequests {
				t.Fatalf("second run: %d, want 429; body %s", r.status, r.body)
			}
			after, err := strconv.Atoi(r.header.Get("Retry-After"))
			if err != nil {
				t.Fatalf("Retry-After %q: %v", r.header.Get("Retry-After"), err)
			}
			// Half a second has passed since the budget was spent.
			if want := tc.wantAfter; after != want {
				t.Errorf("Retry-After %d s, want %d s", after, want)
			}
			if p := r.problem(t); p.Code != "too_many_requests" {
				t.Errorf("problem code %q", p.Code)
			}
			if e.runs.count() != runs || e.head() != head {
				t.Fatalf("the refused request created runs (%d to %d) or events (%d to %d)", runs, e.runs.count(), head, e.head())
			}

			// One second short of the hint is still too early...
			e.clock.Advance(time.Duration(after-1) * time.Second)
			if r := e.do(second); r.status != http.StatusTooManyRequests {
				t.Fatalf("a second before Retry-After: %d, want 429", r.status)
			}
			// ...and the hint itself is enough.
			e.clock.Advance(time.Second)
			r = e.do(second)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("after Retry-After: %d (replayed %q), want a new run; body %s", r.status, r.header.Get("Idempotent-Replayed"), r.body)
			}
			var created struct{ ID string }
			r.decode(t, &created)

			// The budget is now spent; the retry is answered from the first
			// run without a charge, so it is not refused.
			r = e.do(second)
			var replay struct{ ID string }
			r.decode(t, &replay)
			if r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" || replay.ID != created.ID {
				t.Fatalf("retry with the same key: %d replayed %q id %s, want 201 true %s", r.status, r.header.Get("Idempotent-Replayed"), replay.ID, created.ID)
			}
			if e.runs.count() != runs+1 {
				t.Errorf("runs %d, want %d", e.runs.count(), runs+1)
			}
		})
	}
}

// TestRunLargerThanBudget: a run that no budget could ever admit is refused
// outright (413), not told to retry.
func TestRunLargerThanBudget(t *testing.T) {
	e := newEnv(t, withTokenBudget(limiter.BudgetConfig{Limit: 100, Window: time.Minute, Burst: 10}))
	r := e.do(request{method: "POST", path: "/v1/runs", secret: e.secret[auth.RoleOperator], body: runOf(20)})
	if r.status != http.StatusRequestEntityTooLarge || r.header.Get("Retry-After") != "" {
		t.Fatalf("%d (Retry-After %q), want 413 without Retry-After", r.status, r.header.Get("Retry-After"))
	}
	if e.runs.count() != 1 {
		t.Errorf("runs %d, want only the fixture", e.runs.count())
	}
}

// TestAuthFailuresBudgeted: failed authentications are budgeted per client
// address; past the budget even a valid token waits, so secrets cannot be
// guessed faster than the budget allows.
func TestAuthFailuresBudgeted(t *testing.T) {
	e := newEnv(t, withAuthBudget(limiter.BudgetConfig{Limit: 30, Window: time.Minute, Burst: 3}))
	for i := range 3 {
		if r := e.do(request{path: "/v1/runs", secret: fmt.Sprintf("adt_guess-%d", i)}); r.status != http.StatusUnauthorized {
			t.Fatalf("guess %d: %d, want 401", i, r.status)
		}
	}
	r := e.do(request{path: "/v1/runs", secret: e.secret[auth.RoleAuditor]})
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "2" {
		t.Fatalf("after 3 failures: %d Retry-After %q, want 429 and 2", r.status, r.header.Get("Retry-After"))
	}
	e.clock.Advance(2 * time.Second)
	if r := e.do(request{path: "/v1/runs", secret: e.secret[auth.RoleAuditor]}); r.status != http.StatusOK {
		t.Fatalf("after Retry-After: %d, want 200", r.status)
	}
	if r := e.do(request{path: "/healthz"}); r.status != http.StatusOK {
		t.Fatalf("healthz is not budgeted: %d", r.status)
	}
}

// TestKeyedBudget checks the waits the budget reports, per key.
func TestKeyedBudget(t *testing.T) {
	// 5 units per 10 s (one every 2 s), 4 back to back.
	cfg := limiter.BudgetConfig{Limit: 5, Window: 10 * time.Second, Burst: 4}
	steps := []struct {
		name    string
		advance time.Duration
		cost    float64
		want    time.Duration
	}{
		{"FullBucketAdmits", 0, 4, 0},
		{"EmptyBucketWaitsForRefill", 0, 1, 2 * time.Second},
		{"WindowCeilingWaitsForOldestSpend", 4 * time.Second, 2, 6 * time.Second},
		{"WindowSlidesThenAdmits", 6 * time.Second, 2, 0},
		{"LargerThanBurstNever", 0, 5, api.Never},
	}
	c := clock.NewFake(start)
	b := mustBudget(t, c, cfg)
	for _, s := range steps {
		c.Advance(s.advance)
		if d := b.Delay("k", s.cost); d != s.want {
			t.Errorf("%s: Delay %v, want %v", s.name, d, s.want)
		}
		if d := b.Admit("k", s.cost); d != s.want {
			t.Fatalf("%s: Admit %v, want %v", s.name, d, s.want)
		}
	}
	if d := b.Admit("other", 4); d != 0 {
		t.Errorf("keys share a budget: %v", d)
	}
}

// An Idempotency-Key answers retries of the request that first used it, and
// only those: the same key with another run in the body is a 409 that
// creates and charges nothing, and the first run is still what a true retry
// gets back.
func TestIdempotencyKeyReusedForAnotherRun(t *testing.T) {
	e := newEnv(t, withTokenBudget(limiter.BudgetConfig{Limit: 100, Window: time.Minute, Burst: 100}))
	op := e.secret[auth.RoleOperator]
	key := map[string]string{"Idempotency-Key": "nightly-1"}
	first := e.do(request{method: "POST", path: "/v1/runs", secret: op, body: runOf(3), header: key})
	if first.status != http.StatusCreated {
		t.Fatalf("first run: %d %s", first.status, first.body)
	}
	var created struct{ ID string }
	first.decode(t, &created)
	runs, head := e.runs.count(), e.head()

	other := e.do(request{method: "POST", path: "/v1/runs", secret: op, body: runOf(4), header: key})
	if other.status != http.StatusConflict {
		t.Fatalf("the key with another run: %d, want 409; body %s", other.status, other.body)
	}
	if p := other.problem(t); p.Code != "conflict" || !strings.Contains(p.Detail, created.ID) {
		t.Errorf("problem %+v: want code conflict naming run %s", p, created.ID)
	}
	if e.runs.count() != runs || e.head() != head {
		t.Fatalf("the refused request created runs (%d to %d) or events (%d to %d)", runs, e.runs.count(), head, e.head())
	}

	retry := e.do(request{method: "POST", path: "/v1/runs", secret: op, body: runOf(3), header: key})
	var replay struct{ ID string }
	retry.decode(t, &replay)
	if retry.status != http.StatusCreated || retry.header.Get("Idempotent-Replayed") != "true" || replay.ID != created.ID {
		t.Fatalf("retry of the first request: %d replayed %q id %s, want 201 true %s", retry.status, retry.header.Get("Idempotent-Replayed"), replay.ID, created.ID)
	}
}
