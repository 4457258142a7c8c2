// Package webtest is what the tests that drive the auditor UI in headless
// Chromium share: finding the browser, the flags it needs here, reading the
// charts back from the page, and where screenshots go.
package webtest

import (
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"testing"

	"github.com/chromedp/chromedp"
)

// Chromium returns the path of a Chromium binary. Without one it skips tb,
// except under CI=true, where .ci/run installs it and its absence fails.
func Chromium(tb testing.TB) string {
	tb.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		tb.Fatal("chromium not found; CI installs it (apt-get install chromium)")
	}
	tb.Skip("chromium not found; install it with apt-get install chromium")
	return ""
}

// AllocatorOptions start Chromium headless as root with a fresh profile in
// userDataDir, and without the background networking that, on these
// machines without internet, floods refused connections.
func AllocatorOptions(exe, userDataDir string) []chromedp.ExecAllocatorOption {
	return []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(exe),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.UserDataDir(userDataDir),
		chromedp.WindowSize(1280, 900),
	}
}

// rawValues are what a page must never show: Go's durations, a -1 standing
// for "not known", nanosecond timestamps (as a number, or with more than
// milliseconds), Go's zero time, a year with a thousands separator.
var rawValues = []struct {
	what string
	re   *regexp.Regexp
}{
	{"a Go duration", regexp.MustCompile(`\b\d+h\d+m|\b\d+m\d+(\.\d+)?s\b|\b\d+\.\d{4,}s\b`)},
	{"-1", regexp.MustCompile(`(^|[\s(:])-1([^\d.]|$)`)},
	{"a nanosecond timestamp", regexp.MustCompile(`\b1[5-9]\d{16,17}\b|\d\d:\d\d:\d\d\.\d{4,}`)},
	{"Go's zero time", regexp.MustCompile(`0001-01-01`)},
	{"a year with a thousands separator", regexp.MustCompile(`(?i)year\W{0,3}\d,\d\d\d\b`)},
}

// RawValues says which raw values a page's text shows, each with what is
// around it.
func RawValues(text string) []string {
	var out []string
	for _, r := range rawValues {
		if loc := r.re.FindStringIndex(text); loc != nil {
			out = append(out, fmt.Sprintf("%s: %q in %q", r.what, text[loc[0]:loc[1]], text[max(0, loc[0]-60):min(len(text), loc[1]+60)]))
		}
	}
	return out
}
