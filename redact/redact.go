package redact

import "strings"

// Replacement stands in for a credential's value.
const Replacement = "REDACTED"

// Rule is the redaction rule for one source: the built-in credential names
// and the names the source declares. The zero Rule is the built-in names
// alone. A Rule is immutable and safe for concurrent use.
type Rule struct {
	declared []string // normalized
}

// New returns the rule for a source that declares the query parameter
// names declared (auditd.Source.SecretQuery) as credentials.
func New(declared []string) Rule {
	var r Rule
	for _, d := range declared {
		if n := normalize(d); n != "" {
			r.declared = append(r.declared, n)
		}
	}
	return r
}

// fragments make a name a credential's wherever they occur in it.
var fragments = [...]string{"token", "secret", "password", "passwd", "passphrase", "signature", "credential",
	"authorization", "session", "cookie", "apikey", "accesskey", "privatekey", "keypair", "hmac", "jwt"}

// exact names are credentials' only as a whole.
var exact = [...]string{"auth", "sig", "pwd", "pass", "code", "sid", "otp"}

// Secret reports whether a query parameter or header named name (as
// written: it may be percent-encoded) carries a credential under r.
func (r Rule) Secret(name string) bool {
	var buf [64]byte
	// Not escaping, a short name's string stays on the stack: exports ask
	// about every parameter of a million paths (BenchmarkURL).
	n := string(appendNormal(buf[:0], Unescape(name)))
	if n == "" {
		return false
	}
	for _, d := range r.declared {
		if n == d {
			return true
		}
	}
	if strings.HasSuffix(n, "key") {
		return true
	}
	for _, e := range exact {
		if n == e {
			return true
		}
	}
	for _, f := range fragments {
		if strings.Contains(n, f) {
			return true
		}
	}
	return false
}

// normalize lowercases s and keeps only its letters and digits.
func normalize(s string) string { return string(appendNormal(nil, s)) }

// appendNormal appends s lowercased, with only its letters and digits
// (and bytes of multi-byte characters), to b.
func appendNormal(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'A' <= c && c <= 'Z':
			b = append(b, c+'a'-'A')
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c >= 0x80:
			b = append(b, c)
		}
	}
	return b
}

// Unescape decodes percent escapes and '+' in s, a query parameter's
// name, leniently: an invalid escape stays as written. Names are compared
// decoded, so "%74oken" is "token", and decoded again while that changes
// them, so "%2574oken" is too.
func Unescape(s string) string {
	if !strings.ContainsAny(s, "%+") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '+':
			b = append(b, ' ')
		case c == '%' && i+2 < len(s) && ishex(s[i+1]) && ishex(s[i+2]):
			b = append(b, unhex(s[i+1])<<4|unhex(s[i+2]))
			i += 2
		default:
			b = append(b, c)
		}
	}
	if strings.ContainsAny(string(b), "%") && string(b) != s {
		return Unescape(string(b))
	}
	return string(b)
}

func ishex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case '0' <= c && c <= '9':
		return c - '0'
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// URL returns s, a path with its query or an absolute URL, with every
// credential under r redacted: the values of credential query parameters,
// and userinfo. Everything else stays as written, in its order. Applying
// it twice changes nothing more.
func (r Rule) URL(s string) string {
	s = redactUserinfo(s)
	q := strings.IndexByte(s, '?')
	if q < 0 {
		return s
	}
	var b strings.Builder
	last := 0 // s[:last] is written to b
	for at := q + 1; at <= len(s); {
		end := strings.IndexAny(s[at:], "&#")
		if end < 0 {
			end = len(s) - at
		}
		pair := s[at : at+end]
		if v := r.secretValue(pair); v >= 0 && v < len(pair) {
			if last == 0 {
				b.Grow(len(s) + len(Replacement))
			}
			b.WriteString(s[last : at+v])
			b.WriteString(Replacement)
			last = at + end
		}
		at += end + 1
	}
	if last == 0 {
		return s // the common case: nothing to redact, nothing copied
	}
	b.WriteString(s[last:])
	return b.String()
}

