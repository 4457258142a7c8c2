package hints_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/auditd/auditd/hints"
)

// received is when the test responses arrived: Sun, 06 Nov 1994 08:49:37 GMT.
var received = time.Date(1994, time.November, 6, 8, 49, 37, 0, time.UTC)

func TestParseRetryAfter(t *testing.T) {
	for _, tt := range []struct {
		name string
		raw  string
		want time.Duration
		ok   bool
	}{
		{"DeltaSeconds", "120", 120 * time.Second, true},
		{"DeltaZero", "0", 0, true},
		{"DeltaWithWhitespace", " \t7 ", 7 * time.Second, true},
		{"DeltaFraction", "1.500001", 1500001 * time.Microsecond, true},
		{"DeltaHuge", "99999999999999999999999", 1<<63 - 1, true},
		{"IMFFixdate", "Sun, 06 Nov 1994 08:50:07 GMT", 30 * time.Second, true},
		{"IMFFixdateUTC", "Sun, 06 Nov 1994 08:50:07 UTC", 30 * time.Second, true},
		{"RFC850", "Sunday, 06-Nov-94 08:49:47 GMT", 10 * time.Second, true},
		{"ASCTime", "Sun Nov  6 08:49:38 1994", time.Second, true},
		{"ASCTimeTwoDigitDay", "Sun Nov 06 08:49:38 1994", time.Second, true},
		{"DateInPastFloorsAtZero", "Sun, 06 Nov 1994 08:00:00 GMT", 0, true},
		{"LeapSecond", "Sun, 06 Nov 1994 08:49:60 GMT", 23 * time.Second, true},
		{"Empty", "", 0, false},
		{"Negative", "-5", 0, false},
		{"Words", "next tuesday", 0, false},
		{"TrailingGarbage", "120s", 0, false},
		{"BareDot", "1.", 0, false},
		{"BadMonth", "Sun, 06 Foo 1994 08:49:37 GMT", 0, false},
		{"Feb31", "Sun, 31 Feb 1994 08:49:37 GMT", 0, false},
		{"Hour24", "Sun, 06 Nov 1994 24:00:00 GMT", 0, false},
		{"LocalZone", "Sun, 06 Nov 1994 08:49:37 PST", 0, false},
		{"LowercaseDay", "sun, 06 Nov 1994 08:49:37 GMT", 0, false},
		{"RFC850ShortDay", "Sun, 06-Nov-94 08:49:37 GMT", 0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := hints.ParseRetryAfter(tt.raw, received)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("ParseRetryAfter(%q) = %v, %v; want %v, %v", tt.raw, got, ok, tt.want, tt.ok)
			}
		})
	}
}

// TestRFC850Century checks RFC 9110's rule for two-digit years: a year more
// than 50 years ahead of the reference is in the previous century.
func TestRFC850Century(t *testing.T) {
	ref := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tt := range []struct {
		name string
		raw  string
		ok   bool
		want time.Duration
	}{
		{"SameCentury", "Friday, 02-Jan-26 00:00:00 GMT", true, 24 * time.Hour},
		{"FiftyYearsAheadStays", "Wednesday, 01-Jan-76 00:00:00 GMT", true, time.Date(2076, 1, 1, 0, 0, 0, 0, time.UTC).Sub(ref)},
		{"MoreThanFiftyIsPast", "Monday, 01-Jan-77 00:00:00 GMT", true, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := hints.ParseRetryAfter(tt.raw, ref)
			if ok != tt.ok || got != tt.want {
				t.Fatalf("got %v, %v; want %v, %v", got, ok, tt.want, tt.ok)
			}
		})
	}
}

