package reports

import (
	"bytes"
	"strings"

	"github.com/auditd/auditd/redact"
)

// credentialNames are fragments of query parameter names that carry
// credentials, matched against the name lowercased with '_', '-' and '.'
// removed. "key" matches only as a suffix ("api_key", "accessKey") so that
// "keyword" survives.
var credentialNames = [...]string{"token", "apikey", "password", "passwd", "secret", "signature", "credential", "authorization", "session"}

// credentialName reports whether a query parameter named name looks like it
// carries a credential.
func credentialName(name string) bool {
	var buf [64]byte
	n := normalizeName(buf[:0], name)
	switch string(n) {
	case "sig", "pwd", "auth", "code":
		return true
	}
	if bytes.HasSuffix(n, []byte("key")) {
		return true
	}
	for _, c := range credentialNames {
		if bytes.Contains(n, []byte(c)) {
			return true
		}
	}
	return false
}

// normalizeName appends name lowercased without '_', '-' and '.' to b.
func normalizeName(b []byte, name string) []byte {
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_' || c == '-' || c == '.':
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return b
}

// RedactPath removes from a recorded path or URL every query parameter whose
// name looks like a credential (token, key, api_key, apikey, password,
// secret, signature, ...), keeping the others as they were written and in
// their order. The ledger redacts at recording time; exports check again,
// because a miss there must not become a miss in the evidence.
func RedactPath(p string) string { return redactPath(p, credentialParam) }

// credentialParam reports whether a raw (possibly escaped) parameter name
// looks like a credential.
func credentialParam(name string) bool { return credentialName(redact.Unescape(name)) }

func redactPath(p string, isCredential func(name string) bool) string {
	return redactPairs(p, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return isCredential(name)
	})
}

// redactPairs drops from p's query every name=value pair drop holds to
// carry a credential.
func redactPairs(p string, drop func(kv string) bool) string {
	frag := ""
	if h := strings.IndexByte(p, '#'); h >= 0 {
		p, frag = p[:h], p[h:]
	}
	q := strings.IndexByte(p, '?')
	if q < 0 {
		return p + frag
	}
	if !anyCredential(p[q+1:], drop) {
		return p + frag // the common case: nothing to strip, nothing to copy
	}
	var b strings.Builder
	b.Grow(len(p) + len(frag))
	b.WriteString(p[:q])
	first := true
	rest := p[q+1:]
	sep := byte('?')
	for {
		end := strings.IndexAny(rest, "&;")
		kv := rest
		if end >= 0 {
			kv = rest[:end]
		}
		if kv != "" && !drop(kv) {
			if first {
				b.WriteByte('?')
				first = false
			} else {
				b.WriteByte(sep)
			}
			b.WriteString(kv)
		}
		if end < 0 {
			break
		}
		sep, rest = rest[end], rest[end+1:]
	}
	b.WriteString(frag)
	return b.String()
}

// anyCredential reports whether a query string holds a parameter whose
// name looks like a credential.
func anyCredential(query string, drop func(kv string) bool) bool {
	for query != "" {
		kv := query
		if end := strings.IndexAny(query, "&;"); end >= 0 {
			kv, query = query[:end], query[end+1:]
		} else {
			query = ""
		}
		if drop(kv) {
			return true
		}
	}
	return false
}

// RedactText applies RedactPath to every word of free text that carries a
// query string (an error message quoting a URL).
func RedactText(s string) string { return redactText(s, credentialParam) }

func redactText(s string, isCredential func(string) bool) string {
	return redactTextPairs(s, func(kv string) bool {
		name, _, _ := strings.Cut(kv, "=")
		return isCredential(name)
	})
}

func redactTextPairs(s string, drop func(kv string) bool) string {
	if !strings.Contains(s, "?") {
		return s
	}
	words := strings.Split(s, " ")
	for i, w := range words {
		if strings.Contains(w, "?") {
			trim := strings.TrimRight(w, `":,;)'`)
			words[i] = redactPairs(trim, drop) + w[len(trim):]
		}
	}
	return strings.Join(words, " ")
}

// maxJudgedNames bounds a redactor's memory of parameter names.
const maxJudgedNames = 4096

// redactor is RedactPath and RedactText remembering the parameter names it
// has judged: an export meets the same few names millions of times.
type redactor struct {
	judged map[string]bool
	// declared, when set, names a source's declared secret parameters.
	declared func(sourceID string) []string
	bySource map[string]func(string) bool // nil: the source declares none
}

func newRedactor() *redactor {
	return &redactor{judged: make(map[string]bool), bySource: make(map[string]func(string) bool)}
}

// sourceRule returns the credential test of source's paths: the built-in
// names, and the names source declares unless the value is redacted
// already (so that a workbook's rows stay those EventRows computes
// without the declarations, unless a value slipped into the ledger).
func (r *redactor) sourceRule(source string) func(string) bool {
	if r.declared == nil {
		return nil
	}
	is, ok := r.bySource[source]
	if !ok {
		if names := r.declared(source); len(names) > 0 {
			rule := redact.New(names)
			is = func(kv string) bool {
				name, value, _ := strings.Cut(kv, "=")
				return r.isCredential(name) || value != redact.Replacement && rule.Secret(name)
			}
		}
		r.bySource[source] = is
	}
	return is
}

// sourcePath and sourceText are path and text with source's declared
// names too.
func (r *redactor) sourcePath(source, p string) string {
	if is := r.sourceRule(source); is != nil {
		return redactPairs(p, is)
	}
	return r.path(p)
}

func (r *redactor) sourceText(source, s string) string {
	if is := r.sourceRule(source); is != nil {
		return redactTextPairs(s, is)
	}
	return r.text(s)
}

func (r *redactor) isCredential(name string) bool {
	if v, ok := r.judged[name]; ok {
		return v
	}
	v := credentialParam(name)
	if len(r.judged) < maxJudgedNames {
		r.judged[strings.Clone(name)] = v
	}
	return v
}

func (r *redactor) path(p string) string { return redactPath(p, r.isCredential) }
func (r *redactor) text(s string) string { return redactText(s, r.isCredential) }
