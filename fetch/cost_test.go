package fetch_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// quietScenario is a harness whose simulated upstreams go unused: the
// tests here bring a recordsUpstream of their own.
const quietScenario = `
name: quiet
seed: 1
upstreams:
  - name: unused
    path: /unused
`

// seedSource is the batch-upload seed's gateway client: 120 records in any
// second, a bucket refilled at 50 records a second holding 200.
func seedSource(h *harness, t *testing.T, baseURL string) {
	t.Helper()
	src := auditd.Source{ID: "mro", BaseURL: baseURL, Limit: 120, Window: auditd.Duration(time.Second), Rate: 50, Burst: 200,
		Concurrency: 4, Proxy: auditd.ProxyPolicy{Deadline: auditd.Duration(10 * time.Second)}}
	if _, err := h.loop.PutSource(context.Background(), "test", src); err != nil {
		t.Fatal(err)
	}
}

// proxyOn runs req through the loop on the harness's fake clock, driving
// the clock while it waits, and returns its answer.
func proxyOn(t *testing.T, h *harness, req *auditd.ProxyRequest) (*memResponder, auditd.ProxyMeta, error) {
	t.Helper()
	out := &memResponder{}
	type end struct {
		meta auditd.ProxyMeta
		err  error
	}
	done := make(chan end, 1)
	go func() {
		meta, err := h.loop.Proxy(context.Background(), req, out)
		done <- end{meta, err}
	}()
	var e end
	if !h.drive(func() bool {
		select {
		case e = <-done:
			return true
		default:
			return false
		}
	}, 10_000) {
		t.Fatalf("proxied %s %s never ended", req.Method, req.ItemKey)
	}
	return out, e.meta, e.err
}

// TestProxySeedWorkedExample is the seed's worked example through a
// proxied source, on the fake clock: a POST of 150 records is refused at
// once, naming the window's limit of 120 to split under, with nothing
// recorded or sent; split in two, the first 75 goes at once (125 tokens
// left), the second, sent a quarter second later, is deferred 750ms by
// the window (a client that allows it less is told so and not sent), then
// goes exactly when the first 75 leave the window. The gateway counting
// records sees all 150, never more than 120 in a second.
func TestProxySeedWorkedExample(t *testing.T) {
	h := newHarness(t, quietScenario)
	up := &recordsUpstream{clk: h.clk, ceiling: 120, window: time.Second}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	seedSource(h, t, srv.URL)
	ctx := context.Background()
	pr, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "uploads", Mode: auditd.RunProxy, IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	// post sends n records; one that has to wait goes with the clock
	// driven (proxyOn), one that must not is sent as is, so that no timer
	// fires while it is under way.
	post := func(key string, n int, deadline time.Duration) (*memResponder, auditd.ProxyMeta, error) {
		req := &auditd.ProxyRequest{RunID: pr.ID, SourceID: "mro", Method: "POST", Path: "/records",
			Body: recordsBody(n, key), ItemKey: key, Cost: n, Deadline: deadline, Idempotent: true}
		if deadline > time.Second {
			return proxyOn(t, h, req)
		}
		out := &memResponder{}
		meta, err := h.loop.Proxy(ctx, req, out)
		return out, meta, err
	}

	head, _ := h.ledger.Head()
	_, _, err = post("apu-150", 150, time.Second)
	if auditd.ErrorCode(err) != auditd.ETOOLARGE || !strings.Contains(err.Error(), "exceeds its window's limit of 120 per 1s") ||
		!strings.Contains(err.Error(), "at most 120") {
		t.Fatalf("150 records: %v, want too_large naming the window's 120 per 1s", err)
	}
	if after, _ := h.ledger.Head(); after != head || len(up.snapshot()) != 0 {
		t.Fatalf("the refused 150 was recorded (head %d to %d) or sent (%d)", head, after, len(up.snapshot()))
	}

	t0 := h.clk.Now()
	out, _, err := post("apu-75a", 75, time.Second)
	if err != nil || out.status != 200 {
		t.Fatalf("first 75: %d %v", out.status, err)
	}
	st, _ := h.lim.State("mro")
	spent := h.clk.Now().Sub(t0)
	if want := 125 + 50*spent.Seconds(); st.Tokens != want {
		t.Fatalf("tokens %v after the first 75 (%v on), want %v", st.Tokens, spent, want)
	}

	h.clk.Advance(t0.Add(250 * time.Millisecond).Sub(h.clk.Now()))
	_, meta, err := post("apu-75b", 75, 500*time.Millisecond)
	if auditd.ErrorCode(err) != auditd.EUNAVAILABLE || meta.RetryAfter != time.Second || len(up.snapshot()) != 1 {
		t.Fatalf("second 75 with 500ms to wait: %v, Retry-After %v, want unavailable with 1s (750ms rounded up to a whole second) and nothing sent", err, meta.RetryAfter)
	}
	out, _, err = post("apu-75c", 75, 2*time.Second)
	if err != nil || out.status != 200 {
		t.Fatalf("second 75 with 2s to wait: %d %v", out.status, err)
	}

	var dispatched []auditd.Event
	var waits, sheds []auditd.Event
	for _, ev := range runEvents(t, h, pr.ID) {
		switch ev.Type {
		case auditd.EventDispatch:
			dispatched = append(dispatched, ev)
		case auditd.EventWait:
			waits = append(waits, ev)
		case auditd.EventShed:
			sheds = append(sheds, ev)
		}
	}
	if len(dispatched) != 2 || dispatched[0].Detail != `{"cost":75}` || dispatched[1].Detail != `{"cost":75}` {
		t.Fatalf("dispatches %+v, want two of cost 75", dispatched)
	}
	if gap := dispatched[1].Time.Sub(dispatched[0].Time); gap != time.Second {
		t.Fatalf("the second 75 left %v after the first, want exactly the window's 1s", gap)
	}
	if len(sheds) != 1 || sheds[0].ItemKey != "apu-75b" || sheds[0].Gate != "rate" {
		t.Fatalf("sheds %+v, want apu-75b's at the rate gate", sheds)
	}
	// Both were told 750ms at the rate gate; the one that could wait did.
	if len(waits) != 2 || waits[0].ItemKey != "apu-75b" || waits[1].ItemKey != "apu-75c" ||
		waits[0].Gate != "rate" || waits[0].Wait != 750*time.Millisecond || waits[0].Actual != 0 ||
		waits[1].Gate != "rate" || waits[1].Wait != 750*time.Millisecond || waits[1].Actual != 750*time.Millisecond {
		t.Fatalf("waits %+v, want apu-75b's and apu-75c's 750ms at the rate gate", waits)
	}
	arr := up.snapshot()
	total := 0
	for _, a := range arr {
		if !a.accepted {
			t.Fatalf("the gateway refused %d records at %v", a.records, a.at.Sub(t0))
		}
		total += a.records
	}
	if total != 150 || busiest(arr, time.Second) > 120 {
		t.Fatalf("the gateway took %d records, at most %d in a second; want 150, at most 120", total, busiest(arr, time.Second))
	}

	// The reconciliation holds the source to its ceiling in records (R9):
	// its busiest window holds one batch, 75 of 120.
	rep, err := reports.NewReconciler(h.ledger).Reconcile(ctx, pr.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Control) != 1 {
		t.Fatalf("control evidence %+v, want mro's", rep.Control)
	}
	if c := rep.Control[0]; c.SourceID != "mro" || c.Unit != reports.UnitRecords || c.Peak != 75 || c.Requests != 1 ||
		c.Limit != 120 || c.Burst != 0 || c.Window != time.Second || !c.Within || c.PeakSeq != dispatched[0].Seq {
		t.Errorf("control evidence %+v, want mro's 75 records in one request against 120 per 1s at seq %d", c, dispatched[0].Seq)
	}
	for _, c := range rep.Checks {
		if c.ID == reports.R9 && (c.Status != reports.StatusPass || c.Expected != 2 || c.Actual != 2) {
			t.Errorf("R9 %+v, want both dispatches within", c)
		}
	}
}

