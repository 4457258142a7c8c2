//go:build linux

package fetch_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
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

// The shape of issue 4's benchmark.
const (
	benchSources   = 1000
	benchPerSource = 20
	benchRequests  = benchSources * benchPerSource
)

// BenchmarkLoop1000x20 is issue 4's benchmark, kept to compare builds:
// one run of 1,000 sources x 20 items (20,000 requests) against one fast
// local upstream, with limits so generous that pacing never waits, on the
// production parts: clock.Real, a bbolt file that fsyncs every commit, the
// ledger, runs store, registry, limiter and staging, and the production
// HTTP client (fetch.NewClient). Compare an old build's test binary with
// a new one's, alternated, with benchstat: the machine's speed drifts
// between spells (docs/bench/fetch.md).
//
// One iteration is one whole run in a fresh data directory. Opening the
// file, registering the sources and the checks afterwards are outside the
// timer; the timed part is Submit until the run is terminal, so ns/op is the
// wall time of one run. Use -benchtime=Nx.
//
// Metrics (per dispatched request unless they say otherwise):
//
//   - us/req-overhead: CPU time of the whole process (getrusage, user+sys)
//     during the run / dispatches: the loop, the ledger, staging, the GC,
//     the HTTP client and (for an upstream in this process) the server.
//   - us/req-wall, req/s: the run's wall time / dispatches, and its inverse.
//   - us/req-rtt: the mean round trip as the loop recorded it (Latency of
//     the response events), a wall time.
//   - ms-submit: the wall time of Submit (storing the run, run.started, the
//     registry snapshots and one item.queued per item), inside the run.
//   - allocs/req: heap allocations of the whole process during the run;
//     gc-cycles/run the GC cycles it took.
//   - conns/run: TCP connections the upstream accepted during a run. All
//     1,000 sources share one listener here, where in production each is a
//     host of its own with its own pool; the client therefore keeps, and
//     opens at most, as many connections to it as requests can be in
//     flight (4 per source), as production's per-host pools add up to.
//   - events/group: events per ledger commit group.
//   - MB-live-peak: the largest live heap a GC found during the run;
//     MB-heap-after the heap in use after it and a forced GC, with the
//     loop, ledger and file still open.
//
// Each run is checked before it counts: every item finished succeeded, the
// ledger holds one dispatch per request the upstream received, one outcome
// per dispatch, and no wait (pacing never held a request back), so the
// benchmark cannot pass by doing nothing or by measuring the limiter.
func BenchmarkLoop1000x20(b *testing.B) {
	if testing.Short() {
		b.Skip("a 20,000-request run on an fsync'ing file; not in -short")
	}
	up := newBenchUpstream(b)
	runBenchLoops(b, up.srv.URL, benchClient(b), &up.benchCounts).report(b)
}

// BenchmarkLoop1000x20Nginx is BenchmarkLoop1000x20 with the upstream in a
// process of its own: a real nginx answering every request at once
// (testdata/nginx/bench.conf.tmpl), so the process's CPU holds the loop
// and the HTTP client and none of the server. Without nginx installed the
// benchmark is skipped.
func BenchmarkLoop1000x20Nginx(b *testing.B) {
	if testing.Short() {
		b.Skip("a 20,000-request run on an fsync'ing file; not in -short")
	}
	ng := nginxtest.Start(b, nginxtest.Config{Template: "bench.conf.tmpl"})
	runBenchLoops(b, ng.URL, benchClient(b), &nginxCounts{ng: ng}).report(b)
}

// benchClient is the production client with its per-host caps raised to
// the run's width: 1,000 sources x 4 in flight, which would be 1,000 hosts
// in production.
func benchClient(b *testing.B) *http.Client {
	opts := fetch.DefaultClientOptions()
	opts.MaxIdlePerHost, opts.MaxConnsPerHost = benchSources*4, benchSources*4
	client := fetch.NewClient(opts)
	b.Cleanup(client.CloseIdleConnections)
	return client
}

// BenchmarkLoopInMemory is BenchmarkLoop1000x20 with the upstream inside
// the client: a RoundTripper that answers every request at once with the
// same body, no connection, no server. The process's CPU per request is
// then the loop's own (us/req-loop-direct), plus http.Client's small share
// (its request copy and timer) and the answer's construction: a quicker,
// steadier check of a change to the loop.
func BenchmarkLoopInMemory(b *testing.B) {
	if testing.Short() {
		b.Skip("a 20,000-request run on an fsync'ing file; not in -short")
	}
	mem := &memUpstream{}
	client := &http.Client{Transport: mem}
	sum := runBenchLoops(b, "http://upstream.invalid", client, &mem.benchCounts)
	b.ReportMetric(float64(sum.cpu)/float64(time.Microsecond)/float64(sum.dispatches), "us/req-loop-direct")
	sum.report(b)
}

