package web_test

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/auditd/auditd/web"
)

func get(t *testing.T, h http.Handler, method, path string, hdr map[string]string) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func TestHandler(t *testing.T) {
	h := web.Handler()
	tests := []struct {
		name, method, path string
		status             int
		ctype              string
		body               string
	}{
		{"RootIsIndex", "GET", "/", 200, "text/html; charset=utf-8", `<script type="module" src="/js/app.js">`},
		{"IndexByName", "GET", "/index.html", 200, "text/html; charset=utf-8", "<main"},
		{"Stylesheet", "GET", "/app.css", 200, "text/css; charset=utf-8", ":root"},
		{"Module", "GET", "/js/app.js", 200, "text/javascript; charset=utf-8", "import"},
		{"Icon", "GET", "/favicon.svg", 200, "image/svg+xml", "<svg"},
		{"Head", "HEAD", "/js/api.js", 200, "text/javascript; charset=utf-8", ""},
		{"ChartLibrary", "GET", "/vendor/uplot/uPlot.iife.min.js", 200, "text/javascript; charset=utf-8", "uPlot"},
		{"ChartLibraryLicence", "GET", "/vendor/uplot/LICENSE.txt", 200, "text/plain; charset=utf-8", "Leon Sorokin"},
		{"UnknownPath", "GET", "/nope.js", 404, "", ""},
		{"NoDirectoryListing", "GET", "/js/", 404, "", ""},
		{"NoTraversal", "GET", "/../web.go", 404, "", ""},
		{"NoPost", "POST", "/", 405, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res := get(t, h, tc.method, tc.path, nil)
			body, _ := io.ReadAll(res.Body)
			if res.StatusCode != tc.status {
				t.Fatalf("status = %d, want %d", res.StatusCode, tc.status)
			}
			if csp := res.Header.Get("Content-Security-Policy"); csp != web.ContentSecurityPolicy {
				t.Errorf("CSP = %q", csp)
			}
			if got := res.Header.Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q", got)
			}
			if tc.status != 200 {
				return
			}
			if got := res.Header.Get("Content-Type"); got != tc.ctype {
				t.Errorf("Content-Type = %q, want %q", got, tc.ctype)
			}
			if got := res.Header.Get("Cache-Control"); got != "no-cache" {
				t.Errorf("Cache-Control = %q, want no-cache", got)
			}
			if res.Header.Get("ETag") == "" {
				t.Error("no ETag")
			}
			if !strings.Contains(string(body), tc.body) {
				t.Errorf("body lacks %q", tc.body)
			}
		})
	}
}

func TestHandlerRevalidates(t *testing.T) {
	h := web.Handler()
	first := get(t, h, "GET", "/app.css", nil)
	etag := first.Header.Get("ETag")
	again := get(t, h, "GET", "/app.css", map[string]string{"If-None-Match": etag})
	if again.StatusCode != http.StatusNotModified {
		t.Fatalf("status with matching If-None-Match = %d, want 304", again.StatusCode)
	}
	if get(t, h, "GET", "/", nil).Header.Get("ETag") == etag {
		t.Fatal("index and stylesheet share an ETag")
	}
}

// TestCSPHolds checks the shipped files against what the policy forbids, so
// a page that would break under it fails here and not in a browser.
func TestCSPHolds(t *testing.T) {
	if !strings.Contains(web.ContentSecurityPolicy, "script-src 'self'") ||
		strings.Contains(web.ContentSecurityPolicy, "unsafe-") {
		t.Fatalf("policy is not strict: %s", web.ContentSecurityPolicy)
	}
	inlineScript := regexp.MustCompile(`<script(?:\s[^>]*)?>\s*[^<\s]`)
	inlineHandler := regexp.MustCompile(`\son[a-z]+\s*=`)
	styleAttr := regexp.MustCompile(`\sstyle\s*=`)
	remote := regexp.MustCompile(`(?:src|href)\s*=\s*["']?(?:https?:)?//`)
	err := filepath.WalkDir("static", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := string(b)
		switch filepath.Ext(p) {
		case ".html":
			for _, re := range []*regexp.Regexp{inlineScript, inlineHandler, styleAttr, remote} {
				if m := re.FindString(s); m != "" {
					t.Errorf("%s: %q breaks the CSP or loads from outside", p, m)
				}
			}
		case ".js":
			// Text goes in as text nodes; markup from API data would be an
			// injection, and eval would need 'unsafe-eval'.
			for _, bad := range []string{".innerHTML", ".outerHTML", "insertAdjacentHTML", "eval(", "new Function", "document.write"} {
				if strings.Contains(s, bad) {
					t.Errorf("%s uses %s", p, bad)
				}
			}
			if m := remote.FindString(s); m != "" {
				t.Errorf("%s loads from outside: %q", p, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