// A batch run's items are charged their cost: an item that can never fit
// is refused with the run, naming the field and the bound; two items of 75
// go a window apart, each dispatch recording its cost.
func TestBatchItemCost(t *testing.T) {
	h := newHarness(t, quietScenario)
	up := &recordsUpstream{clk: h.clk, ceiling: 120, window: time.Second}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	seedSource(h, t, srv.URL)
	ctx := context.Background()
	item := func(key string, n int) auditd.Item {
		return auditd.Item{Key: key, SourceID: "mro", Method: "POST", Path: "/records", Body: recordsBody(n, key), Cost: n}
	}
	_, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "too big", Items: []auditd.Item{item("ok", 1), item("big", 150)}})
	var e *auditd.Error
	if auditd.ErrorCode(err) != auditd.EINVALID || !asError(err, &e) || e.Field != "items[1].cost" || !strings.Contains(e.Message, "at most 120") {
		t.Fatalf("an item of 150: %v, want invalid items[1].cost naming 120", err)
	}
	run, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "uploads", Items: []auditd.Item{item("a", 75), item("b", 75)}})
	if err != nil {
		t.Fatal(err)
	}
	if v := h.finish(t, run.ID); v.Status != auditd.RunSucceeded {
		t.Fatalf("run %s: %+v", v.Status, v.Counts)
	}
	var dispatched []auditd.Event
	for _, ev := range runEvents(t, h, run.ID) {
		if ev.Type == auditd.EventDispatch {
			dispatched = append(dispatched, ev)
		}
	}
	if len(dispatched) != 2 || dispatched[0].Detail != `{"cost":75}` || dispatched[1].Detail != `{"cost":75}` {
		t.Fatalf("dispatches %+v, want two of cost 75", dispatched)
	}
	if gap := dispatched[1].Time.Sub(dispatched[0].Time); gap != time.Second {
		t.Fatalf("the second item left %v after the first, want the window's 1s", gap)
	}
	if arr := up.snapshot(); len(arr) != 2 || !arr[0].accepted || !arr[1].accepted {
		t.Fatalf("the gateway saw %+v", arr)
	}
}

