package api

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/validation"
	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"
)

// listingPattern is an Assistance Listing number: two digits, a dot, three.
var listingPattern = regexp.MustCompile(`^[0-9]{2}\.[0-9]{3}$`)

// newValidator returns the validator for request bodies: package
// validation's (fields named by their JSON names, the identifier rule),
// with the API's own tags registered.
func newValidator() *validator.Validate {
	v := validation.New()
	// The tags are registered on a fresh validator, so they cannot collide.
	_ = v.RegisterValidation("listing", func(fl validator.FieldLevel) bool {
		return listingPattern.MatchString(fl.Field().String())
	})
	_ = v.RegisterValidation("itempath", func(fl validator.FieldLevel) bool {
		return auditd.ValidPath(fl.Field().String())
	})
	return v
}

// bind decodes the JSON body of c into v and validates v. Nothing else
// happens to a request whose body fails here.
func (s *Server) bind(c echo.Context, v any, limit int64) error {
	if err := s.decode(c, v, limit); err != nil {
		return err
	}
	if err := s.validate.Struct(v); err != nil {
		return validationError(err)
	}
	return nil
}

// decode reads the JSON body of c into v: at most limit bytes, one object,
// no unknown fields, nothing after it.
func (s *Server) decode(c echo.Context, v any, limit int64) error {
	r := c.Request()
	if mt, _, err := mime.ParseMediaType(r.Header.Get(echo.HeaderContentType)); err != nil || mt != echo.MIMEApplicationJSON {
		return &auditd.Error{Code: codeUnsupportedMedia, Message: "Content-Type must be application/json."}
	}
	body, err := io.ReadAll(http.MaxBytesReader(c.Response(), r.Body, limit))
	if err != nil {
		return decodeError(err)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var domainErr *auditd.Error
		if errors.As(err, &domainErr) && domainErr.Field == "" {
			// A value's own parser refused it (a duration); json does not
			// say which field it was: find it.
			var raw any
			if json.Unmarshal(body, &raw) == nil {
				if field := badText(raw, reflect.TypeOf(v)); field != "" {
					return invalid(field, "%s: %s", field, domainErr.Message)
				}
			}
		}
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("", "Unexpected data after the JSON object.")
	}
	// A field given as null is refused, as the contract refuses it, not
	// read as left out. A body without "null" in it has none.
	if bytes.Contains(body, []byte("null")) {
		var raw any
		if json.Unmarshal(body, &raw) == nil {
			if field := nullField(raw, ""); field != "" {
				return invalid(field, "%s is null; leave it out instead.", field)
			}
		}
	}
	// An integer the contract bounds below (minimum: 1) and the struct
	// reads as "not given" at zero (omitempty) is refused when it is
	// given: 0 is then a value, and out of bounds. Any other value below
	// the bound is not zero, and the validator refuses it; so a body
	// without a zero in it is not decoded a second time (that doubles the
	// cost of a 100,000-item run).
	if !explicitZero.Match(body) {
		return nil
	}
	var raw any
	d := json.NewDecoder(bytes.NewReader(body))
	d.UseNumber()
	if err := d.Decode(&raw); err != nil {
		return decodeError(err)
	}
	return explicitMinimums(raw, reflect.TypeOf(v))
}

// explicitZero matches a JSON value that is a zero number (0, -0, 0.0,
// 0e3), and more (the same inside a string): a body it does not match has
// no zero in it.
var explicitZero = regexp.MustCompile(`:\s*-?0(?:[\s,}\].eE]|$)`)

// explicitMinimums refuses, in raw, a decoded JSON body of type t, an
// integer field tagged omitempty and min=N whose value is present and below
// N.
func explicitMinimums(raw any, t reflect.Type) error {
	return walkBody(raw, t, nil, "", func(raw any, _ reflect.Type, f *reflect.StructField, path string) error {
		n, ok := raw.(json.Number)
		if !ok || f == nil || !isInt(f.Type.Kind()) {
			return nil
		}
		if min, ok := tagMin(f.Tag.Get("validate")); ok {
			if v, err := n.Int64(); err == nil && v < min {
				return invalid(path, "%s must be at least %d.", path, min)
			}
		}
		return nil
	})
}

// walkBody walks raw, a decoded JSON body, alongside t, the type it was
// decoded into, and calls visit with every value in it, the type it
// decodes into (pointers taken away), the struct field that names it (nil
// for the body and a list's elements) and its path ("items[2].limit"),
// until visit returns an error.
func walkBody(raw any, t reflect.Type, f *reflect.StructField, path string, visit func(raw any, t reflect.Type, f *reflect.StructField, path string) error) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if err := visit(raw, t, f, path); err != nil {
		return err
	}
	switch t.Kind() {
	case reflect.Slice:
		list, ok := raw.([]any)
		if !ok || t.Elem().Kind() == reflect.Uint8 {
			return nil
		}
		for i, el := range list {
			if err := walkBody(el, t.Elem(), nil, fmt.Sprintf("%s[%d]", path, i), visit); err != nil {
				return err
			}
		}
	case reflect.Struct:
		obj, ok := raw.(map[string]any)
		if !ok {
			return nil
		}
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Anonymous {
				if err := walkBody(raw, f.Type, nil, path, visit); err != nil {
					return err
				}
				continue
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			val, present := obj[name]
			if name == "" || name == "-" || !present {
				continue
			}
			field := name
			if path != "" {
				field = path + "." + name
			}
			if err := walkBody(val, f.Type, &f, field, visit); err != nil {
				return err
			}
		}
	}
	return nil
}

// nullField returns the path of the first null inside raw, a decoded
// JSON body ("" when there is none; a body that is null itself is left
// to the validation of what it lacks).
func nullField(raw any, path string) string {
	switch v := raw.(type) {
	case []any:
		for i, el := range v {
			p := fmt.Sprintf("%s[%d]", path, i)
			if el == nil {
				return p
			}
			if f := nullField(el, p); f != "" {
				return f
			}
		}
	case map[string]any:
		for _, k := range slices.Sorted(maps.Keys(v)) {
			p := k
			if path != "" {
				p = path + "." + k
			}
			if v[k] == nil {
				return p
			}
			if f := nullField(v[k], p); f != "" {
				return f
			}
		}
	}
	return ""
}

func isInt(k reflect.Kind) bool {
	return k >= reflect.Int && k <= reflect.Int64
}

// tagMin returns N of a validate tag that has omitempty and min=N.
func tagMin(tag string) (int64, bool) {
	rules := strings.Split(tag, ",")
	if !slices.Contains(rules, "omitempty") {
		return 0, false
	}
	for _, r := range rules {
		if v, ok := strings.CutPrefix(r, "min="); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// badText returns the path of the first string in raw, a decoded JSON
// body of type t, that the field it decodes into, an
// encoding.TextUnmarshaler, refuses; "" when none.
func badText(raw any, t reflect.Type) string {
	var bad badTextAt
	errors.As(walkBody(raw, t, nil, "", func(raw any, t reflect.Type, _ *reflect.StructField, path string) error {
		str, ok := raw.(string)
		if !ok {
			return nil
		}
		if u, ok := reflect.New(t).Interface().(encoding.TextUnmarshaler); ok && u.UnmarshalText([]byte(str)) != nil {
			return badTextAt(path)
		}
		return nil
	}), &bad)
	return string(bad)
}

// badTextAt stops badText's walk at the path of a refused string.
type badTextAt string

func (p badTextAt) Error() string { return "bad text at " + string(p) }
