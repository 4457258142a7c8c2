package fetch_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
)

// upstream is an httptest server that records what reached it.
type upstream struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []*http.Request
	n    atomic.Int64
}

func newUpstream(tb testing.TB, h func(w http.ResponseWriter, r *http.Request, n int)) *upstream {
	u := &upstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := int(u.n.Add(1))
		u.mu.Lock()
		u.reqs = append(u.reqs, r.Clone(r.Context()))
		u.mu.Unlock()
		h(w, r, n)
	}))
	tb.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []*http.Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]*http.Request(nil), u.reqs...)
}

func countType(events []auditd.Event, typ auditd.EventType) int {
	n := 0
	for _, e := range events {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// A query with ';' goes upstream as the client wrote it (an upstream may
// read ';' as a separator, or as part of a value), and a credential after
// a ';' is redacted in the record all the same.
func TestProxySemicolonQuery(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{}`)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "county", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/county/query?outFields=a;b&x=1;token=client-secret-3", nil, nil)
	if r.status != 200 {
		t.Fatalf("proxied GET with ';': %d %s", r.status, r.body)
	}
	got := up.requests()
	if len(got) != 1 || got[0].URL.RawQuery != "outFields=a;b&x=1;token=client-secret-3" {
		t.Fatalf("upstream saw %d requests, query %q", len(got), got[0].URL.RawQuery)
	}
	e.finish(id)
	for _, ev := range e.events(id) {
		if strings.Contains(ev.Path, "client-secret-3") || strings.Contains(ev.ItemKey, "client-secret-3") {
			t.Errorf("%s %d keeps the credential: path %q, item %q", ev.Type, ev.Seq, ev.Path, ev.ItemKey)
		}
		if ev.Type == auditd.EventDispatch && !strings.Contains(ev.Path, "outFields=a;b&x=1;token=") {
			t.Errorf("dispatch path %q", ev.Path)
		}
	}
}

// A proxied GET reaches the upstream with the source's secret header and
// query parameter and without the client's credentials or hop-by-hop
// headers; the client gets the upstream's response with auditd's headers;
// the run records it as an item and reconciles; no secret is recorded.
func TestProxyForwards(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Auditd-Dispatch-Seq", "999") // spoofed: auditd's own wins
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "county", BaseURL: up.URL + "/arcgis", Limit: 1000, Window: auditd.Duration(time.Second),
		Headers: map[string]string{"X-Esri-Authorization": "Bearer hdr-secret-1"}, Query: map[string]string{"token": "qry-secret-2"}})
	id := e.proxyRun("")

	r := e.send("GET", id, "/proxy/county/rest/services/0/query?where=1%3D1&f=json", nil, map[string]string{
		"Authorization": "Bearer client-upstream-token",
		"Connection":    "X-Hop",
		"X-Hop":         "drop me",
		"X-Client":      "kept",
	})
	if r.status != 200 || string(r.body) != `{"path":"/arcgis/rest/services/0/query"}` {
		t.Fatalf("proxied GET: %d %s", r.status, r.body)
	}
	got := up.requests()
	if len(got) != 1 {
		t.Fatalf("upstream saw %d requests, want 1", len(got))
	}
	ur := got[0]
	if ur.Header.Get("X-Esri-Authorization") != "Bearer hdr-secret-1" || ur.URL.Query().Get("token") != "qry-secret-2" {
		t.Errorf("source credentials not added: header %q, query %q", ur.Header.Get("X-Esri-Authorization"), ur.URL.RawQuery)
	}
	if ur.URL.Query().Get("where") != "1=1" || ur.URL.Query().Get("f") != "json" {
		t.Errorf("client query not kept: %q", ur.URL.RawQuery)
	}
	for _, h := range []string{"Authorization", "Proxy-Authorization", "X-Hop", "Auditd-Run"} {
		if v := ur.Header.Get(h); v != "" {
			t.Errorf("upstream got %s: %q", h, v)
		}
	}
	if ur.Header.Get("X-Client") != "kept" {
		t.Errorf("client header X-Client not forwarded")
	}
	for k, v := range ur.Header {
		if strings.Contains(strings.Join(v, ","), e.token) {
			t.Errorf("upstream got the auditd token in %s", k)
		}
	}

	seq, _ := strconv.ParseUint(r.header.Get("Auditd-Dispatch-Seq"), 10, 64)
	if r.header.Get("Auditd-Run") != id || r.header.Get("Auditd-Attempts") != "1" || seq == 0 || r.header.Get("Auditd-Waited") == "" {
		t.Errorf("auditd headers: %v", r.header)
	}
	run := e.finish(id)
	if run.Status != auditd.RunSucceeded || run.Counts.Items != 1 || run.Counts.Succeeded != 1 || run.Counts.Staged != 1 {
		t.Fatalf("finished run: %+v", run)
	}
	events := e.events(id)
	var dispatch auditd.Event
	for _, ev := range events {
		if ev.Type == auditd.EventDispatch {
			dispatch = ev
		}
	}
	if dispatch.Seq != seq || dispatch.Path != "/rest/services/0/query?where=1%3D1&f=json" {
		t.Errorf("dispatch %d %q; the client was told %d", dispatch.Seq, dispatch.Path, seq)
	}
	for _, ev := range events {
		if ev.Type == auditd.EventRunFinished && ev.Reason != "finished by pipeline" && !strings.HasPrefix(ev.Reason, "finished by") {
			t.Errorf("run.finished reason %q", ev.Reason)
		}
	}
	e.reconcile(id)

	// The item's view, by its derived key (which holds slashes).
	var item auditd.ItemView
	key := "GET /rest/services/0/query?where=1%3D1&f=json"
	if st := e.call("GET", "/v1/runs/"+id+"/items/"+escapeSegment(key), "", &item); st != 200 || item.Result == nil || item.Result.Outcome != auditd.ItemSucceeded {
		t.Errorf("item %q: %d %+v", key, st, item)
	}
	assertNoSecrets(t, e, "hdr-secret-1", "qry-secret-2", "client-upstream-token")
}

// escapeSegment escapes a key as one path segment.
func escapeSegment(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' {
			b.WriteByte(c)
		} else {
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// assertNoSecrets fails when any secret appears in any ledger event, in
// the service's logs, or in a reconciliation of any run.
func assertNoSecrets(t *testing.T, e *proxyEnv, secrets ...string) {
	t.Helper()
	var all bytes.Buffer
	if err := e.ledger.Scan(1, 0, func(ev *auditd.Event) error {
		fmt.Fprintf(&all, "%+v\n", *ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	all.Write(e.logs.Bytes())
	for _, s := range secrets {
		if bytes.Contains(all.Bytes(), []byte(s)) {
			t.Errorf("secret %q is in the ledger or the logs", s)
		}
	}
}

// A 429 is retried by auditd after its Retry-After; the client sees one
// 200 with two attempts and the wait.
func TestProxyRetriesThrottle(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, n int) {
		if n == 1 {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, "ok")
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	start := time.Now()
	r := e.send("GET", id, "/proxy/s/x", nil, nil)
	if r.status != 200 || string(r.body) != "ok" || r.header.Get("Auditd-Attempts") != "2" {
		t.Fatalf("got %d %q attempts %q", r.status, r.body, r.header.Get("Auditd-Attempts"))
	}
	waited, _ := strconv.ParseFloat(r.header.Get("Auditd-Waited"), 64)
	if took := time.Since(start); took < 900*time.Millisecond || waited < 0.9 {
		t.Errorf("took %v, Auditd-Waited %v: the Retry-After was not honoured", took, waited)
	}
	e.finish(id)
	ev := e.events(id)
	if countType(ev, auditd.EventThrottle) != 1 || countType(ev, auditd.EventDispatch) != 2 || countType(ev, auditd.EventWait) == 0 {
		t.Errorf("throttles %d, dispatches %d, waits %d", countType(ev, auditd.EventThrottle), countType(ev, auditd.EventDispatch), countType(ev, auditd.EventWait))
	}
	e.reconcile(id)
}

// A request the gates cannot admit by its deadline gets a 503 with an
// honest Retry-After; with serve_stale and a last good copy it gets the
// copy, marked.
func TestProxyDeadlineAndStale(t *testing.T) {
	down := atomic.Bool{}
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) {
		if down.Load() {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		fmt.Fprint(w, `{"v":1}`)
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "plain", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	e.source(auditd.Source{ID: "stale", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second), Proxy: auditd.ProxyPolicy{ServeStale: true}})

	first := e.proxyRun("")
	if r := e.send("GET", first, "/proxy/stale/doc", nil, nil); r.status != 200 {
		t.Fatalf("first fetch: %d", r.status)
	}
	e.finish(first) // the last-good index learns the copy

	down.Store(true)
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/plain/doc", nil, map[string]string{"Auditd-Deadline": "1"})
	ra, _ := strconv.Atoi(r.header.Get("Retry-After"))
	if r.status != 503 || ra < 25 || ra > 31 || !strings.Contains(r.header.Get("Content-Type"), "problem+json") {
		t.Errorf("deadline: %d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	r = e.send("GET", id, "/proxy/stale/doc", nil, map[string]string{"Auditd-Deadline": "1"})
	if r.status != 200 || string(r.body) != `{"v":1}` || r.header.Get("Auditd-Stale") != "true" || r.header.Get("Auditd-Stale-Run") != first || r.header.Get("Age") == "" {
		t.Errorf("stale copy: %d %q %v", r.status, r.body, r.header)
	}
	run := e.finish(id)
	if run.Counts.Shed != 1 || run.Counts.Cached != 1 {
		t.Errorf("shed %d cached %d, want 1 and 1", run.Counts.Shed, run.Counts.Cached)
	}
	e.reconcile(id)
}

// A POST's body is forwarded and its hash recorded; without an
// Idempotency-Key a 503 is not retried but passed to the client.
func TestProxyPost(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, n int) {
		if r.URL.Path == "/fail" {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "down")
			return
		}
		var b bytes.Buffer
		b.ReadFrom(r.Body)
		fmt.Fprintf(w, "got %s", b.String())
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "grants", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	body := []byte(`{"keyword":"water"}`)
	r := e.send("POST", id, "/proxy/grants/search2", body, map[string]string{"Content-Type": "application/json", "Auditd-Item-Key": "search-1"})
	if r.status != 200 || string(r.body) != `got {"keyword":"water"}` || r.header.Get("Auditd-Item-Key") != "search-1" {
		t.Fatalf("POST: %d %q", r.status, r.body)
	}
	r = e.send("POST", id, "/proxy/grants/fail", body, nil)
	if r.status != 503 || string(r.body) != "down" || r.header.Get("Auditd-Attempts") != "1" {
		t.Errorf("POST without Idempotency-Key to a failing upstream: %d %q attempts %s", r.status, r.body, r.header.Get("Auditd-Attempts"))
	}
	r = e.send("POST", id, "/proxy/grants/search2", body, map[string]string{"Auditd-Item-Key": "search-1"})
	if r.status != 409 {
		t.Errorf("repeated item key: %d, want 409", r.status)
	}
	e.finish(id)
	sum := sha256.Sum256(body)
	found := false
	for _, ev := range e.events(id) {
		if ev.Type == auditd.EventItemQueued && ev.ItemKey == "search-1" {
			found = strings.Contains(ev.Detail, hex.EncodeToString(sum[:]))
		}
	}
	if !found {
		t.Errorf("the POST body's SHA-256 is not on its item.queued")
	}
	if n := up.n.Load(); n != 2 {
		t.Errorf("upstream saw %d requests, want 2", n)
	}
	e.reconcile(id)
}

// A body over the staging cap is passed through whole and recorded as not
// staged.
func TestProxyNotStaged(t *testing.T) {
	big := bytes.Repeat([]byte("x"), 3<<20)
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { w.Write(big) })
	e := newProxyEnvWith(t, proxyEnvOptions{noSync: true}, 1<<20)
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	r := e.send("GET", id, "/proxy/s/big", nil, nil)
	if r.status != 200 || !bytes.Equal(r.body, big) {
		t.Fatalf("got %d, %d bytes; want 200 and %d", r.status, len(r.body), len(big))
	}
	run := e.finish(id)
	if run.Counts.Staged != 0 || run.Counts.Failed != 1 {
		t.Errorf("staged %d failed %d", run.Counts.Staged, run.Counts.Failed)
	}
	for _, ev := range e.events(id) {
		if ev.Type == auditd.EventResponse && ev.Bytes != int64(len(big)) {
			t.Errorf("response records %d bytes, want %d", ev.Bytes, len(big))
		}
		if ev.Type == auditd.EventItemFinished && !strings.Contains(ev.Reason, "not staged") {
			t.Errorf("item.finished reason %q", ev.Reason)
		}
	}
	e.reconcile(id)
}

// A proxy-mode run that sees no request for its idle timeout ends, and
// says so on its run.finished.
func TestProxyIdleTimeout(t *testing.T) {
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	id := e.proxyRun(`,"idle_timeout":"200ms"`)
	deadline := time.Now().Add(5 * time.Second)
	for {
		var run auditd.RunView
		e.call("GET", "/v1/runs/"+id, "", &run)
		if run.Status.Terminal() {
			if run.Status != auditd.RunSucceeded {
				t.Errorf("status %s", run.Status)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("run still %s after 5s", run.Status)
		}
		time.Sleep(20 * time.Millisecond)
	}
	ev := e.events(id)
	if last := ev[len(ev)-1]; last.Type != auditd.EventRunFinished || !strings.Contains(last.Reason, "idle") {
		t.Errorf("last event %s %q", last.Type, last.Reason)
	}
	if st := e.call("POST", "/v1/runs/"+id+"/finish", "", nil); st != 409 {
		t.Errorf("finish a finished run: %d, want 409", st)
	}
}

// While the disk refuses the ledger's writes nothing leaves unrecorded:
// a request in flight when the writes start failing, and those sent while
// they fail, get a 503 with Retry-After and none reaches the upstream.
// Once the disk takes writes again the run goes on; finished, it holds
// one dispatch per request the upstream received (and one closed as not
// sent, when the first request's dispatch was queued before the stall
// showed), every dispatch has an outcome, and it reconciles.
func TestProxyLedgerStalled(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { fmt.Fprint(w, `{"ok":true}`) })
	var full atomic.Bool
	e := newProxyEnv(t, proxyEnvOptions{noSync: true, full: &full})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	if r := e.send("GET", id, "/proxy/s/before", nil, nil); r.status != 200 {
		t.Fatalf("before the disk filled: %d %s", r.status, r.body)
	}
	// The first request's records are on disk before the disk fills.
	for {
		var v auditd.RunView
		if e.call("GET", "/v1/runs/"+id, "", &v); v.Counts.Succeeded == 1 {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	full.Store(true)
	// The first request finds the ledger writing; its own records are
	// the first refused. Its deadline bounds how long it waits for them.
	first := e.send("GET", id, "/proxy/s/during", nil, map[string]string{"Auditd-Deadline": "2"})
	if _, err := e.ledger.Stalled(); err == nil {
		t.Fatal("the ledger does not say it is stalled")
	}
	second := e.send("GET", id, "/proxy/s/during2", nil, nil)
	for i, r := range []proxiedResp{first, second} {
		if r.status != 503 || r.header.Get("Retry-After") == "" || !strings.Contains(r.header.Get("Content-Type"), "problem+json") || r.header.Get("Auditd-Dispatch-Seq") != "" {
			t.Errorf("request %d while the disk is full: %d Retry-After %q %v %s", i+1, r.status, r.header.Get("Retry-After"), r.header, r.body)
		}
	}
	if n := up.n.Load(); n != 1 {
		t.Errorf("the upstream got %d requests, want the 1 sent before the disk filled", n)
	}

	full.Store(false)
	var r proxiedResp
	for range 200 { // the ledger retries its refused commit with a backoff
		if r = e.send("GET", id, "/proxy/s/after", nil, map[string]string{"Auditd-Item-Key": fmt.Sprintf("after %d", up.n.Load())}); r.status != 503 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r.status != 200 {
		t.Fatalf("after the disk took writes again: %d %s", r.status, r.body)
	}
	run := e.finish(id)
	ev := e.events(id)
	// A dispatch whose record was durable only after its request's
	// deadline was not sent, and is closed with dispatch.interrupted.
	interrupted := countType(ev, auditd.EventInterrupted)
	if got, want := countType(ev, auditd.EventDispatch), int(up.n.Load())+interrupted; got != want || run.Counts.Dispatches != want || interrupted > 1 {
		t.Errorf("%d dispatches on record (%d counted, %d interrupted), the upstream received %d", got, run.Counts.Dispatches, interrupted, up.n.Load())
	}
	t.Logf("the upstream received %d; %d dispatches on record, %d interrupted", up.n.Load(), run.Counts.Dispatches, interrupted)
	if run.Counts.Pending != 0 || run.Counts.Succeeded != 2 || run.Counts.Failed != 1 || run.Status != auditd.RunPartial {
		t.Errorf("run %s: %+v", run.Status, run.Counts)
	}
	e.reconcile(id)
}

// A POST is retried after a 5xx when the client sent an Idempotency-Key
// (forwarded upstream) or its source sets retry_post: the client gets the
// one final answer, the same body reached the upstream each time.
func TestProxyPostRetriedWhenSafe(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{} // path -> requests
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		var b bytes.Buffer
		b.ReadFrom(r.Body)
		mu.Lock()
		seen[r.URL.Path]++
		n := seen[r.URL.Path]
		mu.Unlock()
		if n == 1 {
			w.WriteHeader(http.StatusBadGateway)
			return
		}
		fmt.Fprintf(w, "%s %s", r.Header.Get("Idempotency-Key"), b.String())
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "grants", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second)})
	e.source(auditd.Source{ID: "search", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second), Proxy: auditd.ProxyPolicy{RetryPost: true}})
	id := e.proxyRun("")
	body := []byte(`{"keyword":"water"}`)

	r := e.send("POST", id, "/proxy/grants/keyed", body, map[string]string{"Idempotency-Key": "k-1"})
	if r.status != 200 || string(r.body) != `k-1 {"keyword":"water"}` || r.header.Get("Auditd-Attempts") != "2" {
		t.Errorf("POST with Idempotency-Key: %d %q attempts %s", r.status, r.body, r.header.Get("Auditd-Attempts"))
	}
	r = e.send("POST", id, "/proxy/search/policy", body, nil)
	if r.status != 200 || string(r.body) != ` {"keyword":"water"}` || r.header.Get("Auditd-Attempts") != "2" {
		t.Errorf("POST to a retry_post source: %d %q attempts %s", r.status, r.body, r.header.Get("Auditd-Attempts"))
	}
	run := e.finish(id)
	if run.Status != auditd.RunSucceeded || run.Counts.Dispatches != 4 || run.Counts.Status5xx != 2 {
		t.Errorf("run %s: %+v", run.Status, run.Counts)
	}
	for _, ur := range up.requests() {
		if ur.URL.Path == "/keyed" && ur.Header.Get("Idempotency-Key") != "k-1" {
			t.Errorf("the Idempotency-Key did not reach the upstream: %v", ur.Header)
		}
	}
	e.reconcile(id)
}

// Bad input is refused with a 4xx problem before anything is forwarded
// or written.
func TestProxyBadInput(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ int) { fmt.Fprint(w, "ok") })
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "s", BaseURL: up.URL + "/base", Limit: 1000, Window: auditd.Duration(time.Second)})
	id := e.proxyRun("")
	done := e.proxyRun("")
	e.finish(done)
	var batch auditd.RunView
	if st := e.call("POST", "/v1/runs", `{"name":"b","items":[{"key":"k","source":"s","path":"/x"}]}`, &batch); st != 201 {
		t.Fatalf("batch run: %d", st)
	}
	e.loop.Wait(t.Context(), batch.ID)
	before := up.n.Load()
	head, _ := e.ledger.Head()

	for _, tc := range []struct {
		name, method, path, run string
		body                    []byte
		header                  map[string]string
		want                    int
	}{
		{"UnknownSource", "GET", "/proxy/nowhere/x", id, nil, nil, 404},
		{"NoRunHeader", "GET", "/proxy/s/x", "", nil, nil, 400},
		{"BadRunHeader", "GET", "/proxy/s/x", "not-a-run", nil, nil, 400},
		{"UnknownRun", "GET", "/proxy/s/x", "01JZZZZZZZZZZZZZZZZZZZZZZZ", nil, nil, 404},
		{"FinishedRun", "GET", "/proxy/s/x", done, nil, nil, 409},
		{"BatchRun", "GET", "/proxy/s/x", batch.ID, nil, nil, 409},
		{"Put", "PUT", "/proxy/s/x", id, []byte("{}"), nil, 405},
		{"Delete", "DELETE", "/proxy/s/x", id, nil, nil, 405},
		{"Patch", "PATCH", "/proxy/s/x", id, []byte("{}"), nil, 405},
		{"Options", "OPTIONS", "/proxy/s/x", id, nil, nil, 405},
		{"HeadWithBody", "HEAD", "/proxy/s/x", id, []byte("body"), nil, 400},
		{"Oversized", "POST", "/proxy/s/x", id, bytes.Repeat([]byte("a"), 2<<20), nil, 413},
		{"GetWithBody", "GET", "/proxy/s/x", id, []byte("body"), nil, 400},
		{"BadItemKey", "GET", "/proxy/s/x", id, nil, map[string]string{"Auditd-Item-Key": strings.Repeat("k", 201)}, 400},
		{"BadDeadline", "GET", "/proxy/s/x", id, nil, map[string]string{"Auditd-Deadline": "forever"}, 400},
		{"NoSourcePath", "GET", "/proxy/s", id, nil, nil, 404},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.send(tc.method, tc.run, tc.path, tc.body, tc.header)
			if r.status != tc.want || !strings.Contains(r.header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%s %s: %d %s (%s), want %d problem+json", tc.method, tc.path, r.status, r.body, r.header.Get("Content-Type"), tc.want)
			}
		})
	}
	// Traversal, sent raw so that no client cleans the path first.
	for _, p := range []string{"/proxy/s/../../v1/tokens", "/proxy/s/a/%2e%2e/b", "/proxy/s/%2E%2E%2Fx", "/proxy/s/a/./b", "/proxy/s/a%5C..%5Cb"} {
		status, ctype := rawRequest(t, e.srv.URL, "GET "+p+" HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Bearer "+e.token+"\r\nAuditd-Run: "+id+"\r\nConnection: close\r\n\r\n")
		if status != 400 || !strings.Contains(ctype, "problem+json") {
			t.Errorf("traversal %s: %d %s, want 400 problem+json", p, status, ctype)
		}
	}
	if n := up.n.Load(); n != before {
		t.Errorf("the upstream got %d requests from bad input", n-before)
	}
	if after, _ := e.ledger.Head(); after != head {
		t.Errorf("bad input wrote %d ledger events", after-head)
	}
}

// rawRequest sends a request as written and returns the status and
// Content-Type.
func rawRequest(t *testing.T, base, raw string) (int, string) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte(raw))
	resp, err := http.ReadResponse(bufioReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Content-Type")
}

// A source that serves stale copies answers a GET whose attempts ran out
// on 5xx from its last good copy, but never a POST that may not be
// retried: that one was sent and may have done what it asked, so its one
// answer, the 503, is the client's.
func TestProxyStaleOnlyWhenAttemptsRanOut(t *testing.T) {
	var down atomic.Bool
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		if down.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, "down")
			return
		}
		fmt.Fprint(w, "fresh")
	})
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "grants", BaseURL: up.URL, Limit: 1000, Window: auditd.Duration(time.Second), MaxAttempts: 2,
		Proxy: auditd.ProxyPolicy{ServeStale: true}})
	body := []byte(`{"keyword":"water"}`)
	first := e.proxyRun("")
	if r := e.send("POST", first, "/proxy/grants/search2", body, nil); r.status != 200 {
		t.Fatalf("first POST: %d %q", r.status, r.body)
	}
	if r := e.send("GET", first, "/proxy/grants/doc", nil, nil); r.status != 200 {
		t.Fatalf("first GET: %d %q", r.status, r.body)
	}
	e.finish(first)

	down.Store(true)
	id := e.proxyRun("")
	r := e.send("POST", id, "/proxy/grants/search2", body, nil)
	if r.status != 503 || string(r.body) != "down" || r.header.Get("Auditd-Stale") != "" {
		t.Errorf("POST without Idempotency-Key to a failing upstream: %d %q stale %q, want its own 503", r.status, r.body, r.header.Get("Auditd-Stale"))
	}
	r = e.send("GET", id, "/proxy/grants/doc", nil, nil)
	if r.status != 200 || string(r.body) != "fresh" || r.header.Get("Auditd-Stale") != "true" || r.header.Get("Auditd-Attempts") != "2" {
		t.Errorf("GET whose attempts ran out: %d %q stale %q attempts %s, want the copy after 2", r.status, r.body, r.header.Get("Auditd-Stale"), r.header.Get("Auditd-Attempts"))
	}
	v := e.finish(id)
	if v.Counts.Cached != 1 || v.Counts.Failed != 1 {
		t.Errorf("cached %d failed %d, want 1 and 1", v.Counts.Cached, v.Counts.Failed)
	}
	e.reconcile(id)
}