func header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func TestParse(t *testing.T) {
	for _, tt := range []struct {
		name   string
		header http.Header
		want   hints.Hint
	}{
		{
			name:   "NoHeaders",
			header: header(),
			want:   hints.Hint{},
		},
		{
			name:   "RetryAfterGarbageIsNoHint",
			header: header("Retry-After", "soon"),
			want:   hints.Hint{RetryAfterRaw: "soon", Invalid: hints.FieldRetryAfter},
		},
		{
			// The server's clock runs 10 minutes ahead of ours; its date
			// means "30 seconds after my Date", not "10m30s from now".
			name: "RetryAfterDateMeasuredAgainstResponseDate",
			header: header(
				"Date", "Sun, 06 Nov 1994 08:59:37 GMT",
				"Retry-After", "Sun, 06 Nov 1994 09:00:07 GMT"),
			want: hints.Hint{RetryAfterRaw: "Sun, 06 Nov 1994 09:00:07 GMT", RetryAfter: 30 * time.Second, HasRetryAfter: true},
		},
		{
			name: "RetryAfterDateWithBadDateHeaderUsesReceipt",
			header: header(
				"Date", "yesterday",
				"Retry-After", "Sun, 06 Nov 1994 08:49:47 GMT"),
			want: hints.Hint{RetryAfterRaw: "Sun, 06 Nov 1994 08:49:47 GMT", RetryAfter: 10 * time.Second, HasRetryAfter: true, Invalid: hints.FieldDate},
		},
		{
			name: "XRateLimitResetSeconds",
			header: header(
				"X-RateLimit-Limit", "60",
				"X-RateLimit-Window", "60",
				"X-RateLimit-Remaining", "0",
				"X-RateLimit-Reset", "42"),
			want: hints.Hint{
				Limit: 60, HasLimit: true, Window: time.Minute, HasWindow: true,
				HasRemaining: true, Reset: 42 * time.Second, HasReset: true,
				Family: hints.FamilyXRateLimit,
			},
		},
		{
			name: "XRateLimitResetUnixTimestamp",
			header: header(
				"X-RateLimit-Remaining", "3",
				"X-RateLimit-Reset", "784111807"), // received+30s is below the floor: a delta
			want: hints.Hint{Remaining: 3, HasRemaining: true, Reset: 784111807 * time.Second, HasReset: true, Family: hints.FamilyXRateLimit},
		},
		{
			name: "XRateLimitResetUnixTimestampModern",
			header: header(
				"Date", "Thu, 01 Jan 2026 00:00:00 GMT",
				"X-RateLimit-Reset", "1767225630"),
			want: hints.Hint{Reset: 30 * time.Second, HasReset: true, Family: hints.FamilyXRateLimit},
		},
		{
			name: "XRateLimitResetUnixMillis",
			header: header(
				"Date", "Thu, 01 Jan 2026 00:00:00 GMT",
				"X-RateLimit-Reset", "1767225600250"),
			want: hints.Hint{Reset: 250 * time.Millisecond, HasReset: true, Family: hints.FamilyXRateLimit},
		},
		{
			name: "XRateLimitGarbageFlagged",
			header: header(
				"X-RateLimit-Limit", "lots",
				"X-RateLimit-Remaining", "-1"),
			want: hints.Hint{Invalid: hints.FieldLimit | hints.FieldRemaining},
		},
		{
			name:   "XRateLimitLimitWithPolicies",
			header: header("X-RateLimit-Limit", "10, 10;w=1, 50;w=60"),
			want:   hints.Hint{Limit: 10, HasLimit: true, Window: time.Second, HasWindow: true, Family: hints.FamilyXRateLimit},
		},
		{
			name: "IETFPolicyAndRateLimit",
			header: header(
				"RateLimit-Policy", `"default";q=100;w=60`,
				"RateLimit", `"default";r=0;t=30`),
			want: hints.Hint{
				Limit: 100, HasLimit: true, Window: time.Minute, HasWindow: true,
				HasRemaining: true, Reset: 30 * time.Second, HasReset: true,
				Policy: "default", Family: hints.FamilyIETF,
			},
		},
		{
			name: "IETFBindingPolicyIsLeastRemaining",
			header: header(
				"RateLimit-Policy", `"burst";q=100;w=60, "daily";q=1000;w=86400;qu="requests"`,
				"RateLimit", `"burst";r=40;t=10, "daily";r=5;t=3600`),
			want: hints.Hint{
				Limit: 1000, HasLimit: true, Window: 24 * time.Hour, HasWindow: true,
				Remaining: 5, HasRemaining: true, Reset: time.Hour, HasReset: true,
				Policy: "daily", Family: hints.FamilyIETF,
			},
		},
		{
			name:   "IETFPolicyOnlyPicksLowestRate",
			header: header("RateLimit-Policy", `"a";q=100;w=10, "b";q=600;w=3600`),
			want:   hints.Hint{Limit: 600, HasLimit: true, Window: time.Hour, HasWindow: true, Policy: "b", Family: hints.FamilyIETF},
		},
		{
			name: "IETFWinsOverXRateLimit",
			header: header(
				"X-RateLimit-Limit", "5000",
				"RateLimit", `"default";r=7;t=1`),
			want: hints.Hint{Remaining: 7, HasRemaining: true, Reset: time.Second, HasReset: true, Policy: "default", Family: hints.FamilyIETF},
		},
		{
			name: "DraftSeparateFields",
			header: header(
				"RateLimit-Limit", "100",
				"RateLimit-Policy", "100;w=60",
				"RateLimit-Remaining", "50",
				"RateLimit-Reset", "5"),
			want: hints.Hint{
				Limit: 100, HasLimit: true, Window: time.Minute, HasWindow: true,
				Remaining: 50, HasRemaining: true, Reset: 5 * time.Second, HasReset: true,
				Family: hints.FamilyDraft,
			},
		},
		{
			name:   "Draft07Dictionary",
			header: header("RateLimit", "limit=100, remaining=0, reset=12"),
			want: hints.Hint{
				Limit: 100, HasLimit: true, HasRemaining: true, Reset: 12 * time.Second, HasReset: true,
				Family: hints.FamilyDraft,
			},
		},
		{
			name:   "MapLiteralWithCanonicalKey",
			header: http.Header{"Retry-After": {"3"}},
			want:   hints.Hint{RetryAfterRaw: "3", RetryAfter: 3 * time.Second, HasRetryAfter: true},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := hints.Parse(tt.header, received); got != tt.want {
				t.Fatalf("Parse:\n got %+v\nwant %+v", got, tt.want)
			}
		})
	}
}
