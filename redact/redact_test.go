package redact_test

import (
	"strings"
	"testing"
	"unicode"

	"github.com/auditd/auditd/redact"
)

func TestSecret(t *testing.T) {
	rule := redact.New([]string{"sq", "My_Param"})
	for _, name := range []string{
		"token", "key", "api_key", "apikey", "api-key", "API-Key", "access_token", "accessKey", "X-Amz-Credential",
		"X-Amz-Signature", "X-Amz-Security-Token", "auth", "session_id", "password", "secret", "signature", "sig",
		"client_secret", "Authorization", "Proxy-Authorization", "Cookie", "X-Api-Key", "Key-Pair-Id", "jwt",
		"api%5Fkey", "%74oken", "sq", "SQ", "s_q", "myparam", "MY-PARAM", "code", "pwd", "sid",
	} {
		if !rule.Secret(name) {
			t.Errorf("Secret(%q) = false, want true", name)
		}
	}
	for _, name := range []string{"keyword", "keys", "author", "f", "where", "outFields", "resultOffset", "count", "q", "sqx", ""} {
		if rule.Secret(name) {
			t.Errorf("Secret(%q) = true, want false", name)
		}
	}
	if redact.New(nil).Secret("sq") {
		t.Error("a name only one source declares is secret for all")
	}
}

func TestURL(t *testing.T) {
	rule := redact.New([]string{"sq"})
	for _, tc := range []struct{ name, in, want string }{
		{"NoQuery", "/arcgis/rest/services", "/arcgis/rest/services"},
		{"KeepsOthersInOrder", "/q?where=1%3D1&token=abc&f=json", "/q?where=1%3D1&token=REDACTED&f=json"},
		{"Declared", "/q?sq=abc&f=json", "/q?sq=REDACTED&f=json"},
		{"EscapedName", "/q?api%5Fkey=1&f=1", "/q?api%5Fkey=REDACTED&f=1"},
		{"ValueWithSemicolon", "/q?token=ab;cd&f=1", "/q?token=REDACTED&f=1"},
		{"SemicolonSeparates", "/q?a=1;token=abc", "/q?a=1;token=REDACTED"},
		{"EmptyValue", "/q?token=&f=1", "/q?token=&f=1"},
		{"Valueless", "/q?token&f=1", "/q?token&f=1"},
		{"Repeated", "/q?key=a&key=b", "/q?key=REDACTED&key=REDACTED"},
		{"FragmentKeepsQuery", "/q?token=a#b&sig=c", "/q?token=REDACTED#b&sig=REDACTED"},
		{"InvalidEscape", "/q?%zz&token=1", "/q?%zz&token=REDACTED"},
		{"AbsoluteURL", "https://gis.example/q?f=json&X-Amz-Signature=abc", "https://gis.example/q?f=json&X-Amz-Signature=REDACTED"},
		{"Userinfo", "https://user:pw@gis.example/q", "https://REDACTED@gis.example/q"},
		{"UserOnly", "http://tok@h/", "http://REDACTED@h/"},
		{"SchemeRelative", "//u:p@evil.example/x?sig=1", "//REDACTED@evil.example/x?sig=REDACTED"},
		{"AtInPathIsNoUserinfo", "https://h/a@b", "https://h/a@b"},
		{"KeywordSurvives", "/q?keyword=climate&keys=1", "/q?keyword=climate&keys=1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := rule.URL(tc.in)
			if got != tc.want {
				t.Errorf("URL(%q) = %q, want %q", tc.in, got, tc.want)
			}
			if again := rule.URL(got); again != got {
				t.Errorf("not idempotent: %q -> %q", got, again)
			}
		})
	}
}

func TestText(t *testing.T) {
	rule := redact.New([]string{"sq"})
	for _, tc := range []struct{ in, want string }{
		{`Get "http://h/p%201?sq=SECRET": dial tcp 127.0.0.1:1: connect: connection refused`,
			`Get "http://h/p%201?sq=REDACTED": dial tcp 127.0.0.1:1: connect: connection refused`},
		{`Get "http://u:***@h/p?token=abc": EOF`, `Get "http://REDACTED@h/p?token=REDACTED": EOF`},
		{`redirect to (/login?session_id=abc).`, `redirect to (/login?session_id=REDACTED).`},
		{`location=https://u:p@h/`, `location=https://REDACTED@h/`},
		{"no url here", "no url here"},
	} {
		if got := rule.Text(tc.in); got != tc.want {
			t.Errorf("Text(%q)\n = %q\nwant %q", tc.in, got, tc.want)
		}
	}
}

