package web_test

import (
	"testing"

	"github.com/auditd/auditd/web/webtest"
)

// TestRawValues: what the page scan calls raw, and what it lets pass.
func TestRawValues(t *testing.T) {
	for _, raw := range []string{"ceiling window 1m0s", "age 21.006751691s", "cooldown 1h0m0s", "advertised -1", "limit: -1",
		"at 1764441598123456789", "taught at 2026-11-29 18:39:58.123456789Z", "0001-01-01 00:00:00", "award year 2,026", "Award year\n2,024"} {
		if webtest.RawValues(raw) == nil {
			t.Errorf("%q passes as plain", raw)
		}
	}
	for _, plain := range []string{"cooldown 1m 30s", "age 21s", "2m", "difference \u22121", "award year 2026", "11,251 events",
		"2026-11-29 18:39:58.123Z", "seq 10,231", "bytes 2,048", "0.33 per second", "R1\u2013R10"} {
		if got := webtest.RawValues(plain); got != nil {
			t.Errorf("%q called raw: %v", plain, got)
		}
	}
}
