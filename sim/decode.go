package sim

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrInvalidScenario is wrapped by every *ScenarioError, so callers can test
// for a rejected scenario with errors.Is without caring which field failed.
var ErrInvalidScenario = errors.New("invalid scenario")

// ScenarioError names where a scenario file is wrong: the line (0 when the
// scenario was built in Go rather than parsed), the field path
// (upstreams[2].limit.requests) and what is wrong with it.
type ScenarioError struct {
	Line  int
	Field string
	Msg   string
}

// Error implements the error interface.
func (e *ScenarioError) Error() string {
	var b strings.Builder
	b.WriteString("scenario: ")
	if e.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", e.Line)
	}
	if e.Field != "" {
		b.WriteString(e.Field + ": ")
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Unwrap lets errors.Is(err, ErrInvalidScenario) hold.
func (e *ScenarioError) Unwrap() error { return ErrInvalidScenario }

var durationType = reflect.TypeFor[time.Duration]()

// decoder fills Go values from a yaml.Node tree. yaml.v3's own strict mode
// (Decoder.KnownFields) reports unknown keys but not which field a bad value
// belongs to, and custom unmarshalers lose strictness, so the simulator walks
// the tree itself. It records the line of every field path it visits so that
// validation, which runs on the decoded values, can still name the line.
type decoder struct {
	lines map[string]int
}

func (d *decoder) fail(n *yaml.Node, path, format string, args ...any) error {
	return &ScenarioError{Line: n.Line, Field: path, Msg: fmt.Sprintf(format, args...)}
}

// decode fills v (addressable) from n.
func (d *decoder) decode(n *yaml.Node, path string, v reflect.Value) error {
	if _, ok := d.lines[path]; !ok {
		d.lines[path] = n.Line
	}
	// Aliases are refused outright: following them naively lets a small file
	// expand exponentially ("billion laughs"), and scenarios never need them.
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		return d.fail(n, path, "anchors and aliases are not supported")
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return nil // an empty value leaves the field at its zero value
	}
	switch {
	case v.Type() == durationType:
		return d.scalar(n, path, v)
	case v.Kind() == reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		if err := d.decode(n, path, p.Elem()); err != nil {
			return err
		}
		v.Set(p)
		return nil
	case v.Kind() == reflect.Struct:
		return d.mapping(n, path, v)
	case v.Kind() == reflect.Slice:
		return d.sequence(n, path, v)
	default:
		return d.scalar(n, path, v)
	}
}

func (d *decoder) mapping(n *yaml.Node, path string, v reflect.Value) error {
	if n.Kind != yaml.MappingNode {
		return d.fail(n, path, "want a mapping of fields")
	}
	fields := yamlFields(v.Type())
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode {
			return d.fail(k, path, "want a field name")
		}
		fp := k.Value
		if path != "" {
			fp = path + "." + k.Value
		}
		idx, ok := fields[k.Value]
		if !ok {
			return d.fail(k, fp, "unknown field")
		}
		if seen[k.Value] {
			return d.fail(k, fp, "field given twice")
		}
		seen[k.Value] = true
		d.lines[fp] = k.Line
		if err := d.decode(val, fp, v.Field(idx)); err != nil {
			return err
		}
	}
	return nil
}

func (d *decoder) sequence(n *yaml.Node, path string, v reflect.Value) error {
	if n.Kind != yaml.SequenceNode {
		return d.fail(n, path, "want a list")
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, item := range n.Content {
		if err := d.decode(item, fmt.Sprintf("%s[%d]", path, i), s.Index(i)); err != nil {
			return err
		}
	}
	v.Set(s)
	return nil
}

func (d *decoder) scalar(n *yaml.Node, path string, v reflect.Value) error {
	if n.Kind != yaml.ScalarNode {
		return d.fail(n, path, "want %s", describe(v.Type()))
	}
	// Strings are taken verbatim, whatever YAML resolves them to, so that
	// an enum such as `status: none` or a header value `007` reads as written.
	if v.Kind() == reflect.String {
		v.SetString(n.Value)
		return nil
	}
	if err := n.Decode(v.Addr().Interface()); err != nil {
		return d.fail(n, path, "cannot use %s as %s", strconv.Quote(n.Value), describe(v.Type()))
	}
	return nil
}

// describe names a Go type the way a scenario author thinks of it.
func describe(t reflect.Type) string {
	switch {
	case t == durationType:
		return "a duration such as 30s"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		return "a number"
	case t.Kind() == reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

// yamlFields maps the yaml key of each field of struct type t to its index.
func yamlFields(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "-" || name == "" {
			continue
		}
		m[name] = i
	}
	return m
}
