package api

import (
	"encoding/base64"
	"net/url"
	"strconv"
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