// secretValue returns where the value of a credential starts in pair, a
// query's text between two '&' or '#', or -1 when it holds none. An
// upstream may split the pair on ';' as well, or not: the pair's name is
// looked at whole, then each part of it between ';'. The value runs to the
// end of the pair either way.
func (r Rule) secretValue(pair string) int {
	if name, _, ok := strings.Cut(pair, "="); ok && r.Secret(name) {
		return len(name) + 1
	}
	if !strings.Contains(pair, ";") {
		return -1
	}
	for off := 0; off < len(pair); {
		part := pair[off:]
		if i := strings.IndexByte(part, ';'); i >= 0 {
			part = part[:i]
		}
		if name, _, ok := strings.Cut(part, "="); ok && r.Secret(name) {
			return off + len(name) + 1
		}
		off += len(part) + 1
	}
	return -1
}

// redactUserinfo replaces the userinfo of an absolute ("scheme://") or
// scheme-relative ("//") URL with Replacement.
func redactUserinfo(s string) string {
	start := -1
	if i := strings.Index(s, "://"); i >= 0 && validScheme(s[:i]) {
		start = i + 3
	} else if strings.HasPrefix(s, "//") {
		start = 2
	}
	if start < 0 {
		return s
	}
	authority := s[start:]
	if end := strings.IndexAny(authority, "/?#"); end >= 0 {
		authority = authority[:end]
	}
	at := strings.LastIndexByte(authority, '@')
	if at < 0 || authority[:at] == Replacement {
		return s
	}
	return s[:start] + Replacement + s[start+at:]
}

// validScheme reports whether s is an RFC 3986 scheme: a letter, then
// letters, digits, '+', '-' or '.'. Text before "://" that is not one
// (`Get "http`) is cut back to the scheme by Text.
func validScheme(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		letter := 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
		if !letter && (i == 0 || !('0' <= c && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return false
		}
	}
	return true
}

// Text returns free text (an error message quoting a URL) with URL applied
// to every word in it: a word is what lies between white space, with
// quotes and punctuation around it kept as they are.
func (r Rule) Text(s string) string {
	if !strings.ContainsAny(s, "?@") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for s != "" {
		i := strings.IndexAny(s, " \t\r\n")
		word := s
		if i >= 0 {
			word = s[:i]
		}
		b.WriteString(r.word(word))
		if i < 0 {
			break
		}
		b.WriteByte(s[i])
		s = s[i+1:]
	}
	return b.String()
}

// word redacts one word of text: what follows the quotes and brackets it
// opens with is a URL or a path, up to the punctuation it closes with.
func (r Rule) word(w string) string {
	if !strings.ContainsAny(w, "?@") {
		return w
	}
	lead := 0
	for lead < len(w) && strings.IndexByte("\"'`(<[{", w[lead]) >= 0 {
		lead++
	}
	trail := len(w)
	for trail > lead && strings.IndexByte("\"'`)>]}:,.;", w[trail-1]) >= 0 {
		trail--
	}
	return w[:lead] + embeddedUserinfo(r.URL(w[lead:trail])) + w[trail:]
}

// embeddedUserinfo redacts the userinfo of every URL inside s, wherever
// it starts ("url=http://u:p@h", `"?://u@h`).
func embeddedUserinfo(s string) string {
	for from := 0; ; {
		i := strings.Index(s[from:], "://")
		if i < 0 {
			return s
		}
		start := from + i + 3
		authority := s[start:]
		if end := strings.IndexAny(authority, "/?#"); end >= 0 {
			authority = authority[:end]
		}
		if at := strings.LastIndexByte(authority, '@'); at >= 0 && authority[:at] != Replacement {
			s = s[:start] + Replacement + s[start+at:]
		}
		from = start
	}
}
