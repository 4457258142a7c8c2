package validation_test

import (
	"strings"
	"testing"

	"github.com/auditd/auditd/internal/validation"
)

func TestValidID(t *testing.T) {
	for s, want := range map[string]bool{
		"":          true,
		"county":    true,
		"a b":       true,
		" county":   false,
		"county ":   false,
		"caf\u00e9": false,
		"tab\there": false,
	} {
		if got := validation.ValidID(s); got != want {
			t.Errorf("ValidID(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestNewNamesFieldsByJSONAndChecksIdentifiers(t *testing.T) {
	type body struct {
		SourceID string `json:"source_id" validate:"required,printascii"`
		Plain    string `validate:"max=1"`
	}
	v := validation.New()
	for _, tc := range []struct {
		in        body
		wantField string
	}{
		{body{SourceID: " padded"}, "source_id"},
		{body{SourceID: "ok", Plain: "too long"}, "Plain"},
	} {
		err := v.Struct(tc.in)
		if err == nil {
			t.Fatalf("%+v: no error", tc.in)
		}
		if got := err.Error(); !strings.Contains(got, "'"+tc.wantField+"'") {
			t.Errorf("%+v: error %q does not name field %q", tc.in, got, tc.wantField)
		}
	}
	if err := v.Struct(body{SourceID: "ok"}); err != nil {
		t.Errorf("valid body refused: %v", err)
	}
}
