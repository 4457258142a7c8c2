package hints

import (
	"math"
	"net/http"
	"time"
)

// Header names in canonical MIME form, so lookups index the map directly
// instead of canonicalising a key on every response.
const (
	headerRetryAfter      = "Retry-After"
	headerDate            = "Date"
	headerXLimit          = "X-Ratelimit-Limit"
	headerXWindow         = "X-Ratelimit-Window"
	headerXRemaining      = "X-Ratelimit-Remaining"
	headerXReset          = "X-Ratelimit-Reset"
	headerRateLimit       = "Ratelimit"
	headerRateLimitPolicy = "Ratelimit-Policy"
	headerDraftLimit      = "Ratelimit-Limit"
	headerDraftRemaining  = "Ratelimit-Remaining"
	headerDraftReset      = "Ratelimit-Reset"
)

// unixSecondsFloor and unixMillisFloor tell a Reset given as a Unix timestamp
// from one given as seconds from now. No quota window is 30 years long, and
// no timestamp auditd will see predates 2001, so the ranges cannot overlap.
const (
	unixSecondsFloor = 1_000_000_000     // 2001-09-09 in seconds
	unixMillisFloor  = 1_000_000_000_000 // the same instant in milliseconds
)

// Family names the header family a Hint's quota fields were read from.
type Family uint8

// Header families, from the least to the most standard. When a response
// carries several, the most standard one that yields a quota field wins.
const (
	FamilyNone       Family = iota
	FamilyXRateLimit        // X-RateLimit-Limit / -Window / -Remaining / -Reset
	FamilyDraft             // RateLimit-Limit / -Remaining / -Reset (drafts -00 to -06), or RateLimit as a dictionary (-07)
	FamilyIETF              // RateLimit-Policy and RateLimit as structured lists (draft-ietf-httpapi-ratelimit-headers-08+)
)

// String returns the family's name as recorded in the ledger.
func (f Family) String() string {
	switch f {
	case FamilyXRateLimit:
		return "x-ratelimit"
	case FamilyDraft:
		return "ratelimit-draft"
	case FamilyIETF:
		return "ratelimit"
	}
	return "none"
}

// Field is a set of hint fields, used to report which headers were present
// but could not be parsed.
type Field uint8

// Fields of a Hint.
const (
	FieldRetryAfter Field = 1 << iota
	FieldDate
	FieldLimit
	FieldWindow
	FieldRemaining
	FieldReset
)

// Hint is everything one response said about the server's limits. The zero
// Hint means "the server said nothing".
type Hint struct {
	// RetryAfterRaw is Retry-After exactly as the server sent it, kept for the
	// ledger even when it does not parse.
	RetryAfterRaw string
	// RetryAfter is the parsed delay, floored at zero; meaningful only when
	// HasRetryAfter. It is not clamped: the cap is per source, in the limiter.
	RetryAfter    time.Duration
	HasRetryAfter bool

	// Limit requests per Window is the quota the server advertises.
	Limit     int
	HasLimit  bool
	Window    time.Duration
	HasWindow bool
	// Remaining is what is left of the quota until Reset from receipt.
	Remaining    int
	HasRemaining bool
	Reset        time.Duration
	HasReset     bool

	// Policy names the IETF policy the quota fields came from ("" otherwise).
	Policy string
	// Family is the header family the quota fields came from.
	Family Family
	// Invalid has a bit set for each header that was present but malformed.
	Invalid Field
}

// Empty reports whether h carries no usable hint at all.
func (h Hint) Empty() bool {
	return !h.HasRetryAfter && !h.HasLimit && !h.HasWindow && !h.HasRemaining && !h.HasReset
}

// Parse reads the rate-limit feedback in header, a response received at
// received. Relative values (an HTTP-date Retry-After, a Unix-timestamp
// Reset) are measured against the response's Date header when it parses, and
// against received otherwise.
func Parse(header http.Header, received time.Time) Hint {
	var h Hint
	ref := received
	if raw, ok := first(header, headerDate); ok {
		if d, ok := parseHTTPDate(raw, received); ok {
			ref = d
		} else {
			h.Invalid |= FieldDate
		}
	}

	if raw, ok := first(header, headerRetryAfter); ok {
		h.RetryAfterRaw = raw
		if d, ok := ParseRetryAfter(raw, ref); ok {
			h.RetryAfter, h.HasRetryAfter = d, true
		} else {
			h.Invalid |= FieldRetryAfter
		}
	}

	// The most standard family that yields anything wins outright: mixing a
	// Limit from one family with a Remaining from another would describe a
	// quota the server never stated.
	var q Hint
	if parseIETF(header, &q) || parseDraft(header, ref, &q) || parseXRateLimit(header, ref, &q) {
		h.Limit, h.HasLimit = q.Limit, q.HasLimit
		h.Window, h.HasWindow = q.Window, q.HasWindow
		h.Remaining, h.HasRemaining = q.Remaining, q.HasRemaining
		h.Reset, h.HasReset = q.Reset, q.HasReset
		h.Policy, h.Family = q.Policy, q.Family
	}
	h.Invalid |= q.Invalid
	return h
}

