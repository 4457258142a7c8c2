package hints

import (
	"net/http"
	"time"
)

// parseIETF reads the current IETF form (draft-ietf-httpapi-ratelimit-headers
// -08 and later), where both fields are structured lists keyed by policy:
//
//	RateLimit-Policy: "burst";q=100;w=60, "daily";q=1000;w=86400
//	RateLimit: "burst";r=0;t=30
//
// When RateLimit names several policies, the one with the least remaining is
// the one that binds, so it is the one reported; its quota comes from the
// RateLimit-Policy member of the same name. With RateLimit-Policy alone, the
// policy with the lowest rate (q/w) is reported.
func parseIETF(header http.Header, q *Hint) bool {
	rl, hasRL := first(header, headerRateLimit)
	pol, hasPol := first(header, headerRateLimitPolicy)
	rlList := hasRL && isPolicyList(rl)
	polList := hasPol && isPolicyList(pol)
	if !rlList && !polList {
		return false
	}
	found := false
	if rlList {
		bestR, bestT := -1, time.Duration(0)
		for s := rl; s != ""; {
			m, rest, ok := nextMember(s)
			if !ok {
				q.Invalid |= FieldRemaining
				break
			}
			s = rest
			r, okR := paramCount(m.params, "r")
			t, okT := paramSeconds(m.params, "t")
			if !okR {
				continue
			}
			if bestR < 0 || r < bestR || (r == bestR && t > bestT) {
				bestR, bestT = r, t
				q.Policy = m.str
				q.Remaining, q.HasRemaining = r, true
				q.Reset, q.HasReset = t, okT
				found = true
			}
		}
	}
	if polList {
		var bestQ int
		var bestW time.Duration
		for s := pol; s != ""; {
			m, rest, ok := nextMember(s)
			if !ok {
				q.Invalid |= FieldLimit
				break
			}
			s = rest
			n, okQ := paramCount(m.params, "q")
			w, okW := paramSeconds(m.params, "w")
			if !okQ {
				continue
			}
			if q.HasRemaining {
				// RateLimit chose the binding policy; take its quota only.
				if m.str != q.Policy {
					continue
				}
			} else if q.HasLimit && !(okW && w > 0 && bestW > 0 && lowerRate(n, w, bestQ, bestW)) {
				continue
			}
			bestQ, bestW = n, w
			q.Limit, q.HasLimit = n, true
			q.Window, q.HasWindow = w, okW && w > 0
			found = true
			if q.HasRemaining {
				break
			}
			q.Policy = m.str
		}
	}
	if found {
		q.Family = FamilyIETF
	}
	return found
}

// lowerRate reports whether n per w is a lower rate than m per v.
func lowerRate(n int, w time.Duration, m int, v time.Duration) bool {
	return float64(n)*float64(v) < float64(m)*float64(w)
}

// isPolicyList reports whether a RateLimit or RateLimit-Policy value is the
// current list-of-named-policies form rather than an older draft's.
func isPolicyList(s string) bool {
	m, _, ok := nextMember(s)
	return ok && m.key == "" && (m.kind == kindString || m.kind == kindToken)
}