// runBenchLoops does b.N runs, each on a fresh loop, and adds them up.
// Every run starts with the heap collected and no idle connection to the
// upstream, so that it dials its own as the first run does.
func runBenchLoops(b *testing.B, upstreamURL string, client *http.Client, up upstreamCounter) benchTotals {
	b.ReportAllocs()
	b.ResetTimer()
	var sum benchTotals
	for i := range b.N {
		b.StopTimer()
		bl := openBenchLoop(b, upstreamURL, client)
		client.CloseIdleConnections()
		runtime.GC()
		b.StartTimer()
		res := bl.run(b, up)
		b.StopTimer()
		bl.check(b, &res)
		bl.close(b)
		b.Logf("run %d: %.1f us/req of CPU, %d GC cycles, %d dispatches, %.2fs", i,
			float64(res.cpu)/float64(time.Microsecond)/float64(res.dispatches), res.gcCycles, res.dispatches, res.wall.Seconds())
		sum.add(res)
		b.StartTimer()
	}
	b.StopTimer()
	return sum
}

// report reports the metrics the benchmarks share.
func (sum benchTotals) report(b *testing.B) {
	n := float64(sum.dispatches)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / n }
	b.ReportMetric(us(sum.cpu), "us/req-overhead")
	b.ReportMetric(us(sum.wall), "us/req-wall")
	b.ReportMetric(n/sum.wall.Seconds(), "req/s")
	b.ReportMetric(us(sum.rtt), "us/req-rtt")
	b.ReportMetric(float64(sum.submit)/float64(time.Millisecond)/float64(sum.runs), "ms-submit")
	b.ReportMetric(float64(sum.allocs)/n, "allocs/req")
	b.ReportMetric(float64(sum.gcCycles)/float64(sum.runs), "gc-cycles/run")
	b.ReportMetric(float64(sum.conns)/float64(sum.runs), "conns/run")
	b.ReportMetric(float64(sum.grouped)/float64(sum.groups), "events/group")
	b.ReportMetric(float64(sum.heapAfter)/(1<<20), "MB-heap-after")
	b.ReportMetric(float64(sum.livePeak)/(1<<20), "MB-live-peak")
}

// benchUpstream is one fast local upstream: it answers every request at
// once with a small JSON body naming the path (so every item stages a
// payload of its own), and counts what it served.
type benchUpstream struct {
	srv *httptest.Server
	benchCounts
}

// upstreamCounter is an upstream that can say what it has served so far:
// requests, and the connections they came on.
type upstreamCounter interface {
	served(tb testing.TB) (requests, conns int64)
}

// benchCounts is what an upstream in this process counts of what it served.
type benchCounts struct {
	requests atomic.Int64
	conns    atomic.Int64 // connections accepted
}

func (c *benchCounts) served(testing.TB) (requests, conns int64) {
	return c.requests.Load(), c.conns.Load()
}

// nginxCounts counts what the nginx of BenchmarkLoop1000x20Nginx served
// from its access log, one line per request naming its connection.
type nginxCounts struct{ ng *nginxtest.Server }

// served counts the lines of the access log, and the connections they name.
// nginx writes a request's line once it has sent the response, so a client
// may read the response first: it reads the log until it stops growing.
func (c *nginxCounts) served(tb testing.TB) (requests, conns int64) {
	tb.Helper()
	var last []byte
	for try := 0; ; try++ {
		b := c.ng.AccessLog(tb)
		if try > 0 && len(b) == len(last) {
			break
		}
		last = b
		time.Sleep(50 * time.Millisecond)
	}
	seen := map[string]bool{}
	for line := range bytes.Lines(last) {
		requests++
		if id, _, ok := bytes.Cut(line, []byte(" ")); ok {
			seen[string(id)] = true
		}
	}
	return requests, int64(len(seen))
}

// benchBody is the body the upstreams answer a request for path with.
func benchBody(path string) []byte {
	body := make([]byte, 0, 128)
	body = append(body, `{"path":`...)
	body = strconv.AppendQuote(body, path)
	return append(body, `,"count":1,"records":[{"id":1,"status":"active"}]}`...)
}

// memUpstream is an upstream inside the client (BenchmarkLoopInMemory).
type memUpstream struct{ benchCounts }

func (m *memUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	body := benchBody(r.URL.Path)
	resp := &http.Response{
		Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header:        http.Header{"Content-Type": {"application/json"}},
		ContentLength: int64(len(body)), Body: io.NopCloser(bytes.NewReader(body)), Request: r,
	}
	m.requests.Add(1)
	return resp, nil
}