// ParseRetryAfter parses a Retry-After value in either form RFC 9110 allows:
// delta-seconds, or an HTTP-date (IMF-fixdate, RFC 850 or asctime) measured
// against ref, the response's Date (or its receipt time when it has none).
// The result is floored at zero. ok is false for anything else; a fractional
// delta ("1.5"), which some gateways send, is accepted to the nanosecond.
func ParseRetryAfter(raw string, ref time.Time) (d time.Duration, ok bool) {
	s := trimOWS(raw)
	if s == "" {
		return 0, false
	}
	if isDigit(s[0]) {
		return parseSeconds(s)
	}
	t, ok := parseHTTPDate(s, ref)
	if !ok {
		return 0, false
	}
	return floorSub(t, ref), true
}

// parseXRateLimit reads the X-RateLimit-* family into q and reports whether
// any quota field was found.
func parseXRateLimit(header http.Header, ref time.Time, q *Hint) bool {
	found := false
	if raw, ok := first(header, headerXLimit); ok {
		if n, w, hasW, ok := parseLimitList(raw); ok {
			q.Limit, q.HasLimit, found = n, true, true
			if hasW {
				q.Window, q.HasWindow = w, true
			}
		} else {
			q.Invalid |= FieldLimit
		}
	}
	if raw, ok := first(header, headerXWindow); ok {
		if d, ok := parseSeconds(trimOWS(raw)); ok && d > 0 {
			q.Window, q.HasWindow, found = d, true, true
		} else {
			q.Invalid |= FieldWindow
		}
	}
	if raw, ok := first(header, headerXRemaining); ok {
		if n, ok := parseCount(trimOWS(raw)); ok {
			q.Remaining, q.HasRemaining, found = n, true, true
		} else {
			q.Invalid |= FieldRemaining
		}
	}
	if raw, ok := first(header, headerXReset); ok {
		if d, ok := parseReset(trimOWS(raw), ref); ok {
			q.Reset, q.HasReset, found = d, true, true
		} else {
			q.Invalid |= FieldReset
		}
	}
	if found {
		q.Family = FamilyXRateLimit
	}
	return found
}

// parseReset reads a reset given either as seconds from now or as a Unix
// timestamp (seconds or milliseconds), told apart by magnitude.
func parseReset(s string, ref time.Time) (time.Duration, bool) {
	whole, frac, ok := parseDecimal(s)
	if !ok {
		return 0, false
	}
	switch {
	case whole >= unixMillisFloor:
		return floorSub(time.UnixMilli(whole), ref), true
	case whole >= unixSecondsFloor:
		return floorSub(time.Unix(whole, frac), ref), true
	}
	return seconds(whole, frac), true
}

// parseSeconds reads delta-seconds with an optional fraction.
func parseSeconds(s string) (time.Duration, bool) {
	whole, frac, ok := parseDecimal(s)
	if !ok {
		return 0, false
	}
	return seconds(whole, frac), true
}

// seconds converts whole seconds and nanoseconds to a Duration, saturating
// rather than overflowing: a server asking for a century gets the largest
// Duration, and the per-source cap does the rest.
func seconds(whole int64, frac int64) time.Duration {
	if whole > math.MaxInt64/int64(time.Second)-1 {
		return math.MaxInt64
	}
	return time.Duration(whole)*time.Second + time.Duration(frac)
}

// parseDecimal reads DIGITS ["." DIGITS] into whole units and nanoseconds.
// Digits past nanosecond precision are ignored; a whole part too long for
// int64 saturates. Anything else, including a sign, is rejected.
func parseDecimal(s string) (whole, frac int64, ok bool) {
	i := 0
	for ; i < len(s) && isDigit(s[i]); i++ {
		if whole > (math.MaxInt64-9)/10 {
			whole = math.MaxInt64
			continue
		}
		whole = whole*10 + int64(s[i]-'0')
	}
	if i == 0 {
		return 0, 0, false
	}
	if i < len(s) && s[i] == '.' {
		i++
		start, scale := i, int64(1e8)
		for ; i < len(s) && isDigit(s[i]); i++ {
			frac += int64(s[i]-'0') * scale
			scale /= 10
		}
		if i == start {
			return 0, 0, false
		}
	}
	if i != len(s) {
		return 0, 0, false
	}
	return whole, frac, true
}

// parseCount reads a non-negative integer that fits an int.
func parseCount(s string) (int, bool) {
	whole, frac, ok := parseDecimal(s)
	if !ok || frac != 0 || whole > math.MaxInt32 {
		return 0, false
	}
	return int(whole), true
}

// floorSub returns t - ref, or zero when t is not after ref.
func floorSub(t, ref time.Time) time.Duration {
	if d := t.Sub(ref); d > 0 {
		return d
	}
	return 0
}

// first returns the first value of a header, by canonical key.
func first(header http.Header, key string) (string, bool) {
	v := header[key]
	if len(v) == 0 {
		return "", false
	}
	return v[0], true
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// trimOWS strips the optional whitespace (SP, HTAB) HTTP allows around values.
func trimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
