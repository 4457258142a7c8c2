package fetch_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// fastUpstream answers every request at once with a small JSON body.
func fastUpstream(t testing.TB) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"features":[]}`)
	}))
	t.Cleanup(up.Close)
	return up
}

// listAllItems lists a run's items by cursor, a page of 1,000 at a time,
// and returns their keys in order.
func listAllItems(t testing.TB, e *proxyEnv, id string) []string {
	t.Helper()
	var keys []string
	cursor := ""
	for {
		var page struct {
			Items      []auditd.ItemView `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		path := "/v1/runs/" + id + "/items?limit=1000"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		if st := e.call("GET", path, "", &page); st != 200 {
			t.Fatalf("list items of %s: %d", id, st)
		}
		for _, it := range page.Items {
			if it.Result == nil {
				t.Fatalf("item %q has no result", it.Key)
			}
			keys = append(keys, it.Key)
		}
		if page.NextCursor == "" {
			return keys
		}
		cursor = page.NextCursor
	}
}

// TestProxyRunPassesAHundredThousandItems: a proxy-mode run takes
// requests until it is finished, past the 100,000 that were once the
// most a run held, and every one is recorded, listed and reconciled.
func TestProxyRunPassesAHundredThousandItems(t *testing.T) {
	if testing.Short() {
		t.Skip("100,001 proxied requests; not in -short")
	}
	if raceEnabled {
		t.Skip("100,001 proxied requests take minutes under the race detector; make test runs this test without it")
	}
	up := fastUpstream(t)
	e := newProxyEnv(t, proxyEnvOptions{noSync: true, startLimit: 1_000_000})
	e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 1000})
	id := e.proxyRun(`,"idle_timeout":"1h"`)

	const n, workers = 100_001, 32
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = workers
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: time.Minute}
	var next atomic.Int64
	var failed atomic.Int64
	var firstErr sync.Once
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < n; i = next.Add(1) - 1 {
				if err := benchGet(client, fmt.Sprintf("%s/proxy/fast/q?n=%d", e.srv.URL, i), e.token, id); err != nil {
					failed.Add(1)
					firstErr.Do(func() { t.Errorf("request %d: %v", i, err) })
				}
			}
		}()
	}
	wg.Wait()
	if failed.Load() > 0 {
		t.Fatalf("%d of %d proxied requests failed", failed.Load(), n)
	}
	v := e.finish(id)
	if v.Status != auditd.RunSucceeded || v.ItemCount != n || v.Counts.Items != n || v.Counts.Succeeded != n {
		t.Fatalf("run %s: %d items (%d counted), %d succeeded; want %d", v.Status, v.ItemCount, v.Counts.Items, v.Counts.Succeeded, n)
	}
	if keys := listAllItems(t, e, id); len(keys) != n || keys[0] != "GET /q?n=0" && !strings.HasPrefix(keys[0], "GET /q?n=") {
		t.Fatalf("listed %d items, want %d", len(keys), n)
	}
	if rep := e.reconcile(id); !rep.Balanced {
		t.Fatal("the run does not reconcile")
	}
}

// pageBody is the JSON of a page of items: keys prefix-from to
// prefix-(from+n-1).
func pageBody(from, n int, extra string) string {
	var b strings.Builder
	b.WriteString(`{` + extra + `"items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"key":"item-%06d","source":"fast","path":"/q?n=%d"}`, from+i, from+i)
	}
	b.WriteString(`]}`)
	return b.String()
}