// parseDraft reads the forms of the drafts before -08: separate
// RateLimit-Limit / -Remaining / -Reset fields (a Limit may carry its
// policies: "100, 100;w=60"), a RateLimit-Policy of bare quotas
// ("100;w=60"), and draft -07's single RateLimit dictionary
// ("limit=100, remaining=50, reset=5").
func parseDraft(header http.Header, ref time.Time, q *Hint) bool {
	found := false
	if raw, ok := first(header, headerDraftLimit); ok {
		if n, w, hasW, ok := parseLimitList(raw); ok {
			q.Limit, q.HasLimit, found = n, true, true
			q.Window, q.HasWindow = w, hasW
		} else {
			q.Invalid |= FieldLimit
		}
	}
	if raw, ok := first(header, headerRateLimitPolicy); ok && !isPolicyList(raw) {
		if n, w, hasW, ok := parseLimitList(raw); ok {
			if !q.HasLimit {
				q.Limit, q.HasLimit, found = n, true, true
			}
			if !q.HasWindow && hasW {
				q.Window, q.HasWindow, found = w, true, true
			}
		} else {
			q.Invalid |= FieldLimit
		}
	}
	if raw, ok := first(header, headerDraftRemaining); ok {
		if n, ok := parseCount(trimOWS(raw)); ok {
			q.Remaining, q.HasRemaining, found = n, true, true
		} else {
			q.Invalid |= FieldRemaining
		}
	}
	if raw, ok := first(header, headerDraftReset); ok {
		if d, ok := parseReset(trimOWS(raw), ref); ok {
			q.Reset, q.HasReset, found = d, true, true
		} else {
			q.Invalid |= FieldReset
		}
	}
	if raw, ok := first(header, headerRateLimit); ok && !isPolicyList(raw) {
		if parseDictionary(raw, ref, q) {
			found = true
		}
	}
	if found {
		q.Family = FamilyDraft
	}
	return found
}

// parseDictionary reads draft -07's "limit=100, remaining=50, reset=5". A
// field given separately (RateLimit-Limit and so on) takes precedence.
func parseDictionary(s string, ref time.Time, q *Hint) bool {
	found := false
	for s != "" {
		m, rest, ok := nextMember(s)
		if !ok || m.kind != kindNumber || m.frac != 0 {
			q.Invalid |= FieldRemaining
			return found
		}
		s = rest
		n := int(min(m.num, 1<<31-1))
		switch m.key {
		case "limit":
			if !q.HasLimit {
				q.Limit, q.HasLimit, found = n, true, true
			}
		case "remaining":
			if !q.HasRemaining {
				q.Remaining, q.HasRemaining, found = n, true, true
			}
		case "reset":
			if !q.HasReset {
				q.Reset, q.HasReset, found = resetFrom(m.num, ref), true, true
			}
		}
	}
	return found
}

// resetFrom applies parseReset's seconds-or-timestamp rule to an integer.
func resetFrom(n int64, ref time.Time) time.Duration {
	switch {
	case n >= unixMillisFloor:
		return floorSub(time.UnixMilli(n), ref)
	case n >= unixSecondsFloor:
		return floorSub(time.Unix(n, 0), ref)
	}
	return seconds(n, 0)
}

// parseLimitList reads a quota given as a list whose first member is the
// limit in force and whose others (if any) are policies: "100",
// "100;w=60", "10, 10;w=1, 50;w=60". The window is the first member's w,
// or else that of the first policy with the same quota.
func parseLimitList(s string) (n int, w time.Duration, hasW bool, ok bool) {
	m, rest, ok := nextMember(s)
	if !ok || m.key != "" || m.kind != kindNumber || m.frac != 0 || m.num > 1<<31-1 {
		return 0, 0, false, false
	}
	n = int(m.num)
	if w, ok := paramSeconds(m.params, "w"); ok && w > 0 {
		return n, w, true, true
	}
	for rest != "" {
		p, r, ok := nextMember(rest)
		if !ok {
			break
		}
		rest = r
		if p.kind == kindNumber && p.num == m.num {
			if w, ok := paramSeconds(p.params, "w"); ok && w > 0 {
				return n, w, true, true
			}
		}
	}
	return n, 0, false, true
}

// paramCount reads an integer parameter as a count.
func paramCount(params, name string) (int, bool) {
	v, ok := param(params, name)
	if !ok {
		return 0, false
	}
	return parseCount(v)
}

// paramSeconds reads a parameter given in seconds.
func paramSeconds(params, name string) (time.Duration, bool) {
	v, ok := param(params, name)
	if !ok {
		return 0, false
	}
	return parseSeconds(v)
}
