package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/registry"
)

func TestConfigExampleLoads(t *testing.T) {
	cfg, err := loadConfig("../../testdata/config/sources.example.yaml", validateSource)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Sources) != 2 || cfg.Sources[0].Window.D() != time.Minute || cfg.Sources[0].Breaker.Cooldown.D() != 2*time.Minute {
		t.Fatalf("parsed %+v", cfg.Sources)
	}
}

func TestConfigErrorsNameLineAndField(t *testing.T) {
	validate := validateSource
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"UnknownField", "sources:\n  - id: a\n    base_url: http://x\n    limitt: 5\n", "line 4"},
		{"BadDuration", "sources:\n  - id: a\n    base_url: http://x\n  - id: b\n    base_url: http://x\n    window: soon\n", `:4: sources[1]: invalid duration "soon"`},
		{"BadURL", "sources:\n  - id: a\n    base_url: http://x\n    limit: 5\n  - id: b\n    base_url: not a url\n", ":5: sources[1].base_url"},
		{"LimitTooHigh", "sources:\n  - id: a\n    base_url: http://x\n    limit: 99999999\n", ":2: sources[0].limit"},
		{"WindowOverLimiterMax", "sources:\n  - id: a\n    base_url: http://x\n    limit: 1\n    window: 200000h\n", ":2: sources[0].window"},
		{"IDTrailingSpace", "sources:\n  - id: \"a \"\n    base_url: http://x\n", ":2: sources[0].id"},
		{"Duplicate", "sources:\n  - id: a\n    base_url: http://x\n  - id: a\n    base_url: http://y\n", "duplicate id \"a\" (first at line 2)"},
		{"NotYAML", "sources: [\n", "config.yaml"},
		{"BaseURLCredentials", "sources:\n  - id: a\n    base_url: http://u:pw@x\n", ":2: sources[0].base_url: base_url must not carry credentials; put them in headers"},
		{"HeaderCRLF", "sources:\n  - id: a\n    base_url: http://x\n    headers: {X-A: \"a\\r\\nb\"}\n", "sources[0].headers[X-A]"},
		{"UpstreamBadCIDR", "upstream: {deny: [10.0.0.0/33]}\nsources:\n  - id: a\n    base_url: http://x\n", `upstream: deny "10.0.0.0/33"`},
		{"UpstreamUnknownKey", "upstream: {block: [10.0.0.0/8]}\n", "block"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(tc.yaml), 0o600)
			_, err := loadConfig(path, validate)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want it to say %q", err, tc.want)
			}
		})
	}
}

// FuzzLoadConfig: whatever the file holds, loading it returns sources or an
// error, never a panic, and an accepted source passed validation.
func FuzzLoadConfig(f *testing.F) {
	ex, _ := os.ReadFile("../../testdata/config/sources.example.yaml")
	f.Add(ex)
	f.Add([]byte("sources:\n  - id: a\n    base_url: http://x\n    window: soon\n"))
	f.Add([]byte("sources: [\n"))
	path := filepath.Join(f.TempDir(), "config.yaml")
	f.Fuzz(func(t *testing.T, data []byte) {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := loadConfig(path, validateSource)
		if err != nil {
			return
		}
		for i := range cfg.Sources {
			if err := registry.CheckSource(cfg.Sources[i]); err != nil {
				t.Fatalf("accepted a source validation refuses: %v", err)
			}
		}
	})
}
