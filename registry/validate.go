package registry

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"sync"

	"github.com/go-playground/validator/v10"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/validation"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
)

// ruleMessage says in words which rule of a source's field a value broke,
// as a person who wrote the configuration reads it (not the tag's name).
func ruleMessage(field string, fe validator.FieldError) string {
	unit := ""
	switch fe.Kind() {
	case reflect.String:
		unit = " characters"
	case reflect.Slice, reflect.Map:
		unit = " entries"
	}
	switch fe.Tag() {
	case "required":
		return fmt.Sprintf("%s is required.", field)
	case "min":
		return fmt.Sprintf("%s must be at least %s%s.", field, fe.Param(), unit)
	case "max":
		return fmt.Sprintf("%s must be at most %s%s.", field, fe.Param(), unit)
	case "gt":
		return fmt.Sprintf("%s must be more than %s%s.", field, fe.Param(), unit)
	case "oneof":
		return fmt.Sprintf("%s must be one of %s.", field, strings.ReplaceAll(fe.Param(), " ", ", "))
	case "url", "startswith":
		return fmt.Sprintf("%s must be an http:// or https:// URL.", field)
	case "printascii":
		return fmt.Sprintf("%s must be printable ASCII, without a leading or trailing space.", field)
	case "excludesall":
		return fmt.Sprintf("%s must not contain CR, LF or NUL.", field)
	}
	return fmt.Sprintf("%s is not valid.", field)
}

// validateSource checks src's tags and the rules the tags cannot say.
func (r *Registry) validateSource(src auditd.Source) error {
	// The base URL first: its own check says in words what is wrong and
	// how to write it, where the struct's rule would only say "a URL".
	if src.BaseURL != "" {
		if err := checkBaseURL(src.BaseURL); err != nil {
			return err
		}
	}
	if err := r.validate.Struct(src); err != nil {
		var verrs validator.ValidationErrors
		if errors.As(err, &verrs) && len(verrs) > 0 {
			fe := verrs[0]
			field := strings.TrimPrefix(fe.Namespace(), "Source.")
			return &auditd.Error{Code: auditd.EINVALID, Field: field, Message: ruleMessage(field, fe)}
		}
		return &auditd.Error{Code: auditd.EINVALID, Message: "Invalid source."}
	}
	if src.Window < 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "window", Message: "Window must not be negative."}
	} else if src.Window.D() > limiter.MaxWindow {
		// The limiter is configured after the source is stored and
		// recorded: what it would refuse is refused here.
		return &auditd.Error{Code: auditd.EINVALID, Field: "window", Message: fmt.Sprintf("The window must be at most %s (366 days).", limiter.MaxWindow)}
	} else if src.Window > 0 && src.Limit == 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "limit", Message: "A window needs a limit."}
	}
	if src.Group != "" && src.Rate != 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "rate", Message: "rate paces a source's own budget; the members of a gateway group share the group's."}
	} else if src.Group != "" && src.Count == auditd.CountRecords {
		return &auditd.Error{Code: auditd.EINVALID, Field: "count", Message: "count applies to a source's own budget; the members of a gateway group share the group's, which counts requests."}
	}
	for name, value := range src.Headers {
		if !validHeaderName(name) {
			return &auditd.Error{Code: auditd.EINVALID, Field: "headers", Message: "Invalid header name."}
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return &auditd.Error{Code: auditd.EINVALID, Field: "headers[" + name + "]", Message: fmt.Sprintf("The value of header %s must not contain CR, LF or NUL.", name)}
		}
	}
	for name := range src.Query {
		if !validHeaderName(name) { // a token: nothing a query string would need to escape
			return &auditd.Error{Code: auditd.EINVALID, Field: "query", Message: "Invalid query parameter name."}
		}
	}
	return nil
}

// checkBaseURL refuses a base URL that is not http or https with a host,
// that carries a query or a fragment, or that carries credentials: those
// belong in headers (stored sealed, never recorded) or in item paths under
// a parameter named in secret_query (redacted before anything is stored).
// A host written as a number in another form than dotted decimal
// ("0x7f000001", "2130706433", "127.1") is refused too: resolvers disagree
// about what it names.
func checkBaseURL(raw string) error {
	bad := func(format string, args ...any) error {
		return &auditd.Error{Code: auditd.EINVALID, Field: "base_url", Message: fmt.Sprintf(format, args...)}
	}
	if strings.ContainsAny(raw, " \t") {
		return bad("%q is not a URL (it holds a space): write it as https://host/path", raw)
	}
	u, err := url.Parse(raw)
	switch {
	case err == nil && u.Scheme == "" || err != nil && !strings.Contains(raw, "://"):
		return bad("%q has no scheme: write it with http:// or https:// in front, such as https://%s", raw, strings.TrimPrefix(raw, "//"))
	case err != nil:
		return bad("%q is not a URL: %v", raw, errors.Unwrap(err))
	case u.Scheme != "http" && u.Scheme != "https":
		return bad("%q has the scheme %s; a source is reached over http:// or https://", raw, u.Scheme)
	case u.Opaque != "" || u.Host == "" || u.Hostname() == "":
		return bad("%q has no host: write it as https://host/path", raw)
	}
	if u.User != nil || redact.New(nil).URL(raw) != raw {
		return bad("base_url must not carry credentials; put them in headers, or in item paths under a parameter named in secret_query.")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
		return bad("base_url must not have a query or a fragment; parameters belong in item paths.")
	}
	if host := u.Hostname(); !strings.Contains(host, ":") && numericHost(host) {
		if _, err := netip.ParseAddr(host); err != nil {
			return bad("base_url's host %q is a number but not a dotted-decimal IPv4 address; write the address in full.", host)
		}
	}
	return nil
}

// numericHost reports whether host is made of digits, dots and hex
// notation only: an address in some form, not a name.
func numericHost(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h == "" {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return false
		}
		if strings.HasPrefix(label, "0x") {
			label = strings.TrimLeft(label[2:], "0123456789abcdef")
		} else {
			label = strings.TrimLeft(label, "0123456789")
		}
		if label != "" {
			return false
		}
	}
	return true
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// CheckSource checks src as PutSource would, without a registry and
// storing nothing: a configuration file is checked whole before anything is
// opened or created for it.
func CheckSource(src auditd.Source) error {
	return checker().validateSource(src)
}

// checker is the Registry CheckSource validates with, its validator built
// once (a config file checks every source it lists).
var checker = sync.OnceValue(func() *Registry { return &Registry{validate: validation.New()} })
