package fetch_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"reflect"
	"runtime/metrics"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// results returns every item of run id with its result (nil while pending).
func results(tb testing.TB, h *harness, id string) map[string]*auditd.ItemResult {
	tb.Helper()
	items, next, err := h.runs.Items(context.Background(), id, "", 1000)
	if err != nil || next != "" {
		tb.Fatalf("items: next %q, %v", next, err)
	}
	out := map[string]*auditd.ItemResult{}
	for _, it := range items {
		out[it.Key] = it.Result
	}
	return out
}

// An active run keeps its items' results with it until it ends. A restart
// in the middle rebuilds them from the ledger's item.finished events: the
// items that finished before it read exactly as they did.
func TestRestartRebuildsResults(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	items := mixedItems()
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "restart", Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(func() bool {
		rv, err := h.runs.Run(context.Background(), v.ID)
		return err == nil && rv.Counts.Done() >= 3
	}, 200_000) {
		t.Fatal("no three items finished")
	}
	h.close(t)
	// Read before the restart from the store alone: none of it is there yet.
	h.open(t, h.dir)
	rebuiltEarly := results(t, h, v.ID)
	v = h.finish(t, v.ID)
	after := results(t, h, v.ID)

	finishedBefore := 0
	for key, res := range rebuiltEarly {
		if res == nil {
			continue
		}
		finishedBefore++
		if !reflect.DeepEqual(res, after[key]) {
			t.Errorf("%s: rebuilt %+v, stored at the end %+v", key, *res, *after[key])
		}
	}
	if finishedBefore < 3 {
		t.Fatalf("only %d results rebuilt after the restart, want at least 3", finishedBefore)
	}
	for _, it := range items {
		res := after[it.Key]
		if res == nil {
			t.Errorf("%s has no result after the run ended", it.Key)
			continue
		}
		if res.Outcome == auditd.ItemSucceeded && (res.Attempts < 1 || res.Pages < 1 || res.PayloadHash == "" || res.Bytes == 0) {
			t.Errorf("%s: succeeded with a thin result %+v", it.Key, *res)
		}
	}
	h.reconcile(t, v.ID)
}

// A crash after run.finished is durable but before the store has the run's
// end leaves the run "running" there, with its results (each stored with
// its item.finished). The next start stores its end from the ledger and
// records nothing new.
func TestRestartAfterRunFinishedStoresItsEnd(t *testing.T) {
	h := newHarness(t, mixedScenario)
	mixedSources(t, h)
	v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: "end", Items: mixedItems()[:4]})
	if err != nil {
		t.Fatal(err)
	}
	done := h.finish(t, v.ID)
	want := results(t, h, v.ID)
	events := len(h.events(t, v.ID))
	h.close(t)

	// Put the store back as the crash would have left it.
	db, err := bolt.Open(filepath.Join(h.dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		runs := tx.Bucket([]byte("fetch.runs"))
		var rec map[string]any
		if err := json.Unmarshal(runs.Get([]byte(v.ID)), &rec); err != nil {
			return err
		}
		rec["status"] = string(auditd.RunRunning)
		delete(rec, "finished_at")
		delete(rec, "head_at_end")
		b, _ := json.Marshal(rec)
		if err := runs.Put([]byte(v.ID), b); err != nil {
			return err
		}
		// The run's results, one per item keyed by the run id, 0, its key:
		// stored as the items ended, before run.finished.
		prefix := append([]byte(v.ID), 0)
		n := 0
		c := tx.Bucket([]byte("runs.itemresults")).Cursor()
		for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			n++
		}
		if n != 4 {
			return fmt.Errorf("run %s stored %d results before its end, want 4", v.ID, n)
		}
		return nil
	})
	db.Close()
	if err != nil {
		t.Fatal(err)
	}

	h.open(t, h.dir)
	got, err := h.runs.Run(context.Background(), v.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != done.Status || !got.FinishedAt.Equal(done.FinishedAt) || got.HeadAtEnd != done.HeadAtEnd {
		t.Fatalf("after the restart the run is %s (finished %v, head %s); it ended %s (%v, %s)",
			got.Status, got.FinishedAt, got.HeadAtEnd, done.Status, done.FinishedAt, done.HeadAtEnd)
	}
	if n := len(h.events(t, v.ID)); n != events {
		t.Fatalf("the restart recorded %d new events for a finished run", n-events)
	}
	if r := results(t, h, v.ID); !reflect.DeepEqual(r, want) {
		t.Fatalf("results after the restart differ from those stored at the end")
	}
	h.reconcile(t, v.ID)
}

const windowScenario = `
name: window
seed: 1
upstreams:
  - name: api
    path: /arcgis/rest/services/Parcels/FeatureServer/0/query
    collection: {kind: arcgis, records: 10, max_page: 10, layer: parcels}
`

