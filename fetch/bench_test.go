//go:build linux

package fetch_test

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
	bolt "go.etcd.io/bbolt"
)

// loopProfile names a file for CPU profiles of the timed runs alone: go
// test's own -cpuprofile also covers the setup and the HTTP calibration,
// which are most of the process's CPU time. The first timed run writes FILE,
// later ones (with -count or -benchtime=Nx) FILE.1, FILE.2 and so on, which
// go tool pprof merges when given them all. Each run also writes the
// allocation profile before it (FILE.allocs0) and after it (FILE.allocs):
// pprof's -diff_base of the two is what the run allocated.
var loopProfile = flag.String("loopprofile", "", "write CPU and allocation profiles of the timed loop runs alone to this `file` (and file.1, file.2, ...)")

// loopProfiles counts the timed runs profiled so far.
var loopProfiles int

// The shape of issue 4's benchmark.
const (
	benchSources   = 1000
	benchPerSource = 20
	benchRequests  = benchSources * benchPerSource
)

// BenchmarkLoop1000x20 is issue 4's benchmark: one run of 1,000 sources x 20
// items (20,000 requests) against one fast local upstream, with limits so
// generous that pacing never waits, on the production parts: clock.Real, a
// bbolt file that fsyncs every commit, the ledger, registry, limiter and
// staging, and the production HTTP client (fetch.NewClient).
//
// One iteration is one whole run in a fresh data directory. Opening the
// file, registering the sources and the checks afterwards are outside the
// timer; the timed part is Submit until the run is terminal, so ns/op is the
// wall time of one run. A run takes tens of seconds: use -benchtime=1x (or
// 3x) with -count, see docs/bench/fetch.md.
//
// Metrics (per dispatched request unless they say otherwise):
//
//   - us/req-wall: the run's wall time / dispatches; req/s is its inverse.
//   - us/req-overhead: CPU time of the whole process (getrusage, user+sys)
//     during the run / dispatches. CPU time leaves out every wait: for the
//     network, for fsync to reach the disk, for a commit group, for a lock.
//     It counts everything the run makes this process do: Submit, the
//     limiter, registry, ledger (encoding, hashing, signing, bbolt, the
//     write and fsync syscalls), staging (temp file, write, fsync, rename),
//     the run's own bbolt records, the GC, the HTTP client, and, because the
//     upstream runs in this process, its server side too. So it is an upper
//     bound of the loop's own overhead per request.
//   - us/req-http: CPU per request of the same 20,000 requests sent straight
//     with the same client, no loop (measured once, before the runs): what
//     the HTTP exchange alone costs this process, client and server side.
//     us/req-loop = us/req-overhead - us/req-http is the loop's own share.
//   - us/req-http-wide, us/req-loop-wide: the same with the calibration
//     run 4,000 wide on a fresh client, as the run is (1,000 sources x 4 in
//     flight), so it pays the same dials and connection count; the median
//     of such calibrations, each on a client of its own: two before the
//     runs and one before each run (seven for -benchtime=5x).
//   - us/req-gc, us/req-gc-http-wide: the GC's part of us/req-overhead and
//     of us/req-http-wide (cpuClasses.gcPart: the share of the runtime's
//     busy CPU in its GC class, applied to the process CPU). Their
//     difference is the GC the loop adds to the exchange's.
//   - gc-cycles/run, gc-cycles-http-wide: the GC cycles of one run, and of
//     the median wide calibration.
//   - us/req-rtt: the mean round trip as the loop recorded it (Latency of
//     the response events), a wall time; us/req-upstream is the mean time
//     inside the upstream's handler (in-process upstreams only).
//   - ms-submit: the wall time of Submit (storing the run, run.started, the
//     registry snapshots and one item.queued per item), inside the run.
//   - allocs/req: heap allocations of the whole process during the run.
//   - faults/req: minor page faults of the process during the run (heap,
//     goroutine stacks and bbolt's map of the file faulted in). Every
//     calibration and run starts with the heap collected and returned to
//     the system (coldStart), so that none inherits memory another left;
//     faults/req-http-wide is the median calibration's.
//   - conns/run: TCP connections the upstream accepted during a run. All
//     1,000 sources share one listener here, where in production each is a
//     host of its own with its own pool; the client therefore keeps, and
//     opens at most, as many connections to it as requests can be in
//     flight (4 per source), as production's per-host pools add up to, so
//     the run measures the loop, not TCP handshakes.
//   - MB-heap-after: heap in use after the run and a forced GC, with the
//     loop, ledger and bbolt file still open: what a finished run leaves.
//   - MB-live-peak: the largest live heap a GC found during the run.
//   - MB-peak-rss: the process's peak RSS (VmHWM) since it started, setup
//     and the calibration included.
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
	benchWide(b, up.srv.URL, &up.benchCounts)
}

