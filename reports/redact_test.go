package reports_test

import (
	"net/url"
	"strings"
	"testing"

	"github.com/auditd/auditd/reports"
)

func TestRedactPath(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"NoQuery", "/arcgis/rest/services", "/arcgis/rest/services"},
		{"KeepsOthersInOrder", "/q?where=1%3D1&token=abc&f=json", "/q?where=1%3D1&f=json"},
		{"FirstParam", "/q?api_key=s3cret&f=json", "/q?f=json"},
		{"OnlyParam", "/q?apikey=s3cret", "/q"},
		{"CaseAndSeparators", "/q?API-Key=1&X.Api.Key=2&AccessToken=3&client_secret=4&Password=5&sig=6&Signature=7&f=1", "/q?f=1"},
		{"EscapedName", "/q?api%5Fkey=1&f=1", "/q?f=1"},
		{"EscapedTwice", "/q?%2574oken=1&f=1", "/q?f=1"},
		{"KeywordSurvives", "/q?keyword=climate&keys=1", "/q?keyword=climate&keys=1"},
		{"Fragment", "/q?token=1&a=b#frag", "/q?a=b#frag"},
		{"FullURL", "https://gis.example/q?f=json&token=abc", "https://gis.example/q?f=json"},
		{"ValuelessName", "/q?token&f=1", "/q?f=1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := reports.RedactPath(tt.in); got != tt.want {
				t.Errorf("RedactPath(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestRedactText(t *testing.T) {
	in := `Get "https://gis.example/q?f=json&token=abc": dial tcp: refused`
	want := `Get "https://gis.example/q?f=json": dial tcp: refused`
	if got := reports.RedactText(in); got != want {
		t.Errorf("RedactText = %q, want %q", got, want)
	}
}

// FuzzRedactPath: whatever the input, no parameter with a credential's name
// survives, and redacting twice changes nothing more.
func FuzzRedactPath(f *testing.F) {
	for _, s := range []string{"/q?token=1", "/q?a=1&api_key=2", "/q?%74oken=1", "/q?&&=&token", "/q?a=b#c?token=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got := reports.RedactPath(p)
		if again := reports.RedactPath(got); again != got {
			t.Fatalf("not idempotent: %q -> %q -> %q", p, got, again)
		}
		q, _, _ := strings.Cut(got, "#")
		_, query, ok := strings.Cut(q, "?")
		if !ok {
			return
		}
		for _, kv := range strings.FieldsFunc(query, func(r rune) bool { return r == '&' || r == ';' }) {
			name, _, _ := strings.Cut(kv, "=")
			if n, err := url.QueryUnescape(name); err == nil {
				name = n
			}
			l := strings.ToLower(strings.NewReplacer("_", "", "-", "", ".", "").Replace(name))
			if l == "token" || l == "apikey" || l == "password" || l == "secret" {
				t.Fatalf("RedactPath(%q) = %q keeps %q", p, got, name)
			}
		}
	})
}