// A restart does not hand a source a fresh window. What a run that ended
// just before it sent still counts against the source's window, so a run
// submitted just after it waits until that has aged out: across the
// restart, no window of the source holds more than its limit. (Only the
// runs a restart resumed used to be counted.)
func TestRestartKeepsAFinishedRunsWindow(t *testing.T) {
	const limit = 4
	window := time.Minute
	h := newHarness(t, windowScenario)
	h.source(t, auditd.Source{ID: "api", Limit: limit, Window: auditd.Duration(window), Burst: limit}, "api")
	submit := func(name string) string {
		var items []auditd.Item
		for i := range limit {
			items = append(items, auditd.Item{Key: fmt.Sprintf("%s%d", name, i), SourceID: "api",
				Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?f=json&run=%s&i=%d", name, i)})
		}
		v, _, err := h.loop.Submit(context.Background(), auditd.NewRun{Name: name, Items: items})
		if err != nil {
			t.Fatal(err)
		}
		if v = h.finish(t, v.ID); v.Status != auditd.RunSucceeded {
			t.Fatalf("run %s ended %s", name, v.Status)
		}
		return v.ID
	}
	before := submit("before")
	h.close(t)
	h.open(t, h.dir)
	after := submit("after")

	var sent []time.Time
	for _, id := range []string{before, after} {
		for _, e := range h.events(t, id) {
			if e.Type == auditd.EventDispatch {
				sent = append(sent, e.Time)
			}
		}
	}
	if len(sent) != 2*limit {
		t.Fatalf("%d dispatches, want %d", len(sent), 2*limit)
	}
	slices.SortFunc(sent, time.Time.Compare)
	for i := limit; i < len(sent); i++ {
		if d := sent[i].Sub(sent[i-limit]); d < window {
			t.Errorf("dispatches at %v and %v are %v apart: %d in one window of %v, limit %d",
				sent[i-limit].Sub(epoch), sent[i].Sub(epoch), d, limit+1, window, limit)
		}
	}
}

// A restart keeps what the last-good copies say: a copy staged by a run
// still running is its request's last good one after the restart (the
// record stored with it is compacted into the index at start), and an item
// of a run still running that was served from cache reads, rebuilt from
// its cache.served, as it did.
func TestRestartKeepsCachedCopies(t *testing.T) {
	h := newHarness(t, outageScenario)
	second := auditd.Duration(time.Second)
	h.source(t, auditd.Source{ID: "down", Limit: 10, Window: second, MaxAttempts: 2,
		Breaker: auditd.BreakerPolicy{Threshold: 2, Cooldown: auditd.Duration(10 * time.Second)}}, "down")
	h.source(t, auditd.Source{ID: "slow", Limit: 1, Window: auditd.Duration(10 * time.Minute)}, "up")
	path := "/geoserver/ows?service=WFS&request=GetFeature&typeNames=parcels&n=a"
	slow := func(key string, n int) auditd.Item {
		return auditd.Item{Key: key, SourceID: "slow", Path: fmt.Sprint("/arcgis/rest/services/Parcels/FeatureServer/0/query?f=json&n=", n)}
	}
	ctx := context.Background()
	first, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "long", Items: []auditd.Item{{Key: "a", SourceID: "down", Path: path}, slow("s0", 0), slow("s1", 1), slow("s2", 2), slow("s3", 3)}})
	if err != nil {
		t.Fatal(err)
	}
	finished := func(run, key string) func() bool {
		return func() bool {
			v, err := h.runs.Item(ctx, run, key)
			return err == nil && v.Result != nil
		}
	}
	if !h.drive(finished(first.ID, "a"), 10_000) {
		t.Fatal("the first run never finished item a")
	}
	h.clk.Advance(3 * time.Minute)
	v, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "during", Items: []auditd.Item{{Key: "again", SourceID: "down", Path: path}, slow("s4", 4), slow("s5", 5)}})
	if err != nil {
		t.Fatal(err)
	}
	if !h.drive(finished(v.ID, "again"), 10_000) {
		t.Fatal("the second run never finished item again")
	}
	before := results(t, h, v.ID)["again"]
	if before.Outcome != auditd.ItemCached || before.Cached == nil || before.Cached.OriginRun != first.ID {
		t.Fatalf("before the restart: %+v, want a copy from run %s", before, first.ID)
	}
	for _, id := range []string{first.ID, v.ID} {
		if rv, _ := h.runs.Run(ctx, id); rv.Status.Terminal() {
			t.Fatalf("run %s (%s) ended before the restart (first is %s): the test proves nothing, %+v", id, rv.Name, first.ID, rv.Counts)
		}
	}

	h.close(t)
	h.open(t, h.dir)
	if c, ok, err := h.stage.LastGood(staging.RequestKey("down", "GET", path, nil)); err != nil || !ok || c.Run != first.ID {
		t.Fatalf("after the restart the last good copy is %+v (%v, %v), want run %s's", c, ok, err, first.ID)
	}
	if got := results(t, h, v.ID)["again"]; !reflect.DeepEqual(got, before) {
		t.Fatalf("rebuilt after the restart: %+v (cached %+v), want %+v (cached %+v)", got, got.Cached, before, before.Cached)
	}
	h.finish(t, v.ID)
	h.finish(t, first.ID)
	if got := results(t, h, v.ID)["again"]; !reflect.DeepEqual(got, before) {
		t.Errorf("stored at the end: %+v, want %+v", got, before)
	}
	h.reconcile(t, v.ID)
	h.reconcile(t, first.ID)
}