// BenchmarkLoop1000x20Nginx is BenchmarkLoop1000x20 with the upstream in a
// process of its own: a real nginx answering every request at once
// (testdata/nginx/bench.conf.tmpl). The process's CPU then holds the loop
// and the HTTP client, and none of the server, so the calibration is the
// client alone and does not depend on how hard the server is driven: with
// the server in process, it costs more per request in the calibration,
// which sends as fast as it can, than in the run, where the loop's own work
// spaces the requests out, and that makes us/req-loop-wide read low.
// us/req-upstream is not reported: nginx's time is not this process's.
// Without nginx installed the benchmark is skipped.
func BenchmarkLoop1000x20Nginx(b *testing.B) {
	if testing.Short() {
		b.Skip("a 20,000-request run on an fsync'ing file; not in -short")
	}
	ng := startNginx(b, nginxConfig{Template: "bench.conf.tmpl"})
	benchWide(b, ng.url, &nginxCounts{ng: ng})
}

// benchWide measures the runs of a Loop1000x20 benchmark against the
// upstream at url, and the HTTP exchange with it alone (the calibrations).
func benchWide(b *testing.B, url string, up upstreamCounter) {
	opts := fetch.DefaultClientOptions()
	opts.MaxIdlePerHost, opts.MaxConnsPerHost = benchSources*4, benchSources*4
	client := fetch.NewClient(opts)
	b.Cleanup(client.CloseIdleConnections)
	httpCPU := calibrate(b, client, url, benchRequests, 64).cpu
	// The run keeps up to 4 requests in flight per source, 4,000 at once,
	// so it dials and keeps that many connections; the same exchange at that
	// width, on a client of its own, costs more than at 64. It also varies
	// from one try to the next, by as much as 25% within a minute, more
	// than the loop's own share moves: the median of two fresh clients
	// before the runs and one more before each run, which also follows the
	// VM's speed through the runs (seven tries for five runs).
	var wideTries []calibration
	wide := func() {
		c := fetch.NewClient(opts)
		wideTries = append(wideTries, calibrate(b, c, url, benchRequests, benchSources*4))
		c.CloseIdleConnections()
	}
	wide()
	wide()
	sum := runBenchLoops(b, url, client, up, wide)
	slices.SortFunc(wideTries, func(a, b calibration) int { return cmp.Compare(a.cpu, b.cpu) })
	httpWide := wideTries[len(wideTries)/2]
	httpWideCPU, httpWideGC, httpWideFaults := httpWide.cpu, httpWide.gc, httpWide.faults

	n := float64(sum.dispatches)
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / n }
	b.ReportMetric(us(sum.wall), "us/req-wall")
	b.ReportMetric(n/sum.wall.Seconds(), "req/s")
	b.ReportMetric(us(sum.cpu), "us/req-overhead")
	b.ReportMetric(float64(httpCPU)/float64(time.Microsecond), "us/req-http")
	b.ReportMetric(us(sum.cpu)-float64(httpCPU)/float64(time.Microsecond), "us/req-loop")
	b.ReportMetric(float64(httpWideCPU)/float64(time.Microsecond), "us/req-http-wide")
	b.ReportMetric(us(sum.cpu)-float64(httpWideCPU)/float64(time.Microsecond), "us/req-loop-wide")
	b.ReportMetric(us(sum.rtt), "us/req-rtt")
	if sum.upstream > 0 {
		b.ReportMetric(us(sum.upstream), "us/req-upstream")
	}
	b.ReportMetric(float64(httpWideFaults)/benchRequests, "faults/req-http-wide")
	b.ReportMetric(float64(httpWideGC)/float64(time.Microsecond), "us/req-gc-http-wide")
	b.ReportMetric(float64(httpWide.cycles), "gc-cycles-http-wide")
	b.ReportMetric(float64(sum.conns)/float64(sum.runs), "conns/run")
	sum.report(b)
}

