package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"
)

// Error codes the HTTP layer adds to auditd's. They describe the request's
// envelope, not the domain, so they live here rather than in error.go.
const (
	codeTooLarge         = auditd.ETOOLARGE
	codeUnsupportedMedia = "unsupported_media_type"
	codeMethodNotAllowed = "method_not_allowed"
	// codeNotInFleet: a fleet route on a node not in a fleet (fleet.go).
	codeNotInFleet = "not_in_fleet"
)

// ProblemTypeBase prefixes every problem type URI; the code follows it.
const ProblemTypeBase = "urn:auditd:problem:"

// codeStatuses pairs every error code with its HTTP status: the only place
// that does. status reads it one way, echoCode the other.
var codeStatuses = []struct {
	code   string
	status int
}{
	{auditd.EINVALID, http.StatusBadRequest},
	{auditd.EUNAUTHORIZED, http.StatusUnauthorized},
	{auditd.EFORBIDDEN, http.StatusForbidden},
	{auditd.ENOTFOUND, http.StatusNotFound},
	{codeNotInFleet, http.StatusNotFound},
	{codeMethodNotAllowed, http.StatusMethodNotAllowed},
	{auditd.ECONFLICT, http.StatusConflict},
	{codeTooLarge, http.StatusRequestEntityTooLarge},
	{codeUnsupportedMedia, http.StatusUnsupportedMediaType},
	{auditd.ETOOMANY, http.StatusTooManyRequests},
	{auditd.EUNAVAILABLE, http.StatusServiceUnavailable},
	{auditd.EUPSTREAM, http.StatusBadGateway},
}

// status is the HTTP status of an error code. An unknown code is a 500.
func status(code string) int {
	for _, cs := range codeStatuses {
		if cs.code == code {
			return cs.status
		}
	}
	return http.StatusInternalServerError
}

// Problem is an RFC 9457 problem detail, as every error response carries it.
type Problem struct {
	Type      string `json:"type"`
	Title     string `json:"title"`
	Status    int    `json:"status"`
	Detail    string `json:"detail,omitempty"`
	Instance  string `json:"instance,omitempty"`
	Code      string `json:"code"`
	Field     string `json:"field,omitempty"`
	RequestID string `json:"request_id"`
}

