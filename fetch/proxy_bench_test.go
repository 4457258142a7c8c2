//go:build linux

package fetch_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/nginxtest"
)

// The proxy route's benchmarks (issue 15), each side by side in one run
// with what a pipeline would use without auditd, against a real nginx in a
// process of its own (testdata/nginx/bench.conf.tmpl: every request
// answered at once, a small JSON body). auditd is the whole service in
// this process (proxyEnv): the API with its token check, the loop, a bbolt
// file that fsyncs every commit, staging of every body. The source's
// limits are generous enough that pacing never holds a request back (each
// benchmark checks that the ledger holds no wait), so what is measured is
// the cost of the route, the records made durable before each request
// leaves, and the staging. Without nginx installed they are skipped.

// proxyBenchSource is a source with limits that never bind: the most the
// configuration allows, 1,000 in flight.
func proxyBenchSource(id, baseURL string) auditd.Source {
	return auditd.Source{ID: id, BaseURL: baseURL, Limit: 1_000_000, Window: auditd.Duration(time.Second), Burst: 100_000, Concurrency: 1000}
}

// proxyBenchClient is a pipeline's keep-alive client: one pool, as many
// idle connections as it has workers.
func proxyBenchClient(b *testing.B, conns int) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost, tr.MaxIdleConns = conns, 2*conns
	b.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// get sends one GET, reads the whole body and checks it is a 200.
func benchGet(c *http.Client, u, token, run string) error {
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	if token != "" {
		req.Header.Set("Proxy-Authorization", "Bearer "+token)
		req.Header.Set("Auditd-Run", run)
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %d %s", u, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return err
}

// checkProxyBenchRun finishes run id and fails the benchmark unless every
// proxied request it counts succeeded, one dispatch each, none waited for
// by the gates.
func checkProxyBenchRun(b *testing.B, e *proxyEnv, id string, want int) {
	b.Helper()
	v := e.finish(id)
	c := v.Counts
	if v.Status != auditd.RunSucceeded || c.Items != want || c.Succeeded != want || c.Dispatches != want || c.Waits != 0 {
		for _, ev := range e.events(id) {
			if ev.Type == auditd.EventWait {
				b.Logf("wait: %s %v planned, %v actual", ev.Gate, ev.Wait, ev.Actual)
			}
		}
		b.Fatalf("run %s %s: %d items, %d succeeded, %d dispatches, %d waits; want %d each and no wait",
			id, v.Status, c.Items, c.Succeeded, c.Dispatches, c.Waits, want)
	}
}

// BenchmarkProxyLatency is the latency auditd's proxy route adds to a
// request, at 200 requests/s: an open loop sends one request through
// auditd every 5 ms, and between two of them (2.5 ms away) one straight
// to nginx, each from its own keep-alive client, each without waiting for
// the ones before it. The two swap places every period: a timer that
// wakes an idle process is late by up to a millisecond (Go's netpoller
// sleeps in whole milliseconds), so the slot after the longer idle spell
// starts later, and each path takes that slot half the time. One op is
// one such pair; use -benchtime=Nx (2000x is 10 s). Metrics, in
// milliseconds of wall time from the request's scheduled time to the
// whole body:
//
//   - ms-p50-direct, ms-p99-direct: nginx called directly;
//   - ms-p50-proxy, ms-p99-proxy: the same request through auditd;
//   - ms-p50-added, ms-p99-added: the differences of those percentiles
//     (issue 15's targets: at most +1 ms and +5 ms);
//   - ms-p50-late: how late the benchmark's own timer started requests
//     (both paths), inside every figure above.
func BenchmarkProxyLatency(b *testing.B) {
	if testing.Short() {
		b.Skip("nginx and an fsync'ing ledger; not in -short")
	}
	ng := nginxtest.Start(b, nginxtest.Config{Template: "bench.conf.tmpl"})
	e := newProxyEnv(b, proxyEnvOptions{startLimit: 1_000_000})
	e.source(proxyBenchSource("ng", ng.URL))
	id := e.proxyRun(`,"idle_timeout":"1h"`)
	direct, proxied := proxyBenchClient(b, 16), proxyBenchClient(b, 16)
	// Warm both paths' connections and the route.
	for i := range 20 {
		if err := benchGet(direct, fmt.Sprintf("%s/warm/%d", ng.URL, i), "", ""); err != nil {
			b.Fatal(err)
		}
		if err := benchGet(proxied, fmt.Sprintf("%s/proxy/ng/warm/%d", e.srv.URL, i), e.token, id); err != nil {
			b.Fatal(err)
		}
	}

	n := b.N
	dLat, pLat, late := make([]time.Duration, n), make([]time.Duration, n), make([]time.Duration, 2*n)
	var failed atomic.Value
	var wg sync.WaitGroup
	const period = 5 * time.Millisecond
	b.ResetTimer()
	start := time.Now()
	for i := range n {
		for slot := range 2 {
			at := start.Add(time.Duration(i)*period + time.Duration(slot)*period/2)
			time.Sleep(time.Until(at))
			lat, u, c, token := &pLat[i], fmt.Sprintf("%s/proxy/ng/r/%d", e.srv.URL, i), proxied, e.token
			if slot == i%2 {
				lat, u, c, token = &dLat[i], fmt.Sprintf("%s/r/%d", ng.URL, i), direct, ""
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				late[2*i+slot] = time.Since(at)
				if err := benchGet(c, u, token, id); err != nil {
					failed.Store(err)
				}
				// From the scheduled time, so that a late send counts
				// against the path it was late on (no coordinated omission).
				*lat = time.Since(at)
			}()
		}
	}
	wg.Wait()
	b.StopTimer()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatal(err)
	}
	checkProxyBenchRun(b, e, id, n+20)
	slices.Sort(dLat)
	slices.Sort(pLat)
	slices.Sort(late)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	d50, d99, p50, p99 := pct(dLat, 50), pct(dLat, 99), pct(pLat, 50), pct(pLat, 99)
	b.ReportMetric(ms(d50), "ms-p50-direct")
	b.ReportMetric(ms(d99), "ms-p99-direct")
	b.ReportMetric(ms(p50), "ms-p50-proxy")
	b.ReportMetric(ms(p99), "ms-p99-proxy")
	b.ReportMetric(ms(p50-d50), "ms-p50-added")
	b.ReportMetric(ms(p99-d99), "ms-p99-added")
	b.ReportMetric(ms(pct(late, 50)), "ms-p50-late")
}

