package reports

import "github.com/auditd/auditd/redact"

// RedactPath returns a recorded path or URL with the values of its
// credential query parameters, and its userinfo, replaced by
// redact.Replacement under package redact's built-in names: the rule the
// fetch loop applies before it records a path, applied again on the way
// out, because a miss there must not become a miss in the evidence. A path
// the loop recorded comes out as it went in.
func RedactPath(p string) string { return redact.Rule{}.URL(p) }

// RedactText applies RedactPath to every URL in free text (an error
// message quoting one).
func RedactText(s string) string { return redact.Rule{}.Text(s) }

// redactor is the exports' second guard: each source's rule, package
// redact's built-in names and, with declared, the names the source declares
// (auditd.Source.SecretQuery), made once per source.
type redactor struct {
	// declared, when set, names a source's declared secret parameters.
	declared func(sourceID string) []string
	rules    map[string]redact.Rule
}

func newRedactor() *redactor {
	return &redactor{rules: make(map[string]redact.Rule)}
}

// rule returns source's rule.
func (r *redactor) rule(source string) redact.Rule {
	if r.declared == nil {
		return redact.Rule{}
	}
	rule, ok := r.rules[source]
	if !ok {
		rule = redact.New(r.declared(source))
		r.rules[source] = rule
	}
	return rule
}

// sourcePath and sourceText redact a path and a text of source's requests
// under source's rule.
func (r *redactor) sourcePath(source, p string) string { return r.rule(source).URL(p) }
func (r *redactor) sourceText(source, s string) string { return r.rule(source).Text(s) }

// text redacts free text under the built-in names.
func (r *redactor) text(s string) string { return redact.Rule{}.Text(s) }