func newBenchUpstream(tb testing.TB) *benchUpstream {
	tb.Helper()
	u := &benchUpstream{}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(u.serve))
	u.srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			u.conns.Add(1)
		}
	}
	u.srv.Start()
	tb.Cleanup(u.srv.Close)
	return u
}

func (u *benchUpstream) serve(w http.ResponseWriter, r *http.Request) {
	body := benchBody(r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
	u.requests.Add(1)
}

// benchLoop is a loop on the production parts in a fresh data directory,
// with benchSources sources registered, all pointing at one upstream.
type benchLoop struct {
	dir    string
	db     *bolt.DB
	ledger *ledger.Ledger
	loop   *fetch.Loop
	items  []auditd.Item
	runID  string
}

func openBenchLoop(tb testing.TB, upstreamURL string, client *http.Client) *benchLoop {
	tb.Helper()
	dir, err := os.MkdirTemp(tb.TempDir(), "run")
	if err != nil {
		tb.Fatal(err)
	}
	// Opened as main opens it.
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, ledger.BoltOptions(false))
	if err != nil {
		tb.Fatal(err)
	}
	led, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clock.Real{}})
	if err != nil {
		tb.Fatal(err)
	}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clock.Real{}, DefaultLimit: 1_000_000, DefaultWindow: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	stage, err := staging.Open(db, filepath.Join(dir, "payloads"))
	if err != nil {
		tb.Fatal(err)
	}
	store, err := runs.Open(db, runs.Options{Ledger: led, Payloads: stage, Pace: fetch.Pace(reg), Clock: clock.Real{}})
	if err != nil {
		tb.Fatal(err)
	}
	loop, err := fetch.New(fetch.Config{
		Ledger: led, Runs: store, Registry: reg, Limiter: limiter.New(clock.Real{}), Staging: stage,
		Client: client, Clock: clock.Real{}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		tb.Fatal(err)
	}
	if err := loop.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	bl := &benchLoop{dir: dir, db: db, ledger: led, loop: loop}

	// Registering is setup: do it from many goroutines so the sources'
	// source.changed events share commit groups.
	var wg sync.WaitGroup
	errs := make(chan error, benchSources)
	ids := make(chan string)
	for range 32 {
		wg.Go(func() {
			for id := range ids {
				_, err := loop.PutSource(context.Background(), "bench", auditd.Source{
					ID: id, BaseURL: upstreamURL,
					Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 4,
				})
				if err != nil {
					errs <- fmt.Errorf("put source %s: %w", id, err)
				}
			}
		})
	}
	for s := range benchSources {
		id := fmt.Sprintf("s%04d", s)
		ids <- id
		for i := range benchPerSource {
			bl.items = append(bl.items, auditd.Item{
				Key: fmt.Sprintf("%s/%02d", id, i), SourceID: id,
				Path: fmt.Sprintf("/items/%s/%02d?f=json", id, i),
			})
		}
	}
	close(ids)
	wg.Wait()
	close(errs)
	for err := range errs {
		tb.Fatal(err)
	}
	return bl
}

// benchResult is what one run measured.
type benchResult struct {
	wall, cpu, submit   time.Duration
	gcCycles            uint32
	allocs              uint64
	livePeak, heapAfter uint64
	upRequests, upConns int64
	groups, grouped     uint64 // ledger commit groups and their events
	// Filled in by check, from the ledger.
	dispatches int
	rtt        time.Duration
}