// pct is the p-th percentile of sorted.
func pct(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[min(max(i-1, 0), len(sorted)-1)]
}

// BenchmarkProxyThroughput is the proxy route's throughput against a bare
// net/http/httputil.ReverseProxy in front of the same nginx, in this
// process and with the same client: 64 concurrent clients, each sending
// its next request as soon as it has read the last one's body, neither
// path with pacing limits. One op is one request on each path; they take
// turns, a tenth of the requests at a time, so that both see the same
// spells of the machine. Metrics:
//
//   - req/s-auditd, req/s-reverseproxy: requests answered per second;
//   - ratio: auditd's over the ReverseProxy's (issue 15's target: at least
//     0.5).
func BenchmarkProxyThroughput(b *testing.B) {
	if testing.Short() {
		b.Skip("nginx and an fsync'ing ledger; not in -short")
	}
	const clients = 64
	ng := nginxtest.Start(b, nginxtest.Config{Template: "bench.conf.tmpl"})
	target, _ := url.Parse(ng.URL)
	rp := httputil.NewSingleHostReverseProxy(target)
	rpTr := http.DefaultTransport.(*http.Transport).Clone()
	rpTr.MaxIdleConnsPerHost, rpTr.MaxIdleConns = clients, 2*clients
	rp.Transport = rpTr
	bare := httptest.NewServer(rp)
	b.Cleanup(bare.Close)
	b.Cleanup(rpTr.CloseIdleConnections)

	e := newProxyEnv(b, proxyEnvOptions{startLimit: 1_000_000})
	e.source(proxyBenchSource("ng", ng.URL))
	id := e.proxyRun(`,"idle_timeout":"1h"`)
	client := proxyBenchClient(b, 2*clients)

	var seq atomic.Int64
	// round sends n requests from 64 clients through one path and returns
	// how long they took.
	round := func(n int, viaAuditd bool) time.Duration {
		var next atomic.Int64
		var failed atomic.Value
		var wg sync.WaitGroup
		t0 := time.Now()
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for next.Add(1) <= int64(n) {
					i := seq.Add(1)
					var err error
					if viaAuditd {
						err = benchGet(client, fmt.Sprintf("%s/proxy/ng/t/%d", e.srv.URL, i), e.token, id)
					} else {
						err = benchGet(client, fmt.Sprintf("%s/t/%d", bare.URL, i), "", "")
					}
					if err != nil {
						failed.Store(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if err, _ := failed.Load().(error); err != nil {
			b.Fatal(err)
		}
		return time.Since(t0)
	}
	// Warm both: connections, the route, the ledger's first pages.
	round(2*clients, true)
	round(2*clients, false)
	proxiedN := 2 * clients

	b.ResetTimer()
	const turns = 10
	var tA, tR time.Duration
	var cA, cR time.Duration // CPU time on each path (benchCPU)
	for t := range turns {
		k := b.N*(t+1)/turns - b.N*t/turns
		if k == 0 {
			continue
		}
		for _, viaAuditd := range []bool{t%2 == 0, t%2 != 0} {
			c0 := benchCPU(b, ng)
			took := round(k, viaAuditd)
			if viaAuditd {
				tA, cA = tA+took, cA+benchCPU(b, ng)-c0
			} else {
				tR, cR = tR+took, cR+benchCPU(b, ng)-c0
			}
		}
		proxiedN += k
	}
	b.StopTimer()
	checkProxyBenchRun(b, e, id, proxiedN)
	ra, rr := float64(b.N)/tA.Seconds(), float64(b.N)/tR.Seconds()
	b.ReportMetric(ra, "req/s-auditd")
	b.ReportMetric(rr, "req/s-reverseproxy")
	b.ReportMetric(ra/rr, "ratio")
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(b.N) }
	b.ReportMetric(us(cA), "us-cpu/req-auditd")
	b.ReportMetric(us(cR), "us-cpu/req-reverseproxy")
	b.ReportMetric(cA.Seconds()/tA.Seconds(), "cores-auditd")
	b.ReportMetric(cR.Seconds()/tR.Seconds(), "cores-reverseproxy")
}

// benchCPU is the CPU time, user and system, this process (the clients,
// auditd or the ReverseProxy) and nginx have spent: what one path costs
// the machine, without the machine's other work.
func benchCPU(b *testing.B, ng *nginxtest.Server) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	own := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", ng.Pid()))
	if err != nil {
		b.Fatal(err)
	}
	// pid (comm) state ppid ...: utime and stime are the 14th and 15th
	// fields, the 12th and 13th after the command's closing parenthesis.
	_, rest, _ := strings.Cut(string(raw), ") ")
	fields := strings.Fields(rest)
	var ticks int64
	for _, f := range fields[11:13] {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			b.Fatalf("/proc/%d/stat: %v", ng.Pid(), err)
		}
		ticks += n
	}
	return own + time.Duration(ticks)*(time.Second/100) // USER_HZ
}
