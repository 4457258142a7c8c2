package api

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"reflect"
	"regexp"
	"strings"

	"github.com/auditd/auditd"
	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"
)

// listingPattern is an Assistance Listing number: two digits, a dot, three.
var listingPattern = regexp.MustCompile(`^[0-9]{2}\.[0-9]{3}$`)

// newValidator returns the validator for request bodies: fields are named by
// their JSON names, and auditd's own tags are registered.
func newValidator() *validator.Validate {
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
	// The tag is registered on a fresh validator, so it cannot collide.
	_ = v.RegisterValidation("listing", func(fl validator.FieldLevel) bool {
		return listingPattern.MatchString(fl.Field().String())
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
	dec := json.NewDecoder(http.MaxBytesReader(c.Response(), r.Body, limit))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return decodeError(err)
		}
		return invalid("", "Unexpected data after the JSON object.")
	}
	return nil
}
