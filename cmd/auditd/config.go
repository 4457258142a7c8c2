package main

import (
	"bytes"
	"encoding"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
	"time"

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
	// Fleet joins the node to a fleet sharing each source's budget through
	// etcd (docs/FLEET.md); the --fleet-etcd and --node flags win over it.
	Fleet fleetOptions `yaml:"fleet"`
	// Runs holds the defaults of runs (runs.open_idle_timeout).
	Runs runDefaults `yaml:"runs"`
}

// runDefaults are what a run gets when its submit does not say.
type runDefaults struct {
	// OpenIdleTimeout finishes an open batch run that takes no page for
	// this long (a Go duration; default fetch.DefaultOpenIdleTimeout, 1h).
	OpenIdleTimeout auditd.Duration `yaml:"open_idle_timeout"`
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
	// The shape is checked against the types first, so that a mistake is
	// told in the file's words (its line, the field as written, what a
	// value should look like), not in yaml's (Go type names).
	if err := checkShape(path, &root, reflect.TypeFor[fileConfig](), ""); err != nil {
		return nil, err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var cfg fileConfig
	lines := sourceLines(&root)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if _, err := fetch.NewPolicy(cfg.Upstream.Allow, cfg.Upstream.Deny); err != nil {
		return nil, fmt.Errorf("%s: upstream: %w", path, err)
	}
	if cfg.Runs.OpenIdleTimeout < 0 {
		return nil, fmt.Errorf("%s: runs.open_idle_timeout: %v is negative", path, cfg.Runs.OpenIdleTimeout.D())
	}
	nodes := sourceNodes(&root)
	seen := map[string]int{}
	for i := range cfg.Sources {
		line := 0
		if i < len(lines) {
			line = lines[i]
		}
		// fieldLine is the line of a field of the source when it is
		// written, the source's first line otherwise.
		fieldLine := func(field string) int {
			if i < len(nodes) {
				name, _, _ := strings.Cut(field, ".")
				name, _, _ = strings.Cut(name, "[")
				if n := nodes[i]; n.Kind == yaml.MappingNode {
					for j := 0; j+1 < len(n.Content); j += 2 {
						if n.Content[j].Value == name {
							return n.Content[j].Line
						}
					}
				}
			}
			return line
		}
		s := &cfg.Sources[i]
		if field, msg := validate(s); field != "" || msg != "" {
			return nil, &configError{Path: path, Line: fieldLine(field), Field: fmt.Sprintf("sources[%d].%s", i, field), Msg: msg}
		}
		if prev, dup := seen[s.ID]; dup {
			return nil, &configError{Path: path, Line: fieldLine("id"), Field: fmt.Sprintf("sources[%d].id", i), Msg: fmt.Sprintf("duplicate id %q (first at line %d)", s.ID, prev)}
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

var (
	durationType    = reflect.TypeFor[auditd.Duration]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// checkShape checks that node n can be decoded into a value of type t,
// field being where n is in the file ("sources[0].window"; "" at the top).
// It returns a *configError naming the line and field, and what was
// expected in plain words, for the first thing that cannot.
func checkShape(path string, n *yaml.Node, t reflect.Type, field string) error {
	bad := func(line int, msg string, args ...any) error {
		return &configError{Path: path, Line: line, Field: field, Msg: fmt.Sprintf(msg, args...)}
	}
	switch {
	case n.Kind == yaml.DocumentNode:
		for _, c := range n.Content {
			if err := checkShape(path, c, t, field); err != nil {
				return err
			}
		}
		return nil
	case n.Kind == yaml.AliasNode || n.Tag == "!!null":
		return nil // an alias is checked where it is defined; null is left out
	case reflect.PointerTo(t).Implements(textUnmarshaler):
		if n.Kind != yaml.ScalarNode {
			return bad(n.Line, "must be a single value, not %s", kindWords(n))
		}
		if t == durationType {
			d, err := time.ParseDuration(n.Value)
			switch {
			case err != nil:
				return bad(n.Line, "%q is not a duration: write a number and a unit, such as 30s, 1m or 1h30m", n.Value)
			case d < 0:
				return bad(n.Line, "%q is negative: a duration is 0 or more, such as 30s", n.Value)
			}
			return nil
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			return bad(n.Line, "%s", auditd.ErrorMessage(err))
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return bad(n.Line, "must be fields written as name: value, one a line, not %s", kindWords(n))
		}
		fields, names := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if k.Value == "<<" { // a merge key: the decoder checks what it merges
				continue
			}
			ft, ok := fields[k.Value]
			if !ok {
				if near := closest(k.Value, names); near != "" {
					return bad(k.Line, "unknown field %q: did you mean %q?", k.Value, near)
				}
				return bad(k.Line, "unknown field %q: the fields here are %s", k.Value, strings.Join(names, ", "))
			}
			if err := checkShape(path, v, ft, joinField(field, k.Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return bad(n.Line, "must be a list, each entry on its own line starting with \"- \", not %s", kindWords(n))
		}
		for i, c := range n.Content {
			if err := checkShape(path, c, t.Elem(), fmt.Sprintf("%s[%d]", field, i)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return bad(n.Line, "must be entries written as name: value, one a line, not %s", kindWords(n))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkShape(path, n.Content[i+1], t.Elem(), fmt.Sprintf("%s[%s]", field, n.Content[i].Value)); err != nil {
				return err
			}
		}
	default:
		if n.Kind != yaml.ScalarNode {
			return bad(n.Line, "must be a single value, not %s", kindWords(n))
		}
		if err := n.Decode(reflect.New(t).Interface()); err != nil {
			switch t.Kind() {
			case reflect.Int, reflect.Int64, reflect.Int32, reflect.Uint, reflect.Uint64, reflect.Uint32:
				return bad(n.Line, "%q is not a whole number (such as 10)", n.Value)
			case reflect.Bool:
				return bad(n.Line, "%q is not true or false", n.Value)
			}
			return bad(n.Line, "%q is not a valid value here", n.Value)
		}
	}
	return nil
}

// yamlFields returns the fields of struct type t by their YAML names, and
// the names in declaration order.
func yamlFields(t reflect.Type) (map[string]reflect.Type, []string) {
	fields := map[string]reflect.Type{}
	var names []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	return fields, names
}

func joinField(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}

// kindWords says what a YAML node is, for a message.
func kindWords(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "name: value lines"
	case yaml.SequenceNode:
		return "a list"
	}
	return fmt.Sprintf("the value %q", n.Value)
}

// closest returns the name within two edits of s (the nearest; the first
// of equals), or "" when none is.
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if d := editDistance(strings.ToLower(s), n); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b, in bytes.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