// BenchmarkLoopInMemory is BenchmarkLoop1000x20 with the upstream inside
// the client: a RoundTripper that answers every request at once with the
// same body, no connection, no server. The process's CPU per request is
// then the loop's own (us/req-loop-direct), plus http.Client's small share
// (its request copy and timer) and the answer's construction, measured
// directly rather than as a difference of two noisy figures: a quick,
// steadier check of a change to the loop, not the figure (which
// wants a real upstream).
func BenchmarkLoopInMemory(b *testing.B) {
	if testing.Short() {
		b.Skip("a 20,000-request run on an fsync'ing file; not in -short")
	}
	mem := &memUpstream{}
	client := &http.Client{Transport: mem}
	sum := runBenchLoops(b, "http://upstream.invalid", client, &mem.benchCounts, nil)
	n := float64(sum.dispatches)
	b.ReportMetric(float64(sum.cpu)/float64(time.Microsecond)/n, "us/req-loop-direct")
	b.ReportMetric(n/sum.wall.Seconds(), "req/s")
	sum.report(b)
}

// runBenchLoops does b.N runs, each on a fresh loop, and adds them up.
// Every run starts as the first does and as each calibration does: with no
// idle connection to the upstream, so that it dials its own. A run that
// found the last run's connections open (as a second iteration of
// -benchtime=3x did, before this) costs some 30 us/req less CPU than the
// exchange measured by the calibrations, which dial, and its difference
// from them means nothing. beforeEach, when not nil, runs before each run
// with the timer stopped (benchWide calibrates there).
func runBenchLoops(b *testing.B, upstreamURL string, client *http.Client, up upstreamCounter, beforeEach func()) benchTotals {
	b.ReportAllocs()
	b.ResetTimer()
	var sum benchTotals
	for i := range b.N {
		b.StopTimer()
		if beforeEach != nil {
			beforeEach()
		}
		bl := openBenchLoop(b, upstreamURL, client)
		client.CloseIdleConnections()
		b.Logf("run %d from a heap of %d MB", i, coldStart()>>20)
		stopProfile := startLoopProfile(b)
		b.StartTimer()
		res := bl.run(b, up)
		b.StopTimer()
		stopProfile()
		bl.check(b, &res)
		bl.close(b)
		b.Logf("run %d: %.1f us/req of CPU (GC %.1f, %d cycles), %d dispatches, %.2fs", i,
			float64(res.cpu)/float64(time.Microsecond)/float64(res.dispatches),
			float64(res.gc)/float64(time.Microsecond)/float64(res.dispatches), res.gcCycles, res.dispatches, res.wall.Seconds())
		sum.add(res)
		b.StartTimer()
	}
	b.StopTimer()
	return sum
}

// report reports the metrics both benchmarks share.
func (sum *benchTotals) report(b *testing.B) {
	n := float64(sum.dispatches)
	b.ReportMetric(float64(sum.submit)/float64(time.Millisecond)/float64(sum.runs), "ms-submit")
	b.ReportMetric(float64(sum.allocs)/n, "allocs/req")
	b.ReportMetric(float64(sum.gc)/float64(time.Microsecond)/n, "us/req-gc")
	b.ReportMetric(float64(sum.gcCycles)/float64(sum.runs), "gc-cycles/run")
	b.ReportMetric(float64(sum.faults)/n, "faults/req")
	b.ReportMetric(float64(sum.groups)/n, "groups/req")
	b.ReportMetric(float64(sum.grouped)/float64(sum.groups), "events/group")
	b.ReportMetric(float64(sum.pageBytes)/1024/n, "KB-paged/req")
	b.ReportMetric(float64(sum.heapAfter)/(1<<20), "MB-heap-after")
	b.ReportMetric(float64(sum.livePeak)/(1<<20), "MB-live-peak")
	b.ReportMetric(float64(peakRSS(b))/(1<<20), "MB-peak-rss")
}

// startLoopProfile starts the -loopprofile profiles of one timed run and
// returns what stops them.
func startLoopProfile(b *testing.B) (stop func()) {
	if *loopProfile == "" {
		return func() {}
	}
	name := *loopProfile
	if loopProfiles > 0 {
		name = fmt.Sprintf("%s.%d", name, loopProfiles)
	}
	loopProfiles++
	writeAllocs(b, name+".allocs0")
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		b.Fatalf("-loopprofile does not combine with -cpuprofile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			b.Error(err)
		}
		runtime.GC() // the allocation profile is as of the last GC
		writeAllocs(b, name+".allocs")
	}
}

// writeAllocs writes the allocation profile so far to name.
func writeAllocs(b *testing.B, name string) {
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	if err := pprof.Lookup("allocs").WriteTo(f, 0); err != nil {
		b.Error(err)
	}
	if err := f.Close(); err != nil {
		b.Error(err)
	}
}

// benchUpstream is one fast local upstream: it answers every request at
// once with a small JSON body naming the path (so every item stages a
// payload of its own), and counts what it served.
type benchUpstream struct {
	srv *httptest.Server
	benchCounts
}