// memResponder takes a proxied request's response in memory.
type memResponder struct {
	status int
	header http.Header
	body   bytes.Buffer
}

func (m *memResponder) Start(status int, header http.Header, _ *auditd.ProxyMeta) io.Writer {
	m.status, m.header = status, header
	return &m.body
}
func (m *memResponder) Abort() {}
func (m *memResponder) Flush() {}

// A proxied request answered from the last good copy reads, after a
// restart of its still active proxy-mode run, as it did: rebuilt from its
// cache.served, the copy's origin run and age included.
func TestRestartKeepsProxiedCachedCopies(t *testing.T) {
	h := newHarness(t, outageScenario)
	h.source(t, auditd.Source{ID: "down", Limit: 10, Window: auditd.Duration(time.Second), MaxAttempts: 2,
		Breaker: auditd.BreakerPolicy{Threshold: 2, Cooldown: auditd.Duration(10 * time.Second)},
		Proxy:   auditd.ProxyPolicy{ServeStale: true}}, "down")
	path := "/geoserver/ows?service=WFS&request=GetFeature&typeNames=parcels&n=a"
	ctx := context.Background()
	first, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "before", Items: []auditd.Item{{Key: "a", SourceID: "down", Path: path}}})
	if err != nil {
		t.Fatal(err)
	}
	if v := h.finish(t, first.ID); v.Status != auditd.RunSucceeded {
		t.Fatalf("first run %s: %+v", v.Status, v.Counts)
	}
	h.clk.Advance(2 * time.Minute) // the outage has begun

	pr, _, err := h.loop.Submit(ctx, auditd.NewRun{Name: "proxied", Mode: auditd.RunProxy, IdleTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	out := &memResponder{}
	done := make(chan error, 1)
	go func() {
		_, err := h.loop.Proxy(ctx, &auditd.ProxyRequest{RunID: pr.ID, SourceID: "down", Method: "GET", Path: path, ItemKey: "stale"}, out)
		done <- err
	}()
	var perr error
	if !h.drive(func() bool {
		select {
		case perr = <-done:
			return true
		default:
			return false
		}
	}, 10_000) {
		t.Fatal("the proxied request never ended")
	}
	if perr != nil || out.status != 200 {
		t.Fatalf("proxied request during the outage: %d, %v", out.status, perr)
	}
	var before *auditd.ItemResult
	if !h.drive(func() bool { before = results(t, h, pr.ID)["stale"]; return before != nil }, 1000) {
		t.Fatal("the proxied item has no result")
	}
	if before.Outcome != auditd.ItemCached || before.Cached == nil || before.Cached.OriginRun != first.ID {
		t.Fatalf("before the restart: %+v, want a copy from run %s", before, first.ID)
	}

	h.close(t)
	h.open(t, h.dir)
	if got := results(t, h, pr.ID)["stale"]; !reflect.DeepEqual(got, before) {
		t.Fatalf("rebuilt after the restart: %+v (cached %+v), want %+v (cached %+v)", got, got.Cached, before, before.Cached)
	}
	// The restart's draining may have fired the run's idle timeout on the
	// fake clock already.
	if v, err := h.loop.Finish(ctx, pr.ID, "test"); err != nil && !v.Status.Terminal() {
		if rv, _ := h.runs.Run(ctx, pr.ID); !rv.Status.Terminal() {
			t.Fatal(err)
		}
	}
	h.finish(t, pr.ID)
	if got := results(t, h, pr.ID)["stale"]; !reflect.DeepEqual(got, before) {
		t.Errorf("stored at the end: %+v, want %+v", got, before)
	}
	h.reconcile(t, pr.ID)
}

// crashedMidQueue stores what a submit of items leaves when it stops after
// queueing the first queued of them: the run stored whole, its start
// recorded, and returns the run's id.
func crashedMidQueue(tb testing.TB, h *harness, items []auditd.Item, queued int) string {
	tb.Helper()
	ctx := context.Background()
	live, err := h.runs.Create(auditd.Run{Name: "crash mid-queue", Status: auditd.RunRunning, CreatedAt: h.clk.Now().UTC(), ItemCount: len(items)},
		auditd.NewRun{Items: items})
	if err != nil {
		tb.Fatal(err)
	}
	id := live.ID()
	if err := h.reg.StartRun(ctx, id, []string{items[0].SourceID}); err != nil {
		tb.Fatal(err)
	}
	events := []auditd.Event{{Type: auditd.EventRunStarted, RunID: id, Detail: fmt.Sprintf(`{"items":%d}`, len(items))}}
	for from := 0; from < queued; from += 1000 {
		for _, it := range items[from:min(from+1000, queued)] {
			events = append(events, auditd.Event{Type: auditd.EventItemQueued, RunID: id, SourceID: it.SourceID, ItemKey: it.Key, Method: it.Method, Path: it.Path})
		}
		f, err := h.ledger.Add(events)
		if err == nil {
			err = f.Wait(ctx)
		}
		if err != nil {
			tb.Fatal(err)
		}
		events = nil
	}
	if err := h.runs.Start(live); err != nil {
		tb.Fatal(err)
	}
	return id
}

// queryItems are n items of source src, keys c00000 on.
func queryItems(n int, src string) []auditd.Item {
	items := make([]auditd.Item, n)
	for i := range items {
		items[i] = auditd.Item{Key: fmt.Sprintf("c%05d", i), SourceID: src, Method: "GET",
			Path: fmt.Sprintf("/arcgis/rest/services/Parcels/FeatureServer/0/query?where=1%%3D1&f=json&n=%d", i)}
	}
	return items
}

// BenchmarkResumeMemory is the heap's peak while a restart resumes a batch
// run of b.N items, all queued and none ended (use -benchtime=Nx): what
// the resume holds of the run's items on top of the loop's own.
func BenchmarkResumeMemory(b *testing.B) {
	h := newHarness(b, steadyScenario)
	h.urls["fast"] = fastUpstream(b).URL
	h.source(b, auditd.Source{ID: "counties", Limit: 1, Window: auditd.Duration(time.Hour)}, "fast")
	crashedMidQueue(b, h, queryItems(b.N, "counties"), b.N)
	h.close(b)
	base := heapInUse()
	stop, peak := make(chan struct{}), make(chan float64)
	go func() {
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		most := uint64(0)
		for {
			metrics.Read(sample)
			most = max(most, sample[0].Value.Uint64())
			select {
			case <-stop:
				peak <- float64(most) / (1 << 20)
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	b.ResetTimer()
	h.open(b, h.dir)
	b.StopTimer()
	close(stop)
	b.ReportMetric(base, "MB-heap-before")
	b.ReportMetric(<-peak, "MB-heap-peak")
	b.ReportMetric(heapInUse(), "MB-heap-after")
}

// A crash while a run's items were being queued leaves the ledger with the
// first of them: the restart queues the rest from the store, a chunk at a
// time, in submission order (a source only the unqueued items name
// included), and the run ends with every item queued once and reconciles.
func TestRestartQueuesWhatACrashLeftUnqueued(t *testing.T) {
	h := newHarness(t, steadyScenario)
	h.urls["fast"] = fastUpstream(t).URL
	h.source(t, auditd.Source{ID: "counties", Limit: 1000, Window: auditd.Duration(time.Second), Concurrency: 8}, "fast")
	h.source(t, auditd.Source{ID: "late", Limit: 4, Window: auditd.Duration(time.Second)}, "fast")
	defer fetch.SetResumeChunk(64)()
	const n, queued = 300, 40
	items := queryItems(n, "counties")
	items[n-1].SourceID = "late" // named by the last item only
	id := crashedMidQueue(t, h, items, queued)
	h.close(t)

	h.open(t, h.dir)
	v := h.finish(t, id)
	if v.Status != auditd.RunSucceeded || v.Counts.Succeeded != n {
		t.Fatalf("run ended %s: %+v", v.Status, v.Counts)
	}
	seen := map[string]int{}
	var order []string
	for _, e := range h.events(t, id) {
		if e.Type == auditd.EventItemQueued {
			seen[e.ItemKey]++
			order = append(order, e.ItemKey)
		}
	}
	if len(order) != n || len(seen) != n {
		t.Fatalf("%d item.queued for %d keys, want each of %d once", len(order), len(seen), n)
	}
	for i, key := range order {
		if key != items[i].Key {
			t.Fatalf("item.queued %d names %s, want %s: submission order", i, key, items[i].Key)
		}
	}
	h.reconcile(t, id)
}
