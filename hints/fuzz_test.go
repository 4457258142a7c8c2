package hints_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/auditd/auditd/hints"
)

// FuzzParse feeds arbitrary header values through every field Parse reads.
// Seeds are real header shapes; the properties are the package invariants:
// no panic, no negative duration, a Has... flag never set on a value the
// parser could not read, and Retry-After parsing agreeing with Parse.
func FuzzParse(f *testing.F) {
	for _, seed := range [][4]string{
		{"120", "Sun, 06 Nov 1994 08:49:37 GMT", "60", "0"},
		{"Wed, 21 Oct 2026 07:28:00 GMT", "Wed, 21 Oct 2026 07:27:00 GMT", "5000", "1767225630"},
		{"Sunday, 06-Nov-94 08:49:37 GMT", "", "10, 10;w=1, 50;w=60", "1767225600250"},
		{"Sun Nov  6 08:49:37 1994", "", `"default";q=100;w=60`, `"default";r=0;t=30`},
		{"1.5", "garbage", `"burst";q=100;w=60, "daily";q=1000;w=86400`, `"burst";r=40;t=10, "daily";r=5;t=3600`},
		{"-1", "", "100;w=60", "limit=100, remaining=50, reset=5"},
		{"99999999999999999999999", "", `"a\"b";q=1`, `"x",`},
	} {
		f.Add(seed[0], seed[1], seed[2], seed[3])
	}
	received := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, retryAfter, date, limit, remaining string) {
		h := http.Header{
			"Retry-After":           {retryAfter},
			"Date":                  {date},
			"X-Ratelimit-Limit":     {limit},
			"X-Ratelimit-Window":    {remaining},
			"X-Ratelimit-Remaining": {remaining},
			"X-Ratelimit-Reset":     {remaining},
			"Ratelimit-Policy":      {limit},
			"Ratelimit":             {remaining},
			"Ratelimit-Limit":       {limit},
			"Ratelimit-Remaining":   {remaining},
			"Ratelimit-Reset":       {remaining},
		}
		got := hints.Parse(h, received)
		if got.RetryAfter < 0 || got.Reset < 0 || got.Window < 0 || got.Limit < 0 || got.Remaining < 0 {
			t.Fatalf("negative value in %+v", got)
		}
		if got.RetryAfterRaw != retryAfter {
			t.Fatalf("RetryAfterRaw = %q, want %q", got.RetryAfterRaw, retryAfter)
		}
		if got.HasRetryAfter == (got.Invalid&hints.FieldRetryAfter != 0) {
			t.Fatalf("Retry-After both parsed and invalid (or neither): %+v", got)
		}
		if !got.HasRetryAfter && got.RetryAfter != 0 {
			t.Fatalf("RetryAfter %v without HasRetryAfter", got.RetryAfter)
		}
		if got.Family == hints.FamilyNone && (got.HasLimit || got.HasRemaining || got.HasReset || got.HasWindow) {
			t.Fatalf("quota fields without a family: %+v", got)
		}
		// With no Date header the reference is the receipt time.
		if date == "" {
			d, ok := hints.ParseRetryAfter(retryAfter, received)
			if ok != got.HasRetryAfter || d != got.RetryAfter {
				t.Fatalf("ParseRetryAfter = %v, %v; Parse = %v, %v", d, ok, got.RetryAfter, got.HasRetryAfter)
			}
		}
	})
}
