package main

import (
	"os"
	"path/filepath"
	"reflect"
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
		{"UnknownField", "sources:\n  - id: a\n    base_url: http://x\n    limitt: 5\n", `:4: sources[0]: unknown field "limitt": did you mean "limit"?`},
		{"BadDuration", "sources:\n  - id: a\n    base_url: http://x\n  - id: b\n    base_url: http://x\n    window: soon\n", `:6: sources[1].window: "soon" is not a duration: write a number and a unit, such as 30s, 1m or 1h30m`},
		{"BadURL", "sources:\n  - id: a\n    base_url: http://x\n    limit: 5\n  - id: b\n    base_url: not a url\n", `:6: sources[1].base_url: "not a url" is not a URL`},
		{"LimitTooHigh", "sources:\n  - id: a\n    base_url: http://x\n    limit: 99999999\n", ":4: sources[0].limit"},
		{"WindowOverLimiterMax", "sources:\n  - id: a\n    base_url: http://x\n    limit: 1\n    window: 200000h\n", ":5: sources[0].window"},
		{"IDTrailingSpace", "sources:\n  - id: \"a \"\n    base_url: http://x\n", ":2: sources[0].id"},
		{"Duplicate", "sources:\n  - id: a\n    base_url: http://x\n  - id: a\n    base_url: http://y\n", "duplicate id \"a\" (first at line 2)"},
		{"NotYAML", "sources: [\n", "config.yaml"},
		{"BaseURLCredentials", "sources:\n  - id: a\n    base_url: http://u:pw@x\n", ":3: sources[0].base_url: base_url must not carry credentials; put them in headers"},
		{"HeaderCRLF", "sources:\n  - id: a\n    base_url: http://x\n    headers: {X-A: \"a\\r\\nb\"}\n", "sources[0].headers[X-A]"},
		{"UpstreamBadCIDR", "upstream: {deny: [10.0.0.0/33]}\nsources:\n  - id: a\n    base_url: http://x\n", `upstream: deny "10.0.0.0/33"`},
		{"UpstreamUnknownKey", "upstream: {block: [10.0.0.0/8]}\n", `:1: upstream: unknown field "block": the fields here are allow, deny`},
		{"OpenIdleTimeoutNegative", "runs:\n  open_idle_timeout: -1m\n", "runs.open_idle_timeout"},
		{"OpenIdleTimeoutInWords", "runs:\n  open_idle_timeout: an hour\n", `:2: runs.open_idle_timeout: "an hour" is not a duration`},
		// Mistakes told in the file's words: the line, the field as
		// written, a suggestion; never a Go type.
		{"UnknownTopLevel", "sourcs:\n  - id: a\n", `:1: unknown field "sourcs": did you mean "sources"?`},
		{"UnknownNested", "sources:\n  - id: a\n    base_url: http://x\n    breaker: {threshhold: 3}\n", `:4: sources[0].breaker: unknown field "threshhold": did you mean "threshold"?`},
		{"UnknownFar", "sources:\n  - id: a\n    base_url: http://x\n    proxy: {timeout: 1s}\n", `:4: sources[0].proxy: unknown field "timeout": the fields here are deadline, serve_stale, retry_post`},
		{"WindowInWords", "sources:\n  - id: a\n    base_url: http://x\n    limit: 30\n    window: 1 minute\n", `:5: sources[0].window: "1 minute" is not a duration: write a number and a unit, such as 30s, 1m or 1h30m`},
		{"WindowNegative", "sources:\n  - id: a\n    base_url: http://x\n    window: -1m\n", `:4: sources[0].window: "-1m" is negative`},
		{"CooldownInWords", "sources:\n  - id: a\n    base_url: http://x\n    breaker:\n      cooldown: 2 minutes\n", `:5: sources[0].breaker.cooldown: "2 minutes" is not a duration`},
		{"LimitNotNumber", "sources:\n  - id: a\n    base_url: http://x\n    limit: five\n", `:4: sources[0].limit: "five" is not a whole number (such as 10)`},
		{"SourcesNotList", "sources:\n  id: a\n", `:2: sources: must be a list, each entry on its own line starting with "- "`},
		{"BaseURLNoScheme", "sources:\n  - id: a\n    base_url: gis.example.gov/arcgis\n", `:3: sources[0].base_url: "gis.example.gov/arcgis" has no scheme: write it with http:// or https:// in front, such as https://gis.example.gov/arcgis`},
		{"BaseURLOtherScheme", "sources:\n  - id: a\n    base_url: ftp://gis.example.gov\n", `:3: sources[0].base_url: "ftp://gis.example.gov" has the scheme ftp; a source is reached over http:// or https://`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			os.WriteFile(path, []byte(tc.yaml), 0o600)
			_, err := loadConfig(path, validate)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want it to say %q", err, tc.want)
			}
			for _, goName := range []string{"auditd.", "main.", "!!", "unmarshal", "fails \"url\""} {
				if strings.Contains(err.Error(), goName) {
					t.Errorf("the message shows %q: %v", goName, err)
				}
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

func TestConfigFleet(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	yaml := "fleet:\n  etcd: [http://10.0.0.1:2379, http://10.0.0.2:2379]\n  node: east-1\n  lag: 60ms\nsources:\n  - id: a\n    base_url: http://x\n"
	if err := os.WriteFile(p, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(p, validateSource)
	if err != nil {
		t.Fatal(err)
	}
	want := fleetOptions{Etcd: []string{"http://10.0.0.1:2379", "http://10.0.0.2:2379"}, Node: "east-1", Lag: 60 * time.Millisecond}
	if !reflect.DeepEqual(cfg.Fleet, want) {
		t.Fatalf("fleet = %+v, want %+v", cfg.Fleet, want)
	}
}

func TestConfigOpenIdleTimeout(t *testing.T) {
	p := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(p, []byte("runs:\n  open_idle_timeout: 90m\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := loadConfig(p, validateSource)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Runs.OpenIdleTimeout.D(); got != 90*time.Minute {
		t.Fatalf("runs.open_idle_timeout = %v, want 1h30m", got)
	}
}