// upstreamCounter is an upstream that can say what it has served so far:
// requests, the connections they came on, and the time spent answering
// them (0 when the upstream does not measure it).
type upstreamCounter interface {
	served(tb testing.TB) (requests, conns int64, handler time.Duration)
}

// benchCounts is what an upstream in this process counts of what it served.
type benchCounts struct {
	requests atomic.Int64
	handler  atomic.Int64 // nanoseconds spent answering
	conns    atomic.Int64 // connections accepted
}

func (c *benchCounts) served(testing.TB) (requests, conns int64, handler time.Duration) {
	return c.requests.Load(), c.conns.Load(), time.Duration(c.handler.Load())
}

// nginxCounts counts what the nginx of BenchmarkLoop1000x20Nginx served
// from its access log, one line per request naming its connection.
type nginxCounts struct{ ng *nginx }

// served counts the lines of the access log, and the connections they name.
// nginx writes a request's line once it has sent the response, so a client
// may read the response first: it reads the log until it stops growing.
func (c *nginxCounts) served(tb testing.TB) (requests, conns int64, handler time.Duration) {
	tb.Helper()
	path := filepath.Join(c.ng.dir, "access.log")
	var last []byte
	for try := 0; ; try++ {
		b, err := os.ReadFile(path)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			tb.Fatal(err)
		}
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
	return requests, int64(len(seen)), 0
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
	start := time.Now()
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
	m.handler.Add(int64(time.Since(start)))
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
	start := time.Now()
	body := benchBody(r.URL.Path)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.Write(body)
	u.requests.Add(1)
	u.handler.Add(int64(time.Since(start)))
}

// calibration is what one calibration measured.
type calibration struct {
	cpu, gc time.Duration // process CPU per request, and the GC's part of it
	faults  int64         // minor page faults, in all
	cycles  uint64        // GC cycles completed
}

