package fetch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/internal/nginxtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// realLoop is a fetch loop on real parts and the real clock, sending with
// client (nil: the default client).
type realLoop struct {
	loop  *fetch.Loop
	store *runs.Store
	led   *ledger.Ledger
}

func newRealLoop(t *testing.T, cfg fetch.Config) *realLoop {
	t.Helper()
	dir := t.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	db.NoSync = true
	clk := clock.Real{}
	led, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { led.Close(context.Background()) })
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clk, DefaultLimit: 20, DefaultWindow: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stage, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		t.Fatal(err)
	}
	store, err := runs.Open(db, runs.Options{Ledger: led, Payloads: stage, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ledger, cfg.Runs, cfg.Registry, cfg.Limiter, cfg.Staging = led, store, reg, limiter.New(clk), stage
	cfg.Clock, cfg.Logger = clk, slog.New(slog.DiscardHandler)
	loop, err := fetch.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := loop.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { loop.Close(context.Background()) })
	return &realLoop{loop: loop, store: store, led: led}
}

// run submits items and waits for the run to end; it returns the run and
// its events.
func (r *realLoop) run(t *testing.T, items []auditd.Item) (auditd.RunView, []auditd.Event) {
	t.Helper()
	v, _, err := r.loop.Submit(context.Background(), auditd.NewRun{Name: t.Name(), Items: items, Principal: "test"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if v, err = r.loop.Wait(ctx, v.ID); err != nil {
		t.Fatal(err)
	}
	var events []auditd.Event
	if err := r.led.ScanRun(v.ID, 0, func(e *auditd.Event) error {
		events = append(events, *e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return v, events
}

// TestRedirectsAreNotFollowed: against a real nginx, a redirect of every
// kind (same host, a loop, another host, a POST answered 302 and 307, a
// Location with userinfo) is the outcome of its one dispatch, recorded as
// it came: nginx logs exactly the requests the ledger dispatched, the
// method recorded is the one sent, and no Location's credentials reach a
// record.
func TestRedirectsAreNotFollowed(t *testing.T) {
	ng := nginxtest.Start(t, nginxtest.Config{Template: "redirect.conf.tmpl"})
	r := newRealLoop(t, fetch.Config{MaxAttempts: 3})
	if _, err := r.loop.PutSource(context.Background(), "test", auditd.Source{ID: "nginx", BaseURL: ng.URL}); err != nil {
		t.Fatal(err)
	}
	want := map[string]struct {
		method string
		status int
	}{
		"ok":      {"GET", 200},
		"same":    {"GET", 302},
		"loop":    {"GET", 302},
		"cross":   {"GET", 302},
		"post302": {"POST", 302},
		"post307": {"POST", 307},
		"moved":   {"GET", 301},
	}
	var items []auditd.Item
	for key, w := range want {
		path := "/" + key
		if key == "ok" {
			path = "/api/ok"
		}
		it := auditd.Item{Key: key, SourceID: "nginx", Method: w.method, Path: path}
		if w.method == "POST" {
			it.Body = []byte(`{"q":1}`)
		}
		items = append(items, it)
	}
	v, events := r.run(t, items)
	ng.Stop(t)

	dispatches, responses := map[string]auditd.Event{}, map[string]auditd.Event{}
	n := 0
	for _, e := range events {
		switch e.Type {
		case auditd.EventDispatch:
			n++
			if _, dup := dispatches[e.ItemKey]; dup {
				t.Errorf("item %s dispatched twice", e.ItemKey)
			}
			dispatches[e.ItemKey] = e
		case auditd.EventResponse:
			responses[e.ItemKey] = e
		}
		b, _ := json.Marshal(e)
		for _, secret := range []string{"LOCATIONSECRET", "USERINFOSECRET"} {
			if strings.Contains(string(b), secret) {
				t.Errorf("event %d (%s) holds %s: %s", e.Seq, e.Type, secret, b)
			}
		}
	}
	if got := ng.Requests(t); got != n || n != len(want) {
		t.Errorf("nginx logged %d requests, the ledger dispatched %d, for %d items", got, n, len(want))
	}
	for key, w := range want {
		if d := dispatches[key]; d.Method != w.method {
			t.Errorf("%s: dispatched %q, want %q", key, d.Method, w.method)
		}
		if got := responses[key].Status; got != w.status {
			t.Errorf("%s: response %d, want %d", key, got, w.status)
		}
	}
	for _, key := range []string{"same", "cross", "moved"} {
		it, err := r.store.Item(context.Background(), v.ID, key)
		if err != nil {
			t.Fatal(err)
		}
		if it.Result == nil || it.Result.Outcome != auditd.ItemFailed || !strings.Contains(it.Result.Reason, "not followed") {
			t.Errorf("%s: result %+v, want failed: redirect not followed", key, it.Result)
		}
		if key == "cross" && !strings.Contains(it.Result.Reason, "sig=REDACTED") {
			t.Errorf("cross: reason %q does not show the redacted Location", it.Result.Reason)
		}
	}
	if v.Counts.Succeeded != 1 || v.Counts.Failed != len(want)-1 {
		t.Errorf("counts %+v, want 1 succeeded and %d failed", v.Counts, len(want)-1)
	}
}

// TestAddressPolicyRefusesAtConnect: a source whose address the policy
// denies (the metadata address; loopback once denied) fails its item at
// its first dispatch, without a retry, naming the rule; loopback is
// allowed by default.
func TestAddressPolicyRefusesAtConnect(t *testing.T) {
	ng := nginxtest.Start(t, nginxtest.Config{Template: "redirect.conf.tmpl"})
	for _, tc := range []struct {
		name       string
		deny       []string
		base       string
		wantFailed bool
	}{
		{"LoopbackAllowedByDefault", nil, ng.URL, false},
		{"Metadata", nil, "http://169.254.169.254", true},
		{"MetadataIPv6", nil, "http://[fd00:ec2::254]", true},
		{"LinkLocal", nil, "http://169.254.10.20:8080", true},
		{"LoopbackDenied", []string{"127.0.0.0/8"}, ng.URL, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			policy, err := fetch.NewPolicy(nil, tc.deny)
			if err != nil {
				t.Fatal(err)
			}
			opts := fetch.DefaultClientOptions()
			opts.Policy = policy
			r := newRealLoop(t, fetch.Config{Client: fetch.NewClient(opts), MaxAttempts: 3})
			if _, err := r.loop.PutSource(context.Background(), "test", auditd.Source{ID: "s", BaseURL: tc.base}); err != nil {
				t.Fatal(err)
			}
			v, events := r.run(t, []auditd.Item{{Key: "k", SourceID: "s", Path: "/api/ok?token=POLICYSECRET"}})
			if tc.wantFailed != (v.Counts.Failed == 1) {
				t.Fatalf("counts %+v, want failed %v", v.Counts, tc.wantFailed)
			}
			dispatches := 0
			for _, e := range events {
				if e.Type == auditd.EventDispatch {
					dispatches++
				}
				if strings.Contains(e.ErrorText+e.Path+e.Reason, "POLICYSECRET") {
					t.Errorf("event %d (%s) holds the credential", e.Seq, e.Type)
				}
				if tc.wantFailed && e.Type == auditd.EventTransportError && !strings.Contains(e.ErrorText, "upstream address policy") {
					t.Errorf("transport error %q does not name the policy", e.ErrorText)
				}
			}
			if dispatches != 1 {
				t.Errorf("%d dispatches, want 1 (a refusal is not retried)", dispatches)
			}
		})
	}
}

func TestAddrPolicyRules(t *testing.T) {
	p, err := fetch.NewPolicy([]string{"169.254.10.0/24", "10.1.0.0/16"}, []string{"10.0.0.0/8", "10.1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1", true}, {"::1", true}, {"93.184.216.34", true},
		{"169.254.169.254", false}, {"::ffff:169.254.169.254", false}, {"fd00:ec2::254", false}, {"fe80::1", false},
		{"0.0.0.0", false}, {"::", false},
		{"169.254.10.7", true},                  // allowed: more specific than the built-in deny
		{"10.9.9.9", false}, {"10.1.9.9", true}, // the /16 allow inside the /8 deny
		{"10.1.2.3", false}, // and a /32 deny inside that
	} {
		ok, by := p.Allows(mustAddr(t, tc.addr))
		if ok != tc.ok {
			t.Errorf("Allows(%s) = %v (%s), want %v", tc.addr, ok, by, tc.ok)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "example.com", ""} {
		if _, err := fetch.NewPolicy([]string{bad}, nil); err == nil {
			t.Errorf("NewPolicy(%q) accepted", bad)
		}
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(fmt.Errorf("%s: %w", s, err))
	}
	return a
}
