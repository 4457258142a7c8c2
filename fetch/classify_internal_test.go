package fetch

import (
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/redact"
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

// TestScrubError: the errors net/http makes quote the URL as it encodes
// it, not as submitted (a space becomes %20), so no credential may reach
// the text by way of the url.Error; a policy refusal stays one.
func TestScrubError(t *testing.T) {
	rule := redact.New([]string{"sq"})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now: connection refused
	client := NewClient(DefaultClientOptions())
	for _, tc := range []struct{ name, url string }{
		{"Refused", refused + "/p 1?sq=SECRET1&f=json"},
		{"RefusedNonASCII", refused + "/pé?token=SECRET1"},
		{"Userinfo", "http://user:SECRET1@" + ln.Addr().String() + "/p?x=1"},
		{"Denied", "http://169.254.169.254/latest?X-Amz-Credential=SECRET1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequest("GET", tc.url, nil)
			if err != nil {
				t.Fatal(err)
			}
			_, err = client.Do(req)
			if err == nil {
				t.Fatal("request succeeded")
			}
			got := scrubError(err, rule)
			if strings.Contains(got.Error(), "SECRET1") {
				t.Fatalf("scrubbed error keeps the credential: %v", got)
			}
			if isDenied(got) != (tc.name == "Denied") {
				t.Fatalf("isDenied(%v) = %v", got, isDenied(got))
			}
		})
	}
	// An error's free text, with no url.Error in it.
	got := scrubError(errors.New(`redirect to "https://u:SECRET1@evil.example/?sig=SECRET1"`), rule)
	if strings.Contains(got.Error(), "SECRET1") {
		t.Fatalf("scrubbed error keeps the credential: %v", got)
	}
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
