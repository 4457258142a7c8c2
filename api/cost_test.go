package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// The batch-upload seed's pacing over the API: a window of 120 records a
// second, a bucket refilled at 50 a second holding 200, learned limits in
// records; what is put is what is read back, and each knob's mistake is
// refused naming it.
func TestSourceSeedPacing(t *testing.T) {
	e := newEnv(t)
	admin := e.secret[auth.RoleAdmin]
	body := `{"base_url":"https://mro.example","limit":120,"window":"1s","rate":50,"burst":200,"count":"records"}`
	if r := e.do(request{method: "PUT", path: "/v1/sources/mro", secret: admin, body: body}); r.status != http.StatusCreated {
		t.Fatalf("put: %d %s", r.status, r.body)
	}
	r := e.do(request{path: "/v1/sources/mro", secret: admin})
	var got auditd.Source
	if err := json.Unmarshal(r.body, &got); err != nil {
		t.Fatal(err)
	}
	if got.Limit != 120 || got.Window.D().String() != "1s" || got.Rate != 50 || got.Burst != 200 || got.Count != auditd.CountRecords {
		t.Fatalf("read back %+v", got)
	}
	for _, tc := range []struct {
		name, body, field, detail string
	}{
		{"RateNegative", `{"base_url":"https://x.example","rate":-1}`, "rate", "rate must be more than 0."},
		{"RateTooHigh", `{"base_url":"https://x.example","rate":2000000}`, "rate", "rate must be at most 1000000."},
		{"RateNotNumber", `{"base_url":"https://x.example","rate":"fast"}`, "rate", ""},
		{"CountUnknown", `{"base_url":"https://x.example","count":"bytes"}`, "count", "count must be one of: requests records."},
		{"RateInGroup", `{"base_url":"https://x.example","group":"gw","rate":5}`, "rate", "rate paces a source's own budget; the members of a gateway group share the group's."},
		{"CountRecordsInGroup", `{"base_url":"https://x.example","group":"gw","count":"records"}`, "count", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(request{method: "PUT", path: "/v1/sources/bad", secret: admin, body: tc.body})
			if r.status != http.StatusBadRequest {
				t.Fatalf("%d, want 400; body %s", r.status, r.body)
			}
			p := r.problem(t)
			if p.Field != tc.field || tc.detail != "" && p.Detail != tc.detail {
				t.Fatalf("field %q detail %q, want %q %q", p.Field, p.Detail, tc.field, tc.detail)
			}
		})
	}
}

// costProxy answers with the cost auditd passed to the fetch loop, or
// refuses it as the fetch loop refuses a cost its source never admits.
type costProxy struct{ max int }

func (c costProxy) Proxy(_ context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (auditd.ProxyMeta, error) {
	meta := auditd.ProxyMeta{RunID: req.RunID, ItemKey: "k"}
	if req.Cost > c.max {
		return meta, &auditd.Error{Code: auditd.ETOOLARGE, Field: "Auditd-Cost", Message: "Split the request into requests of at most " + strconv.Itoa(c.max) + "."}
	}
	io.WriteString(out.Start(200, http.Header{"Content-Type": {"text/plain"}}, &meta), strconv.Itoa(req.Cost))
	return meta, nil
}

// Auditd-Cost reaches the fetch loop as the request's cost (0 when
// absent: the loop charges 1); anything but a whole number from 1 to
// 1000000 is refused naming the header, and a cost the source can never
// admit is a 413 problem.
func TestProxyCostHeader(t *testing.T) {
	e := newEnv(t)
	e.srv.Proxy = costProxy{max: 120}
	op := e.secret[auth.RoleOperator]
	for _, tc := range []struct {
		name, cost string // "" sends no header
		status     int
		body       string
	}{
		{"Absent", "", 200, "0"},
		{"One", "1", 200, "1"},
		{"Seventy-five", "75", 200, "75"},
		{"AboveTheWindow", "150", 413, ""},
		{"Zero", "0", 400, ""},
		{"Negative", "-3", 400, ""},
		{"Plus", "+3", 400, ""},
		{"Fraction", "7.5", 400, ""},
		{"Space", "7 5", 400, ""},
		{"TooMany", "1000001", 400, ""},
		{"Empty", "EMPTY", 400, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{"Auditd-Run": "01J00000000000000000000001"}
			switch tc.cost {
			case "":
			case "EMPTY":
				h["Auditd-Cost"] = ""
			default:
				h["Auditd-Cost"] = tc.cost
			}
			r := e.do(request{method: "POST", path: "/proxy/county/upload", secret: op, header: h, body: "{}"})
			if r.status != tc.status {
				t.Fatalf("%d, want %d; body %s", r.status, tc.status, r.body)
			}
			if tc.status != 200 {
				if p := r.problem(t); p.Field != "Auditd-Cost" || r.header.Get("Auditd-Answer") != "auditd" {
					t.Fatalf("problem %+v, Auditd-Answer %q: want field Auditd-Cost from auditd", p, r.header.Get("Auditd-Answer"))
				}
				return
			}
			if string(r.body) != tc.body {
				t.Fatalf("cost passed on %q, want %q", r.body, tc.body)
			}
		})
	}
}

// FuzzProxyCostHeader: whatever Auditd-Cost holds, the answer is the cost
// passed through (a canonical whole number in range) or a 400 naming the
// header, never anything else.
func FuzzProxyCostHeader(f *testing.F) {
	for _, s := range []string{"1", "75", "1000000", "0", "-1", "007", "1e3", "0x10", "٣"} {
		f.Add(s)
	}
	e := newEnv(f)
	e.srv.Proxy = costProxy{max: 1 << 30}
	op := e.secret[auth.RoleOperator]
	f.Fuzz(func(t *testing.T, v string) {
		req, err := http.NewRequest("GET", e.url+"/proxy/county/x", nil)
		if err != nil {
			t.Skip()
		}
		req.Header.Set("Authorization", "Bearer "+op)
		req.Header.Set("Auditd-Run", "01J00000000000000000000001")
		req.Header["Auditd-Cost"] = []string{v}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Skip() // a value net/http will not send
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		w := strings.Trim(v, " \t") // a field value's surrounding whitespace is not part of it (RFC 9110)
		n, perr := strconv.Atoi(w)
		valid := perr == nil && n >= 1 && n <= 1_000_000 && w[0] != '+' && w[0] != '-'
		switch {
		case valid && (resp.StatusCode != 200 || string(body) != strconv.Itoa(n)):
			t.Fatalf("Auditd-Cost %q: %d %q, want 200 %d", v, resp.StatusCode, body, n)
		case !valid && resp.StatusCode != 400:
			t.Fatalf("Auditd-Cost %q: %d %q, want 400", v, resp.StatusCode, body)
		}
	})
}
