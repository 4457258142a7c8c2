package fetch

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/auditd/auditd"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     int
		retryAfter bool
		rule       auditd.BodyErrorRule
		body       string
		want       auditd.Outcome
		code       string
	}{
		{"OK", 200, false, "", `{}`, auditd.OutcomeSuccess, ""},
		{"TooMany", 429, false, "", ``, auditd.OutcomeThrottled, ""},
		{"UnavailableWithHint", 503, true, "", ``, auditd.OutcomeThrottled, ""},
		{"UnavailablePlain", 503, false, "", ``, auditd.OutcomeServerError, ""},
		{"NotFound", 404, false, "", ``, auditd.OutcomeClientError, ""},
		{"GrantsGovErrorInside200", 200, false, auditd.BodyErrorGrantsGov, `{"errorcode":1,"msg":"x"}`, auditd.OutcomeBodyError, "errorcode=1"},
		{"GrantsGovZero", 200, false, auditd.BodyErrorGrantsGov, `{"errorcode":0}`, auditd.OutcomeSuccess, ""},
		{"GrantsGovStringCode", 200, false, auditd.BodyErrorGrantsGov, `{"errorcode":"7"}`, auditd.OutcomeBodyError, "errorcode=7"},
		{"ArcGISToken", 200, false, auditd.BodyErrorArcGIS, `{"error":{"code":498,"message":"Invalid token."}}`, auditd.OutcomeBodyError, "error.code=498"},
		{"ArcGISFeatures", 200, false, auditd.BodyErrorArcGIS, `{"features":[{"attributes":{"error":1}}]}`, auditd.OutcomeSuccess, ""},
		{"RuleIgnoresNonJSON", 200, false, auditd.BodyErrorArcGIS, `<html>error</html>`, auditd.OutcomeSuccess, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := classify(tc.status, tc.retryAfter, tc.rule, []byte(tc.body))
			if out != tc.want || code != tc.code {
				t.Fatalf("got %s %q, want %s %q", out, code, tc.want, tc.code)
			}
		})
	}
}

func TestRedactPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/q?where=1", "/q?where=1"},
		{"/q?token=abc&f=json", "/q?f=json&token=REDACTED"},
		{"/q?API_KEY=abc", "/q?API_KEY=REDACTED"},
		{"/q?custom=abc", "/q?custom=REDACTED"}, // named by the source
		{"/q?%zz", "/q?REDACTED"},               // unparsable: nothing of it is kept
	} {
		if got := redactPath(tc.in, []string{"custom"}); got != tc.want {
			t.Errorf("redactPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	err := scrubError(errors.New(`Get "http://h/q?token=s3cret": dial tcp: refused`), "/q?token=s3cret", nil)
	if strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("transport error keeps the credential: %v", err)
	}
}

// FuzzRedactPath: whatever the path, a credential parameter's value never
// survives redaction.
func FuzzRedactPath(f *testing.F) {
	for _, s := range []string{"/q?token=abc", "/q?a=1&key=x&key=y", "/q?%zz&token=1", "/q?ToKeN=abc;x=1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, path string) {
		out := redactPath(path, nil)
		_, q, ok := strings.Cut(out, "?")
		if !ok {
			return
		}
		vals, err := url.ParseQuery(q)
		if err != nil {
			return
		}
		for name, vs := range vals {
			if isCredential(name, nil) {
				for _, v := range vs {
					if v != "REDACTED" {
						t.Fatalf("%q -> %q keeps %s=%q", path, out, name, v)
					}
				}
			}
		}
	})
}

// FuzzParsePage: an upstream's page, however malformed, yields an error or
// a consistent answer, never a panic or a negative count.
func FuzzParsePage(f *testing.F) {
	f.Add([]byte(`{"features":[{},{}],"exceededTransferLimit":true}`), 0)
	f.Add([]byte(`{"numberMatched":5,"numberReturned":2,"features":[{},{}]}`), 1)
	f.Add([]byte(`{"errorcode":0,"data":{"hitCount":30,"oppHits":[{}]}}`), 2)
	f.Fuzz(func(t *testing.T, body []byte, mode int) {
		modes := []auditd.Paging{auditd.PagingArcGIS, auditd.PagingWFS, auditd.PagingGrantsGov}
		info, err := parsePage(modes[(mode%3+3)%3], body, 10)
		if err == nil && info.records < 0 {
			t.Fatalf("negative records %+v", info)
		}
		if err == nil && info.more && info.records == 0 {
			t.Fatalf("more pages promised after an empty one: %+v", info)
		}
	})
}
