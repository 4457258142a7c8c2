package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fetch"
	"gopkg.in/yaml.v3"
)

// fileConfig is the YAML file `auditd serve --config FILE` reads at start:
// sources to declare. Sources changed later through the API persist in the
// data directory; the file is applied again at each start.
type fileConfig struct {
	Sources []auditd.Source `yaml:"sources"`
	// Upstream is the address policy of upstream connections, added to
	// the built-in denials (fetch.DeniedByDefault) and to the
	// --allow-upstream and --deny-upstream flags.
	Upstream upstreamPolicy `yaml:"upstream"`
}

// upstreamPolicy lists CIDR prefixes (or single addresses) upstream
// connections may and may not reach; the most specific rule decides
// (fetch.AddrPolicy).
type upstreamPolicy struct {
	Allow []string `yaml:"allow"`
	Deny  []string `yaml:"deny"`
}

// configError names the line and field of a bad configuration value.
type configError struct {
	Path  string
	Line  int
	Field string
	Msg   string
}

func (e *configError) Error() string {
	if e.Field != "" {
		return fmt.Sprintf("%s:%d: %s: %s", e.Path, e.Line, e.Field, e.Msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.Path, e.Line, e.Msg)
}

// loadConfig reads and checks a configuration file. validate checks one
// source and returns the name of the failing field with a message; it is
// the same validation the API applies. Nothing is applied when any source is
// bad: the error names the first bad line and field.
func loadConfig(path string, validate func(*auditd.Source) (field, msg string)) (*fileConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg fileConfig
	lines := sourceLines(&root)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if errors.As(err, &te) {
			return nil, fmt.Errorf("%s: %w", path, err) // names its lines already
		}
		// A value's own parser refused it (a duration, say): find its source.
		for i, n := range sourceNodes(&root) {
			var src auditd.Source
			if derr := n.Decode(&src); derr != nil {
				return nil, &configError{Path: path, Line: lines[i], Field: fmt.Sprintf("sources[%d]", i), Msg: auditd.ErrorMessage(derr)}
			}
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := fetch.NewPolicy(cfg.Upstream.Allow, cfg.Upstream.Deny); err != nil {
		return nil, fmt.Errorf("%s: upstream: %w", path, err)
	}
	seen := map[string]int{}
	for i := range cfg.Sources {
		line := 0
		if i < len(lines) {
			line = lines[i]
		}
		s := &cfg.Sources[i]
		if field, msg := validate(s); field != "" || msg != "" {
			return nil, &configError{Path: path, Line: line, Field: fmt.Sprintf("sources[%d].%s", i, field), Msg: msg}
		}
		if prev, dup := seen[s.ID]; dup {
			return nil, &configError{Path: path, Line: line, Field: fmt.Sprintf("sources[%d].id", i), Msg: fmt.Sprintf("duplicate id %q (first at line %d)", s.ID, prev)}
		}
		seen[s.ID] = line
	}
	return &cfg, nil
}

// sourceLines returns the line of each entry of the top-level sources list.
func sourceLines(root *yaml.Node) []int {
	var lines []int
	for _, n := range sourceNodes(root) {
		lines = append(lines, n.Line)
	}
	return lines
}

// sourceNodes returns the entries of the top-level sources list.
func sourceNodes(root *yaml.Node) []*yaml.Node {
	if len(root.Content) == 0 || root.Content[0].Kind != yaml.MappingNode {
		return nil
	}
	m := root.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "sources" {
			return m.Content[i+1].Content
		}
	}
	return nil
}
