package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// The batch-upload seed's source configured in a file: the knobs read as
// written and give the limiter the seed's pacing (a bucket of 200 under a
// window of 120 a second, refilled at 50 a second).
func TestConfigSeedPacing(t *testing.T) {
	yaml := `sources:
  - id: mro-gateway
    base_url: https://mro.example
    limit: 120     # records in any second
    window: 1s
    rate: 50       # records a second, sustained
    burst: 200     # records back to back
    count: records # the gateway's own limits count records
`
	path := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(path, validateSource)
	if err != nil {
		t.Fatal(err)
	}
	src := cfg.Sources[0]
	if src.Limit != 120 || src.Window.D() != time.Second || src.Rate != 50 || src.Burst != 200 || src.Count != auditd.CountRecords {
		t.Fatalf("parsed %+v", src)
	}
	lc := limiter.ConfigFromSource(src)
	if lc.CountRequests {
		t.Fatal("count: records read as requests")
	}
	c := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	b, err := limiter.NewBudget(c, limiter.BudgetConfig{Limit: lc.Limit, Window: lc.Window, Rate: lc.Rate, Burst: lc.Burst})
	if err != nil {
		t.Fatal(err)
	}
	if b.Tokens() != 200 || b.MaxCost() != 120 {
		t.Fatalf("tokens %v, max cost %d; want 200 and 120", b.Tokens(), b.MaxCost())
	}
}

func TestConfigCostKnobsErrors(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"RateNotNumber", "sources:\n  - id: a\n    base_url: http://x\n    rate: fast\n", `:4: sources[0].rate: "fast" is not a valid value here`},
		{"RateZero", "sources:\n  - id: a\n    base_url: http://x\n    rate: -2\n", `sources[0].rate: rate must be more than 0.`},
		{"CountUnknown", "sources:\n  - id: a\n    base_url: http://x\n    count: bytes\n", `sources[0].count: count must be one of requests, records.`},
		{"RateInGroup", "sources:\n  - id: a\n    base_url: http://x\n    group: gw\n    rate: 5\n", `sources[0].rate: rate paces a source's own budget`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(tc.yaml), 0o600)
			_, err := loadConfig(path, validateSource)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want it to say %q", err, tc.want)
			}
		})
	}
}