// TestOpenBatchRunInPages: a batch run created open takes its items in
// pages; it does not end when the items it has end, only once it is
// finished and they have; a page with a key the run has is refused whole;
// the run lists and reconciles as one.
func TestOpenBatchRunInPages(t *testing.T) {
	up := fastUpstream(t)
	e := newProxyEnv(t, proxyEnvOptions{noSync: true, startLimit: 1_000_000})
	e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 8})

	var run auditd.RunView
	if st := e.call("POST", "/v1/runs", pageBody(0, 300, `"name":"paged","open":true,`), &run); st != 201 || !run.Open || run.ItemCount != 300 {
		t.Fatalf("create open run: %d %+v", st, run.Run)
	}
	id := run.ID
	// The first page ends; the run, open, does not.
	deadline := time.Now().Add(time.Minute)
	for {
		v, err := e.store.Run(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if v.Counts.Done() == 300 {
			if v.Status != auditd.RunRunning || !v.Open {
				t.Fatalf("the open run ended with its first page: %s, open %v", v.Status, v.Open)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the first page never ended: %+v", v.Counts)
		}
		time.Sleep(time.Millisecond)
	}

	if st := e.call("POST", "/v1/runs/"+id+"/items", pageBody(300, 300, ""), &run); st != 200 || run.ItemCount != 600 {
		t.Fatalf("second page: %d, %d items", st, run.ItemCount)
	}
	// A page repeating a key of the run is refused whole, naming the item.
	dup := `{"items":[{"key":"item-fresh","source":"fast","path":"/x"},{"key":"item-000123","source":"fast","path":"/y"}]}`
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/runs/"+id+"/items", strings.NewReader(dup))
	req.Header.Set("Authorization", "Bearer "+e.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var problem struct {
		Field string `json:"field"`
	}
	err = json.NewDecoder(resp.Body).Decode(&problem)
	resp.Body.Close()
	if resp.StatusCode != 400 || err != nil || problem.Field != "items[1].key" {
		t.Fatalf("a page repeating a key of the run: %d naming %q (%v), want 400 naming items[1].key", resp.StatusCode, problem.Field, err)
	}
	if st := e.call("POST", "/v1/runs/"+id+"/items", pageBody(600, 150, ""), &run); st != 200 || run.ItemCount != 750 {
		t.Fatalf("third page: %d, %d items", st, run.ItemCount)
	}

	var closed auditd.RunView
	if st := e.call("POST", "/v1/runs/"+id+"/finish", "", &closed); st != 200 || closed.Open || closed.ItemCount != 750 {
		t.Fatalf("finish the open run: %d, open %v, %d items", st, closed.Open, closed.ItemCount)
	}
	if st := e.call("POST", "/v1/runs/"+id+"/items", pageBody(900, 1, ""), nil); st != 409 {
		t.Fatalf("a page after the finish: %d, want 409", st)
	}
	v, err := e.loop.Wait(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if v.Status != auditd.RunSucceeded || v.ItemCount != 750 || v.Counts.Items != 750 || v.Counts.Succeeded != 750 {
		t.Fatalf("run %s: %d items (%d counted), %d succeeded; want 750", v.Status, v.ItemCount, v.Counts.Items, v.Counts.Succeeded)
	}
	keys := listAllItems(t, e, id)
	if len(keys) != 750 {
		t.Fatalf("listed %d items, want 750", len(keys))
	}
	for i, k := range keys {
		if want := fmt.Sprintf("item-%06d", i); k != want {
			t.Fatalf("item %d is %s, want %s (submission order)", i, k, want)
		}
	}
	if rep := e.reconcile(id); !rep.Balanced {
		t.Fatal("the paged run does not reconcile as one")
	}
}

// TestStagingCompactedDuringARun: staging keeps the last good copies a run
// records (in memory, and in its recent bucket) until a compaction; a long
// run's compactions come every CompactEvery items ended, not only at its
// end, so that what staging holds does not grow with the run.
func TestStagingCompactedDuringARun(t *testing.T) {
	up := fastUpstream(t)
	e := newProxyEnv(t, proxyEnvOptions{noSync: true, startLimit: 1_000_000, compactEvery: 10})
	e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 8})
	id := e.proxyRun(`,"idle_timeout":"1h"`)
	for i := range 40 {
		if r := e.send("GET", id, fmt.Sprintf("/proxy/fast/q?n=%d", i), nil, nil); r.status != 200 {
			t.Fatalf("request %d: %d", i, r.status)
		}
	}
	// The run is still open: only a compaction during it empties the
	// recent bucket of the copies its first 40 items recorded.
	recent := func() (n int) {
		e.db.View(func(tx *bolt.Tx) error {
			n = tx.Bucket([]byte("staging.recent")).Stats().KeyN
			return nil
		})
		return n
	}
	deadline := time.Now().Add(30 * time.Second)
	for recent() >= 10 {
		if time.Now().After(deadline) {
			t.Fatalf("the recent bucket holds %d copies of a run still open after 40 items ended; compacted every 10, it would hold fewer than 10", recent())
		}
		time.Sleep(time.Millisecond)
	}
	if v := e.finish(id); v.Status != auditd.RunSucceeded || v.Counts.Succeeded != 40 {
		t.Fatalf("run %s: %+v", v.Status, v.Counts)
	}
}

// heapInUse is the heap in use after two collections (the second frees
// what the first left to sync.Pool's victim cache), in MB.
func heapInUse() float64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return float64(ms.HeapInuse) / (1 << 20)
}