// run submits the run and waits until it is terminal. The caller's timer
// runs for exactly this.
func (bl *benchLoop) run(b *testing.B, up upstreamCounter) benchResult {
	var res benchResult
	upReq, upConns := up.served(b)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs, gcs := ms.Mallocs, ms.NumGC
	groups := bl.ledger.Stats()
	cpu := cpuTime(b)
	start := time.Now()

	v, created, err := bl.loop.Submit(context.Background(), auditd.NewRun{Name: "bench", Items: bl.items, Principal: "bench"})
	if err != nil || !created {
		b.Fatalf("submit: created %v, %v", created, err)
	}
	res.submit = time.Since(start)
	bl.runID = v.ID
	// Wait blocks until the run's end is stored; the live heap is sampled
	// on the side meanwhile.
	stop := make(chan struct{})
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(25 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				metrics.Read(sample)
				res.livePeak = max(res.livePeak, sample[0].Value.Uint64())
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	v, err = bl.loop.Wait(ctx, v.ID)
	cancel()
	close(stop)
	sampler.Wait()
	if err != nil {
		b.Fatalf("run did not finish: %v", err)
	}

	res.wall = time.Since(start)
	res.cpu = cpuTime(b) - cpu
	runtime.ReadMemStats(&ms)
	res.allocs, res.gcCycles = ms.Mallocs-mallocs, ms.NumGC-gcs
	st := bl.ledger.Stats()
	res.groups, res.grouped = st.Groups-groups.Groups, st.Events-groups.Events
	requests, conns := up.served(b)
	res.upRequests, res.upConns = requests-upReq, conns-upConns
	metrics.Read(sample)
	res.livePeak = max(res.livePeak, sample[0].Value.Uint64())
	runtime.GC()
	runtime.ReadMemStats(&ms)
	res.heapAfter = ms.HeapInuse
	if v.Status != auditd.RunSucceeded || v.Counts.Succeeded != benchRequests {
		b.Fatalf("run ended %s: %+v", v.Status, v.Counts)
	}
	return res
}

// check recounts the run from the ledger: the benchmark only counts a run
// that did all its work, and did it without waiting on the gates.
func (bl *benchLoop) check(b *testing.B, res *benchResult) {
	counts := map[auditd.EventType]int{}
	succeeded := 0
	if err := bl.ledger.ScanRun(bl.runID, 0, func(e *auditd.Event) error {
		counts[e.Type]++
		switch e.Type {
		case auditd.EventItemFinished:
			if e.Outcome == auditd.ItemSucceeded {
				succeeded++
			}
		case auditd.EventResponse:
			res.rtt += e.Latency
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	res.dispatches = counts[auditd.EventDispatch]
	outcomes := counts[auditd.EventResponse] + counts[auditd.EventThrottle] + counts[auditd.EventTransportError]
	switch {
	case counts[auditd.EventItemFinished] != benchRequests || succeeded != benchRequests:
		b.Fatalf("%d item.finished (%d succeeded) for %d items", counts[auditd.EventItemFinished], succeeded, benchRequests)
	case counts[auditd.EventItemQueued] != benchRequests || counts[auditd.EventPayloadStaged] != benchRequests:
		b.Fatalf("%d item.queued and %d payload.staged for %d items", counts[auditd.EventItemQueued], counts[auditd.EventPayloadStaged], benchRequests)
	case int64(res.dispatches) != res.upRequests || res.dispatches < benchRequests:
		b.Fatalf("%d dispatches recorded, upstream received %d, %d items", res.dispatches, res.upRequests, benchRequests)
	case outcomes != res.dispatches:
		b.Fatalf("%d dispatches but %d outcome events", res.dispatches, outcomes)
	case counts[auditd.EventWait] != 0:
		b.Fatalf("%d wait events: pacing held requests back, so this measures the gates, not the loop", counts[auditd.EventWait])
	case counts[auditd.EventRunFinished] != 1:
		b.Fatalf("%d run.finished events", counts[auditd.EventRunFinished])
	}
}

func (bl *benchLoop) close(tb testing.TB) {
	tb.Helper()
	ctx := context.Background()
	if err := bl.loop.Close(ctx); err != nil {
		tb.Errorf("close loop: %v", err)
	}
	if err := bl.ledger.Close(ctx); err != nil {
		tb.Errorf("close ledger: %v", err)
	}
	if err := bl.db.Close(); err != nil {
		tb.Errorf("close bbolt: %v", err)
	}
	// Every run stages 20,000 payload files: do not keep them until the
	// benchmark ends.
	if err := os.RemoveAll(bl.dir); err != nil {
		tb.Errorf("remove run directory: %v", err)
	}
}

// benchTotals adds up the runs of one benchmark.
type benchTotals struct {
	runs, dispatches       int
	conns                  int64
	allocs                 uint64
	wall, cpu, submit, rtt time.Duration
	gcCycles               uint64
	heapAfter, livePeak    uint64
	groups, grouped        uint64
}

func (sum *benchTotals) add(r benchResult) {
	sum.runs++
	sum.dispatches += r.dispatches
	sum.conns += r.upConns
	sum.allocs += r.allocs
	sum.wall += r.wall
	sum.cpu += r.cpu
	sum.gcCycles += uint64(r.gcCycles)
	sum.submit += r.submit
	sum.rtt += r.rtt
	sum.groups += r.groups
	sum.grouped += r.grouped
	sum.heapAfter = max(sum.heapAfter, r.heapAfter)
	sum.livePeak = max(sum.livePeak, r.livePeak)
}

// cpuTime is the CPU time, user and system, this process has used.
func cpuTime(tb testing.TB) time.Duration {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
