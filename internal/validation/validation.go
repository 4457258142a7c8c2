// Package validation is the one rule set auditd checks outside values
// with, request bodies and configuration files alike: a validator that
// names a field as its JSON name does (so an error's field is what the
// client or the file wrote), and the identifier rule the contract states,
// which the validator's printascii tag applies.
package validation

import (
	"reflect"
	"strings"

	"github.com/go-playground/validator/v10"
)

// New returns a validator that names fields by their JSON names and holds
// auditd's identifier rule under the printascii tag (ValidID).
func New() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			return ""
		} else if name == "" {
			return f.Name
		}
		return name
	})
	// printascii, the tag of every identifier (source ids, groups, item
	// keys, FAINs, token names), is stricter here than the validator's
	// own: no leading or trailing space either, so " county" cannot stand
	// beside "county". The tag is registered on a fresh validator, so it
	// cannot collide.
	_ = v.RegisterValidation("printascii", func(fl validator.FieldLevel) bool {
		return ValidID(fl.Field().String())
	})
	return v
}

// ValidID is the rule for identifiers the contract states: printable
// ASCII (space to tilde), without a leading or trailing space. "" passes:
// whether one is required is another rule.
func ValidID(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < ' ' || s[i] > '~' {
			return false
		}
	}
	return s == "" || s[0] != ' ' && s[len(s)-1] != ' '
}
