// Package webtest is what the tests that drive the auditor UI in headless
// Chromium share: finding the browser, the flags it needs here, reading the
// charts back from the page, and where screenshots go.
package webtest

import (
	"os"
	"os/exec"
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