func runEvents(t *testing.T, h *harness, id string) []auditd.Event {
	t.Helper()
	var out []auditd.Event
	if err := h.ledger.ScanRun(id, 0, func(ev *auditd.Event) error {
		out = append(out, *ev)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return out
}

func asError(err error, target **auditd.Error) bool {
	e, ok := err.(*auditd.Error)
	if ok {
		*target = e
	}
	return ok
}

// A restart counts what was sent before it at its cost: a run after the
// restart finds the window holding the 100 records sent just before, and
// its 75 wait until they leave, as they would have without the restart.
func TestRestartCountsCosts(t *testing.T) {
	h := newHarness(t, quietScenario)
	up := &recordsUpstream{clk: h.clk, ceiling: 120, window: time.Second}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	seedSource(h, t, srv.URL)
	ctx := context.Background()
	item := func(key string, n int) auditd.Item {
		return auditd.Item{Key: key, SourceID: "mro", Method: "POST", Path: "/records", Body: recordsBody(n, key), Cost: n}
	}
	before, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "before", Items: []auditd.Item{item("a", 100)}})
	if err != nil {
		t.Fatal(err)
	}
	h.finish(t, before.ID)
	sentAt := func(id string) time.Time {
		for _, ev := range runEvents(t, h, id) {
			if ev.Type == auditd.EventDispatch {
				return ev.Time
			}
		}
		t.Fatalf("run %s sent nothing", id)
		return time.Time{}
	}
	t0 := sentAt(before.ID)

	h.close(t)
	h.open(t, h.dir)
	if !h.clk.Now().Before(t0.Add(time.Second)) {
		t.Fatalf("the restart took %v of fake time: the window has passed", h.clk.Now().Sub(t0))
	}
	after, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "after", Items: []auditd.Item{item("b", 75)}})
	if err != nil {
		t.Fatal(err)
	}
	h.finish(t, after.ID)
	if gap := sentAt(after.ID).Sub(t0); gap != time.Second {
		t.Fatalf("75 records sent %v after the 100 sent before the restart, want the window's 1s", gap)
	}
	if most := busiest(up.snapshot(), time.Second); most > 120 {
		t.Fatalf("the gateway saw %d records in a second", most)
	}
}

// refuseFirst answers the first POST with 429 and Retry-After: 1, and
// every later one with 200.
type refuseFirst struct {
	mu sync.Mutex
	n  int
}

func (u *refuseFirst) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.n++
	n := u.n
	u.mu.Unlock()
	if n == 1 {
		w.Header().Set("Retry-After", "1")
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	io.WriteString(w, `{"accepted":true}`)
}

// A keyed POST the upstream refused is not charged beside its retry: the
// retry of 150 records goes when the Retry-After ends, where the same
// POST without a key (retried for proxy.retry_post) is charged twice and
// waits another second for the bucket to refill.
func TestProxyKeyedRetryChargedOnce(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy auditd.ProxyPolicy
		header bool // sends an Idempotency-Key
		gap    time.Duration
	}{
		{"IdempotencyKey", auditd.ProxyPolicy{}, true, time.Second},
		{"KeyOnBody", auditd.ProxyPolicy{KeyOnBody: true}, false, time.Second},
		{"NotKeyed", auditd.ProxyPolicy{RetryPost: true}, false, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, quietScenario)
			srv := httptest.NewServer(&refuseFirst{})
			t.Cleanup(srv.Close)
			tc.policy.Deadline = auditd.Duration(10 * time.Second)
			src := auditd.Source{ID: "mro", BaseURL: srv.URL, Limit: 200, Window: auditd.Duration(time.Second), Rate: 50, Burst: 200,
				Proxy: tc.policy}
			if _, err := h.loop.PutSource(context.Background(), "test", src); err != nil {
				t.Fatal(err)
			}
			pr, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "uploads", Mode: auditd.RunProxy, IdleTimeout: time.Hour})
			if err != nil {
				t.Fatal(err)
			}
			out, _, err := proxyOn(t, h, &auditd.ProxyRequest{RunID: pr.ID, SourceID: "mro", Method: "POST", Path: "/records",
				Body: recordsBody(150, "b"), ItemKey: "b", Cost: 150, Idempotent: tc.header})
			if err != nil || out.status != 200 {
				t.Fatalf("%d %v", out.status, err)
			}
			var sent []time.Time
			for _, ev := range runEvents(t, h, pr.ID) {
				if ev.Type == auditd.EventDispatch {
					sent = append(sent, ev.Time)
				}
			}
			if len(sent) != 2 || sent[1].Sub(sent[0]) != tc.gap {
				t.Fatalf("dispatches at %v, want two %v apart", sent, tc.gap)
			}
		})
	}
}
