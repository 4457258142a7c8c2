package hints

// A minimal reader for the parts of RFC 8941 structured fields that rate-limit
// headers use: lists and dictionaries of strings, tokens and numbers with
// parameters. It slices the input instead of copying it, so a parse costs no
// allocations; strings are returned with their escapes intact, which is
// enough to compare policy names between two fields of one response.

const (
	kindNone byte = iota
	kindString
	kindToken
	kindNumber
)

// member is one list or dictionary member.
type member struct {
	key    string // dictionary key; "" for a list member
	kind   byte
	str    string // string or token value
	num    int64  // integer part of a number (saturated)
	frac   int64  // fractional part of a number, in nanoseconds
	params string // raw parameters, starting at ';' ("" when none)
}

// nextMember parses the member at the start of s and returns the text after
// its separating comma. ok is false on a syntax error.
func nextMember(s string) (m member, rest string, ok bool) {
	s = trimOWS(s)
	if s == "" {
		return m, "", false
	}
	// A dictionary member starts with a key followed by '='.
	if isLCAlpha(s[0]) || s[0] == '*' {
		i := 1
		for i < len(s) && isKeyChar(s[i]) {
			i++
		}
		if i < len(s) && s[i] == '=' {
			m.key = s[:i]
			s = s[i+1:]
		}
	}
	n, ok := bareItem(s, &m)
	if !ok {
		return m, "", false
	}
	s = s[n:]
	// Parameters run to the next comma that is not inside a string.
	i, inStr := 0, false
	for ; i < len(s); i++ {
		c := s[i]
		if inStr {
			if c == '\\' {
				i++
			} else if c == '"' {
				inStr = false
			}
			continue
		}
		if c == '"' {
			inStr = true
		} else if c == ',' {
			break
		}
	}
	if inStr {
		return m, "", false
	}
	m.params = trimOWS(s[:i])
	if m.params != "" && m.params[0] != ';' {
		return m, "", false
	}
	if i < len(s) {
		rest = trimOWS(s[i+1:])
		if rest == "" {
			return m, "", false // a trailing comma is a syntax error
		}
	}
	return m, rest, true
}

// bareItem reads a string, token or number from the start of s into m and
// returns how many bytes it took.
func bareItem(s string, m *member) (int, bool) {
	if s == "" {
		return 0, false
	}
	switch c := s[0]; {
	case c == '"':
		for i := 1; i < len(s); i++ {
			switch s[i] {
			case '\\':
				i++
			case '"':
				m.kind, m.str = kindString, s[1:i]
				return i + 1, true
			}
		}
		return 0, false
	case isDigit(c):
		i := 0
		for i < len(s) && (isDigit(s[i]) || s[i] == '.') {
			i++
		}
		whole, frac, ok := parseDecimal(s[:i])
		if !ok {
			return 0, false
		}
		m.kind, m.num, m.frac = kindNumber, whole, frac
		return i, true
	case isAlpha(c) || c == '*':
		i := 1
		for i < len(s) && isTokenChar(s[i]) {
			i++
		}
		m.kind, m.str = kindToken, s[:i]
		return i, true
	}
	return 0, false
}

// param returns the raw value of the named parameter in params
// (";a=1;b=2"). A parameter without "=" is boolean true and has no value we
// use, so it is reported as absent.
func param(params, name string) (string, bool) {
	for params != "" {
		if params[0] != ';' {
			return "", false
		}
		params = trimOWS(params[1:])
		i := 0
		for i < len(params) && isKeyChar(params[i]) {
			i++
		}
		key := params[:i]
		params = params[i:]
		if params == "" || params[0] != '=' {
			continue
		}
		params = params[1:]
		j, inStr := 0, false
		for ; j < len(params); j++ {
			c := params[j]
			if inStr {
				if c == '\\' {
					j++
				} else if c == '"' {
					inStr = false
				}
				continue
			}
			if c == '"' {
				inStr = true
			} else if c == ';' {
				break
			}
		}
		if j > len(params) {
			j = len(params)
		}
		value := trimOWS(params[:j])
		params = params[j:]
		if key == name {
			return value, true
		}
	}
	return "", false
}

func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }

func isAlpha(c byte) bool { return isLCAlpha(c) || ('A' <= c && c <= 'Z') }

func isKeyChar(c byte) bool {
	return isLCAlpha(c) || isDigit(c) || c == '_' || c == '-' || c == '.' || c == '*'
}

func isTokenChar(c byte) bool {
	switch {
	case isAlpha(c), isDigit(c):
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~', ':', '/':
		return true
	}
	return false
}