// plantNames are credential names a fuzzed input hides a secret behind.
var plantNames = []string{"token", "sq", "api_key", "api-key", "accessKey", "X-Amz-Credential", "X-Amz-Signature",
	"auth", "session_id", "password", "secret", "signature", "ApiKey", "%74oken", "api%5Fkey"}

// plant is a secret no fuzzed text holds by chance: the fuzzer's bytes are
// checked not to hold it.
func plant(tail string) string {
	var b strings.Builder
	b.WriteString("PLANTEDzq")
	for _, r := range tail {
		if r < unicode.MaxASCII && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			b.WriteRune(r)
		}
	}
	return b.String()
}

// FuzzURL: a secret planted as the value of a credential parameter, or as
// userinfo, anywhere in a fuzzed URL never survives; redacting twice
// changes nothing more.
func FuzzURL(f *testing.F) {
	f.Add("/q?a=1", "&f=json", uint8(0), "x", true)
	f.Add("https://h/p%201?where=", "#frag", uint8(5), "abc", false)
	f.Add("/q?%zz", ";x=1", uint8(13), "0", true)
	f.Add("//u@h/x?", "&&", uint8(7), "Z9", false)
	rule := redact.New([]string{"sq"})
	f.Fuzz(func(t *testing.T, prefix, suffix string, which uint8, tail string, asQuery bool) {
		secret := plant(tail)
		if strings.Contains(prefix+suffix, "PLANTED") {
			t.Skip()
		}
		var in string
		if asQuery {
			sep := "?"
			if strings.Contains(prefix, "?") {
				sep = "&"
			}
			in = prefix + sep + plantNames[int(which)%len(plantNames)] + "=" + secret + "&" + suffix
		} else {
			// Userinfo: the authority is the planted credential's alone.
			in = "https://" + secret + ":" + secret + "@" + "h.example/" + strings.TrimLeft(prefix, "/") + suffix
		}
		out := rule.URL(in)
		if strings.Contains(out, secret) {
			t.Fatalf("URL(%q) = %q keeps the planted secret", in, out)
		}
		if again := rule.URL(out); again != out {
			t.Fatalf("not idempotent: %q -> %q -> %q", in, out, again)
		}
		// In free text, quoted as Go's errors quote URLs.
		text := `Get "` + in + `": dial tcp: connection refused`
		if got := rule.Text(text); strings.Contains(got, secret) && !strings.ContainsAny(in, " \t\r\n") {
			t.Fatalf("Text(%q) = %q keeps the planted secret", text, got)
		}
	})
}

// FuzzURLNeverKeepsCredentialValues: whatever the input, every parameter of
// the output whose name is a credential's has no value or Replacement, as
// an upstream splitting the query on '&' alone, or on '&' and ';', reads it.
func FuzzURLNeverKeepsCredentialValues(f *testing.F) {
	for _, s := range []string{"/q?token=1", "/q?a=1&api_key=2", "/q?%74oken=1", "/q?&&=&token", "/q?a=b#c?token=1", "/q?a=1;sig=2;x", "/q?token=a;b&c=d"} {
		f.Add(s)
	}
	rule := redact.New([]string{"sq"})
	f.Fuzz(func(t *testing.T, in string) {
		out := rule.URL(in)
		_, query, ok := strings.Cut(out, "?")
		if !ok {
			return
		}
		query, _, _ = strings.Cut(query, "#")
		for _, seps := range []string{"&", "&;"} {
			for _, pair := range strings.FieldsFunc(query, func(r rune) bool { return strings.ContainsRune(seps, r) }) {
				name, value, _ := strings.Cut(pair, "=")
				if rule.Secret(name) && value != "" && value != redact.Replacement {
					t.Fatalf("URL(%q) = %q keeps %s=%s (split on %q)", in, out, name, value, seps)
				}
			}
		}
	})
}

// BenchmarkURL: a recorded path as an export meets it once per dispatch
// row, four parameters, none a credential, two of them not lowercase.
func BenchmarkURL(b *testing.B) {
	const path = "/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%3D1&outFields=*&resultOffset=3000&f=json"
	var rule redact.Rule
	for b.Loop() {
		if rule.URL(path) != path {
			b.Fatal("a path without credentials changed")
		}
	}
}