// BenchmarkRunMemory is the heap a live run keeps, in process, as its
// items end: a batch run submitted in pages of 10,000 (open), and a
// proxy-mode run of 32 clients, each of b.N items (use -benchtime=Nx, as
// 1000000x) against a fast upstream on loopback, fsync off. Metrics: the
// heap in use after GC when a quarter of the items have ended
// (MB-heap-quarter) and when all have (MB-heap-end). cmd's
// scripts/bench-scale measures the real binary's anonymous memory.
func BenchmarkRunMemory(b *testing.B) {
	b.Run("batch", func(b *testing.B) {
		up := fastUpstream(b)
		e := newProxyEnv(b, proxyEnvOptions{noSync: true, startLimit: 1_000_000})
		e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 64})
		var run auditd.RunView
		if st := e.call("POST", "/v1/runs", `{"name":"memory","open":true,"items":[]}`, &run); st != 201 {
			b.Fatalf("create: %d", st)
		}
		const page = 10_000
		quarter := 0.0
		b.ResetTimer()
		for from := 0; from < b.N; from += page {
			for {
				v, err := e.store.Run(context.Background(), run.ID)
				if err != nil {
					b.Fatal(err)
				}
				if quarter == 0 && v.Counts.Done() >= b.N/4 {
					quarter = heapInUse()
				}
				if from-v.Counts.Done() <= page {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			if st := e.call("POST", "/v1/runs/"+run.ID+"/items", pageBody(from, min(page, b.N-from), ""), nil); st != 200 {
				b.Fatalf("page at %d: %d", from, st)
			}
		}
		e.call("POST", "/v1/runs/"+run.ID+"/finish", "", nil)
		v, err := e.loop.Wait(context.Background(), run.ID)
		if err != nil || v.Counts.Succeeded != b.N {
			b.Fatalf("run %s: %+v, %v", v.Status, v.Counts, err)
		}
		b.StopTimer()
		if quarter == 0 {
			quarter = heapInUse()
		}
		b.ReportMetric(quarter, "MB-heap-quarter")
		b.ReportMetric(heapInUse(), "MB-heap-end")
	})
	b.Run("proxy", func(b *testing.B) {
		up := fastUpstream(b)
		e := newProxyEnv(b, proxyEnvOptions{noSync: true, startLimit: 1_000_000})
		e.source(auditd.Source{ID: "fast", BaseURL: up.URL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 1000})
		id := e.proxyRun(`,"idle_timeout":"1h"`)
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 32
		b.Cleanup(tr.CloseIdleConnections)
		client := &http.Client{Transport: tr, Timeout: time.Minute}
		var next, done atomic.Int64
		var quarter atomic.Uint64
		var wg sync.WaitGroup
		b.ResetTimer()
		for range 32 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := next.Add(1) - 1; i < int64(b.N); i = next.Add(1) - 1 {
					if err := benchGet(client, fmt.Sprintf("%s/proxy/fast/q?n=%d", e.srv.URL, i), e.token, id); err != nil {
						b.Error(err)
						return
					}
					if done.Add(1) == int64(b.N/4) {
						quarter.Store(math.Float64bits(heapInUse()))
					}
				}
			}()
		}
		wg.Wait()
		if v := e.finish(id); v.Counts.Succeeded != b.N {
			b.Fatalf("run %s: %+v", v.Status, v.Counts)
		}
		b.StopTimer()
		b.ReportMetric(math.Float64frombits(quarter.Load()), "MB-heap-quarter")
		b.ReportMetric(heapInUse(), "MB-heap-end")
	})
}

// TestOpenBatchRunIdleTimeout: an open batch run that takes no page for its
// idle timeout is closed by itself, on the fake clock: a page resets the
// timeout, the run ends once its items have, and its run.finished says
// why.
func TestOpenBatchRunIdleTimeout(t *testing.T) {
	h := newHarness(t, "name: idle\nseed: 1\nupstreams:\n  - name: up\n    path: /x\n")
	h.source(t, auditd.Source{ID: "s", Limit: 100, Window: auditd.Duration(time.Second)}, "up")
	ctx := context.Background()
	v, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "idle", Open: true, IdleTimeout: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if v.IdleTimeout.D() != 10*time.Minute {
		t.Fatalf("the run shows idle_timeout %v, want 10m", v.IdleTimeout.D())
	}
	h.clk.Advance(6 * time.Minute)
	pageAt := h.clk.Now()
	items := []auditd.Item{{Key: "a", SourceID: "s", Path: "/x?a"}, {Key: "b", SourceID: "s", Path: "/x?b"}}
	if _, err := h.loop.AddItems(ctx, v.ID, items); err != nil {
		t.Fatal(err)
	}
	// Ten minutes after the start, four after the page: still open.
	if !h.drive(func() bool { return h.clk.Now().Sub(pageAt) >= 4*time.Minute }, 10_000) {
		t.Fatal("the clock never reached ten minutes after the start")
	}
	if v, err = h.runs.Run(ctx, v.ID); err != nil || v.Status != auditd.RunRunning || !v.Open || v.Counts.Succeeded != 2 {
		t.Fatalf("four minutes after its page: %s, open %v, %d succeeded (%v); want running, open, 2", v.Status, v.Open, v.Counts.Succeeded, err)
	}
	v = h.finish(t, v.ID)
	if v.Status != auditd.RunSucceeded || v.Open || v.FinishedAt.Sub(pageAt) < 10*time.Minute {
		t.Fatalf("run %s, open %v, finished %v after its page; want succeeded, closed, 10m or more", v.Status, v.Open, v.FinishedAt.Sub(pageAt))
	}
	ev := h.events(t, v.ID)
	if last := ev[len(ev)-1]; last.Type != auditd.EventRunFinished || last.Reason != "idle for 10m0s: no page within the run's idle timeout" {
		t.Fatalf("last event %s %q", last.Type, last.Reason)
	}
	if _, err := h.loop.AddItems(ctx, v.ID, []auditd.Item{{Key: "c", SourceID: "s", Path: "/x?c"}}); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Fatalf("a page after the idle close: %v, want a conflict", err)
	}
	h.reconcile(t, v.ID)
}
