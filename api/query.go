package api

import (
	"encoding/base64"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
)

// Cursors are opaque to clients: the position (a run id, an item key, a
// sequence number) base64url-encoded, so that clients pass them back rather
// than build them.

func encodeCursor(pos string) string {
	if pos == "" {
		return ""
	}
	return base64.RawURLEncoding.EncodeToString([]byte(pos))
}

// cursorParam decodes ?cursor=; "" when absent.
func cursorParam(c echo.Context) (string, error) {
	raw := c.QueryParam("cursor")
	if raw == "" {
		return "", nil
	}
	b, err := base64.RawURLEncoding.DecodeString(raw)
	if err != nil || len(b) == 0 || len(b) > 512 {
		return "", invalid("cursor", "cursor is not one this API issued; pass next_cursor back unchanged.")
	}
	return string(b), nil
}

// limitParam reads ?limit=, 1 to MaxPageLimit, def when absent.
func limitParam(c echo.Context, def int) (int, error) {
	raw := c.QueryParam("limit")
	if raw == "" {
		return def, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > MaxPageLimit {
		return 0, invalid("limit", "limit must be an integer from 1 to %d.", MaxPageLimit)
	}
	return n, nil
}

// timeParam reads an RFC 3339 time or a date (YYYY-MM-DD, midnight UTC).
func timeParam(q url.Values, name string) (time.Time, error) {
	raw := q.Get(name)
	if raw == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, raw); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, raw); err == nil {
		return t, nil
	}
	return time.Time{}, invalid(name, "%s must be an RFC 3339 time or a YYYY-MM-DD date.", name)
}

// rangeParams reads ?from= and ?to= and checks from < to when both are set.
func rangeParams(q url.Values) (from, to time.Time, err error) {
	if from, err = timeParam(q, "from"); err != nil {
		return
	}
	if to, err = timeParam(q, "to"); err != nil {
		return
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		err = invalid("to", "to must be after from.")
	}
	return
}

// decodeRequest refuses a query string that does not decode (`?cursor=%zz`
// would otherwise read as no cursor at all), naming the parameter, and
// percent-decodes the path parameters exactly once: echo routes on the
// escaped path when there is one (an id or item key holding "/" arrives as
// %2F) and hands the parameters over as written, so every handler, and
// every validation of an id, sees the decoded value.
func decodeRequest(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		r := c.Request()
		// A proxied query goes upstream as the client wrote it: ';' is
		// the upstream's to read (redaction looks inside it as well).
		proxied := strings.HasPrefix(c.Path(), "/proxy/")
		if name, bad := badQueryParam(r.URL.RawQuery, proxied); bad {
			return invalid(name, "Query parameter %q is not percent-encoded correctly.", name)
		}
		if !proxied {
			// An empty value is no value: the contract refuses it, and
			// so does the server rather than read it as the default.
			for name, vs := range r.URL.Query() {
				if slices.Contains(vs, "") {
					return invalid(name, "Query parameter %q is empty; leave it out for its default.", name)
				}
			}
		}
		if r.URL.RawPath != "" {
			names, values := c.ParamNames(), c.ParamValues()
			decoded := make([]string, len(values))
			for i, v := range values {
				d, err := url.PathUnescape(v)
				if err != nil {
					name := ""
					if i < len(names) {
						name = names[i]
					}
					return invalid(name, "Path parameter %q is not percent-encoded correctly.", name)
				}
				decoded[i] = d
			}
			c.SetParamValues(decoded...)
		}
		if p := c.Path(); strings.HasPrefix(p, "/v1/runs/:id") || strings.HasPrefix(p, "/v1/fleet/runs/:id") {
			canonicalRunID(c)
		}
		return next(c)
	}
}

// canonicalRunID hands a run route's id over as CanonicalRunID has it.
func canonicalRunID(c echo.Context) {
	values := c.ParamValues()
	for i, name := range c.ParamNames() {
		if name != "id" || i >= len(values) {
			continue
		}
		if id := CanonicalRunID(values[i]); id != values[i] {
			values = slices.Clone(values)
			values[i] = id
			c.SetParamValues(values...)
		}
		return
	}
}

// CanonicalRunID is id in capitals when it is a ULID written in lower or
// mixed case (a ULID reads the same in either case, and runs are stored
// under its capitals); any other id as given.
func CanonicalRunID(id string) string {
	if up := strings.ToUpper(id); up != id && runIDPattern.MatchString(up) {
		return up
	}
	return id
}

// badQueryParam returns the first parameter of a raw query whose name or
// value does not decode, or, unless semicolons is set, that is separated
// by ';' (which url.ParseQuery refuses and URL.Query would silently drop).
func badQueryParam(raw string, semicolons bool) (string, bool) {
	if raw == "" {
		return "", false
	}
	if _, err := url.ParseQuery(raw); err == nil {
		return "", false
	}
	for _, pair := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(pair, "=")
		name, kerr := url.QueryUnescape(k)
		if kerr != nil {
			name = k
		}
		if _, verr := url.QueryUnescape(v); kerr != nil || verr != nil || !semicolons && strings.Contains(pair, ";") {
			if len(name) > 100 {
				name = name[:100]
			}
			return name, true
		}
	}
	return "", !semicolons // ParseQuery refused only the semicolons
}