// handleError is echo's HTTPErrorHandler: it turns any error a handler or
// middleware returned into a problem, and logs the ones that are the
// server's fault, once, with the request id the client sees.
func (s *Server) handleError(err error, c echo.Context) {
	reqID := requestID(c)
	if c.Response().Committed {
		// Too late for a problem: the body is half sent.
		s.Logger.Error("response failed after it started", "request_id", reqID, "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
		return
	}
	code, msg, field := auditd.ErrorCode(err), auditd.ErrorMessage(err), ""
	var de *auditd.Error
	var he *echo.HTTPError
	switch {
	case errors.As(err, &de):
		field = de.Field
	case errors.As(err, &he):
		code, msg = echoCode(he.Code), http.StatusText(he.Code)
		switch allow := c.Response().Header().Get(echo.HeaderAllow); {
		case (he.Code == http.StatusNotFound || he.Code == http.StatusMethodNotAllowed) && proxyNoPath.MatchString(c.Request().URL.Path):
			// /proxy/{source} alone: no route, whatever the method.
			c.Response().Header().Del(echo.HeaderAllow)
			code, msg = auditd.ENOTFOUND, fmt.Sprintf("A proxied request names a path after its source: %s/ is the source's base URL, and what follows it is sent on unchanged.", c.Request().URL.Path)
		case he.Code == http.StatusMethodNotAllowed && allow != "":
			msg = methodNotAllowed(c.Request().URL.Path, allow, c.Request().Method)
		}
	}
	st := status(code)
	if st >= 500 && code != auditd.EUNAVAILABLE && code != auditd.EUPSTREAM {
		s.Logger.Error("internal error", "request_id", reqID, "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
		code, msg = auditd.EINTERNAL, fmt.Sprintf("Internal error; quote request id %s when reporting it.", reqID)
	}
	p := Problem{
		Type:      ProblemTypeBase + code,
		Title:     http.StatusText(st),
		Status:    st,
		Detail:    msg,
		Instance:  c.Request().URL.Path,
		Code:      code,
		Field:     field,
		RequestID: reqID,
	}
	// A download may have set its own headers before it failed.
	h := c.Response().Header()
	// Work refused for now (a busy export slot) says when to come back.
	var busy interface{ RetryAfter() time.Duration }
	if (st == http.StatusTooManyRequests || st == http.StatusServiceUnavailable) && errors.As(err, &busy) {
		h.Set("Retry-After", strconv.FormatInt(max(1, int64(math.Ceil(busy.RetryAfter().Seconds()))), 10))
	}
	h.Del(echo.HeaderContentDisposition)
	h.Set(echo.HeaderContentType, "application/problem+json")
	if strings.HasPrefix(c.Request().URL.Path, "/proxy/") {
		// On the proxy route a client must tell auditd's answers from
		// the upstream's, whatever their status.
		h.Set(ProxyAnswerHeader, ProxyAnswerAuditd)
	}
	if c.Request().Method == http.MethodHead {
		err = c.NoContent(st)
	} else {
		var b []byte
		b, err = json.Marshal(p)
		if err == nil {
			err = c.Blob(st, "application/problem+json", b)
		}
	}
	if err != nil {
		s.Logger.Error("write problem", "request_id", reqID, "err", err)
	}
}

// proxyNoPath is /proxy/{source} with nothing after it.
var proxyNoPath = regexp.MustCompile(`^/proxy/[^/]+$`)

// methodNotAllowed says which methods path takes (allow, as the Allow
// header has them), and that method is not one.
func methodNotAllowed(path, allow, method string) string {
	return fmt.Sprintf("%s takes %s, not %s.", path, allow, method)
}

// echoCode names the code for an error echo itself raised (no route, wrong
// method, a body-limit from its middleware).
func echoCode(st int) string {
	for _, cs := range codeStatuses {
		if cs.status == st {
			return cs.code
		}
	}
	if st >= 400 && st < 500 {
		return auditd.EINVALID
	}
	return auditd.EINTERNAL
}

// invalid returns an EINVALID error naming field.
func invalid(field, format string, args ...any) error {
	return &auditd.Error{Code: auditd.EINVALID, Field: field, Message: fmt.Sprintf(format, args...)}
}

// tooMany sets Retry-After to wait, rounded up to whole seconds so that a
// client that waits exactly that long is admitted, and returns ETOOMANY.
func tooMany(c echo.Context, wait time.Duration, why string) error {
	secs := int64(math.Ceil(wait.Seconds()))
	if secs < 1 {
		secs = 1
	}
	c.Response().Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	return auditd.Errorf(auditd.ETOOMANY, "%s; retry after %d s.", why, secs)
}

// decodeError turns what encoding/json or the body limit said about a body
// into a client error that names the field when there is one.
func decodeError(err error) error {
	var (
		maxErr    *http.MaxBytesError
		syntaxErr *json.SyntaxError
		typeErr   *json.UnmarshalTypeError
		timeErr   *time.ParseError
		domainErr *auditd.Error
	)
	switch {
	case errors.As(err, &maxErr):
		return &auditd.Error{Code: codeTooLarge, Message: fmt.Sprintf("Body larger than %d bytes.", maxErr.Limit)}
	case errors.Is(err, io.EOF):
		return invalid("", "Body is empty; a JSON object is required.")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return invalid("", "Malformed JSON: the body ends too early.")
	case errors.As(err, &syntaxErr):
		return invalid("", "Malformed JSON at byte %d.", syntaxErr.Offset)
	case errors.As(err, &typeErr):
		return invalid(typeErr.Field, "Wrong type: %s cannot hold a JSON %s.", jsonField(typeErr.Field), typeErr.Value)
	case errors.As(err, &timeErr):
		return invalid("", "Times must be RFC 3339 (2026-01-02T15:04:05Z).")
	case errors.As(err, &domainErr):
		return &auditd.Error{Code: auditd.EINVALID, Field: domainErr.Field, Message: domainErr.Message}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return invalid(name, "Unknown field %q.", name)
	}
	return invalid("", "Malformed JSON.")
}

func jsonField(f string) string {
	if f == "" {
		return "the body"
	}
	return f
}

// validationError turns the first validator failure into a client error
// naming the field by its JSON path ("items[3].path").
func validationError(err error) error {
	var ve validator.ValidationErrors
	if !errors.As(err, &ve) || len(ve) == 0 {
		return fmt.Errorf("validate: %w", err)
	}
	fe := ve[0]
	field := fe.Namespace()
	if i := strings.IndexByte(field, '.'); i >= 0 {
		field = field[i+1:]
	}
	var msg string
	switch fe.Tag() {
	case "required":
		msg = "is required"
	case "max":
		msg = "must be at most " + fe.Param() + sizeUnit(fe)
	case "min":
		msg = "must be at least " + fe.Param() + sizeUnit(fe)
	case "gt":
		msg = "must be more than " + fe.Param()
	case "len":
		msg = "must have length " + fe.Param()
	case "oneof":
		msg = "must be one of: " + fe.Param()
	case "listing":
		msg = "must be an Assistance Listing number, NN.NNN"
	case "startswith":
		msg = "must start with " + fe.Param()
	case "url":
		msg = "must be a URL"
	case "itempath":
		msg = "must start with / and hold no space, control character or fragment"
	case "excludesall":
		msg = "must not contain CR, LF or NUL"
	case "printascii":
		msg = "must be printable ASCII, without a leading or trailing space"
	case "alphanum":
		msg = "must be letters and digits"
	case "uppercase":
		msg = "must be upper case"
	default:
		msg = "fails the " + fe.Tag() + " rule"
	}
	return invalid(field, "%s %s.", field, msg)
}

func sizeUnit(fe validator.FieldError) string {
	switch fe.Kind().String() {
	case "string":
		return " characters"
	case "slice", "map":
		return " entries"
	}
	return ""
}