// calibrate measures n requests sent to the upstream at url with client by
// conc workers, without the loop: the HTTP exchange's own cost, client and
// (for an upstream in this process) server side. It starts as the run does
// (coldStart).
func calibrate(tb testing.TB, client *http.Client, url string, n, conc int) calibration {
	tb.Helper()
	var next atomic.Int64
	var failed atomic.Value
	heap := coldStart()
	faultsBefore := minorFaults(tb)
	classes := readCPUClasses()
	before := cpuTime(tb)
	var wg sync.WaitGroup
	for range conc {
		wg.Go(func() {
			for i := next.Add(1); i <= int64(n); i = next.Add(1) {
				// Built as fetch's send builds it: a non-replayable empty body.
				req, err := http.NewRequest(http.MethodGet, fmt.Sprintf("%s/calibrate/%d?f=json", url, i), emptyBody{})
				if err != nil {
					failed.Store(err)
					return
				}
				req.Header.Set("User-Agent", "auditd")
				resp, err := client.Do(req)
				if err != nil {
					failed.Store(err)
					return
				}
				_, err = io.ReadAll(io.LimitReader(resp.Body, fetch.DefaultMaxBodyBytes+1))
				resp.Body.Close()
				if err != nil {
					failed.Store(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		tb.Fatalf("calibration request: %v", err)
	}
	cpu := (cpuTime(tb) - before) / time.Duration(n)
	after := readCPUClasses()
	c := calibration{cpu: cpu, gc: classes.gcPart(after, cpu), faults: minorFaults(tb) - faultsBefore, cycles: after.cycles - classes.cycles}
	tb.Logf("calibration %d wide: %v per request (GC %v, %d cycles), %d page faults, from a heap of %d MB", conc, c.cpu, c.gc, c.cycles, c.faults, heap>>20)
	return c
}

// cpuClasses is the runtime's estimate of its CPU time by class
// (runtime/metrics): the GC's (background marking and assists), the idle
// Ps', and the total, GOMAXPROCS times wall time.
type cpuClasses struct {
	gc, idle, total float64
	cycles          uint64 // GC cycles completed
}

func readCPUClasses() cpuClasses {
	s := []metrics.Sample{
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/idle:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/gc/cycles/total:gc-cycles"},
	}
	metrics.Read(s)
	return cpuClasses{gc: s[0].Value.Float64(), idle: s[1].Value.Float64(), total: s[2].Value.Float64(), cycles: s[3].Value.Uint64()}
}

// gcPart is the GC's part of cpu, the process CPU of the phase from c to
// later: the share of the runtime's busy time (not idle) that went to the
// GC, times cpu. The runtime's classes are estimates from the time Ps spent
// at each task, not the kernel's accounting, so only the share is used.
func (c cpuClasses) gcPart(later cpuClasses, cpu time.Duration) time.Duration {
	busy := (later.total - c.total) - (later.idle - c.idle)
	if busy <= 0 {
		return 0
	}
	return time.Duration(float64(cpu) * (later.gc - c.gc) / busy)
}

// emptyBody is fetch's emptyBody (unexported there): the body of a request
// that has none, neither nil nor http.NoBody, so that net/http's transport
// never resends it, and free to give each request.
type emptyBody struct{}

func (emptyBody) Read([]byte) (int, error) { return 0, io.EOF }
func (emptyBody) Close() error             { return nil }

// coldStart collects the heap and returns its free memory to the system,
// so that every measured phase (each calibration, each run) starts from the
// same state. Otherwise a phase that follows another as large finds the
// runtime's memory still mapped and takes almost no page faults, while one
// that follows a small one (the run follows its setup) faults its heap in
// again: 55,000 faults (about 10 us per request) against a calibration's 28.
// It collects twice: what sync.Pools hold survives one collection, and
// after a wide calibration that is some 60 MB of the closed connections'
// buffers, which the next phase would reuse instead of allocating. It
// returns the live heap after.
func coldStart() (live uint64) {
	runtime.GC()
	debug.FreeOSMemory()
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(sample)
	return sample[0].Value.Uint64()
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
	gc                  time.Duration // the GC's part of cpu (cpuClasses.gcPart)
	gcCycles            uint64
	allocs              uint64
	faults              int64 // minor page faults
	livePeak, heapAfter uint64
	upRequests, upConns int64
	upHandler           time.Duration
	groups, grouped     uint64 // ledger commit groups and their events
	pageBytes           int64  // bytes of pages bbolt allocated for writing
	// Filled in by check, from the ledger.
	dispatches int
	rtt        time.Duration
}

// run submits the run and waits until it is terminal. The caller's timer
// runs for exactly this.
func (bl *benchLoop) run(b *testing.B, up upstreamCounter) benchResult {
	var res benchResult
	upReq, upConns, upHandler := up.served(b)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	mallocs := ms.Mallocs
	groups, boltStats := bl.ledger.Stats(), bl.db.Stats()
	faults := minorFaults(b)
	classes := readCPUClasses()
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
	classesAfter := readCPUClasses()
	res.gc, res.gcCycles = classes.gcPart(classesAfter, res.cpu), classesAfter.cycles-classes.cycles
	res.faults = minorFaults(b) - faults
	runtime.ReadMemStats(&ms)
	res.allocs = ms.Mallocs - mallocs
	st := bl.ledger.Stats()
	res.groups, res.grouped = st.Groups-groups.Groups, st.Events-groups.Events
	after := bl.db.Stats()
	bs := after.Sub(&boltStats)
	res.pageBytes = bs.TxStats.GetPageAlloc()
	requests, conns, handler := up.served(b)
	res.upRequests, res.upConns, res.upHandler = requests-upReq, conns-upConns, handler-upHandler
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
	runs, dispatches                     int
	conns                                int64
	allocs                               uint64
	faults                               int64
	wall, cpu, gc, submit, rtt, upstream time.Duration
	gcCycles                             uint64
	heapAfter, livePeak                  uint64
	groups, grouped                      uint64
	pageBytes                            int64
}

func (t *benchTotals) add(r benchResult) {
	t.runs++
	t.dispatches += r.dispatches
	t.conns += r.upConns
	t.allocs += r.allocs
	t.faults += r.faults
	t.wall += r.wall
	t.cpu += r.cpu
	t.gc += r.gc
	t.gcCycles += r.gcCycles
	t.submit += r.submit
	t.rtt += r.rtt
	t.upstream += r.upHandler
	t.groups += r.groups
	t.grouped += r.grouped
	t.pageBytes += r.pageBytes
	t.heapAfter = max(t.heapAfter, r.heapAfter)
	t.livePeak = max(t.livePeak, r.livePeak)
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

// minorFaults is how many minor page faults this process has taken.
func minorFaults(tb testing.TB) int64 {
	tb.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		tb.Fatalf("getrusage: %v", err)
	}
	return ru.Minflt
}

// peakRSS is the process's peak resident set (VmHWM), in bytes.
func peakRSS(tb testing.TB) uint64 {
	tb.Helper()
	f, err := os.Open("/proc/self/status")
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				tb.Fatalf("parse VmHWM %q: %v", rest, err)
			}
			return kb << 10
		}
	}
	tb.Fatal("no VmHWM in /proc/self/status")
	return 0
}
