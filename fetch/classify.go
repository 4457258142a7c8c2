package fetch

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
)

// classify decides the outcome of one response from its status and, for a
// 2xx, its body: Grants.gov answers errors inside a 200 ("errorcode" != 0) and
// ArcGIS answers token problems as 200 {"error":{"code":498}}. bodyErr is the
// code found in the body, for the record.
func classify(status int, hasRetryAfter bool, rule auditd.BodyErrorRule, body []byte) (out auditd.Outcome, bodyErr string) {
	switch {
	case status == 429 || (status == 503 && hasRetryAfter):
		return auditd.OutcomeThrottled, ""
	case status >= 500:
		return auditd.OutcomeServerError, ""
	case status >= 400 || status < 200:
		return auditd.OutcomeClientError, ""
	case status >= 300:
		return auditd.OutcomeClientError, "" // redirects are followed by the client; one that reaches here was refused
	}
	if code := bodyError(rule, body); code != "" {
		return auditd.OutcomeBodyError, code
	}
	return auditd.OutcomeSuccess, ""
}

// bodyError returns the error code a 2xx body carries under rule, or "".
// A body that is not JSON carries none: the rule only reads what it knows.
func bodyError(rule auditd.BodyErrorRule, body []byte) string {
	switch rule {
	case auditd.BodyErrorGrantsGov:
		var v struct {
			ErrorCode json.RawMessage `json:"errorcode"`
		}
		if json.Unmarshal(body, &v) != nil || len(v.ErrorCode) == 0 {
			return ""
		}
		code := strings.Trim(string(v.ErrorCode), `"`)
		if code == "0" || code == "" || code == "null" {
			return ""
		}
		return "errorcode=" + code
	case auditd.BodyErrorArcGIS:
		if !bytes.Contains(body, []byte(`"error"`)) {
			return ""
		}
		var v struct {
			Error *struct {
				Code json.Number `json:"code"`
			} `json:"error"`
		}
		if json.Unmarshal(body, &v) != nil || v.Error == nil {
			return ""
		}
		return "error.code=" + v.Error.Code.String()
	}
	return ""
}

// withQuery returns path with the given parameters set, keeping the others.
func withQuery(path string, set map[string]int) string {
	before, query, _ := strings.Cut(path, "?")
	vals, _ := url.ParseQuery(query)
	if vals == nil {
		vals = url.Values{}
	}
	for k, v := range set {
		vals.Set(k, strconv.Itoa(v))
	}
	return before + "?" + vals.Encode()
}
