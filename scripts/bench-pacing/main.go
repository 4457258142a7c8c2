// Command bench-pacing measures how close auditd's learning comes to a
// client told the exact limit, against real nginx limit_req servers whose
// limits auditd is not told (make bench-pacing; docs/BENCHMARKS.md and
// docs/bench/pacing.md), and, for the shapes nginx cannot express (fixed
// windows, quotas that count down to a reset, limits that rise or fall),
// against package sim's upstreams on loopback, on the real clock.
//
// For each shape it starts three servers with the same limit, each with its
// own count, and fetches n items from each with one client:
//
//   - auditd: the real binary (auditd serve, default options, the source
//     registered with a base URL only, plus an operator ceiling where the
//     shape says), fed a run of n items over its REST API;
//   - oracle: golang.org/x/time/rate at the hidden rate and burst, one
//     request at a time, retrying a refusal after its Retry-After;
//   - retry: no pacing, four requests at a time, retrying a refusal after
//     its Retry-After or an exponential backoff from 1s to 30s, as
//     go-retryablehttp does.
//
// Every shape and both sizes run at once, so the whole takes as long as the
// slowest (the 60-a-minute shape at the larger size). The outage shape first
// warms auditd's source up, then holds its servers in maintenance (every
// request a plain 503) for 20 seconds while a small run is under way, and is
// measured from the end of the maintenance, for every client.
//
// It prints, per shape and size: the time to fetch n items against the
// oracle's, the share of requests refused for rate (over the whole fetch,
// and after its first minute, each request timed when it left: auditd's by
// its dispatch event in the ledger), and how many requests
// each server received (nginx's access log, or the simulator's count),
// which for auditd must equal the dispatches its ledger holds, and the
// pace auditd shows at the end against the shape's rate at the end.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/sim"
)

// shape is one hidden limit, as nginx limit_req enforces it.
type shape struct {
	Name  string
	Rate  float64 // requests a second
	Burst int
	// Status answers a refusal (limit_req_status): 503 is nginx's default.
	Status int
	// RetryAfter, when set, is sent with every refusal.
	RetryAfter string
	// Headers are sent with every response, refusals too.
	Headers map[string]string
	// Ceiling is the operator's ceiling per minute for auditd's source; 0
	// leaves auditd's default.
	Ceiling int
	// Outage, when set, is a maintenance before the measured fetch: every
	// request answered a plain 503 for this long.
	Outage time.Duration
	// Go, when set, serves the shape from package sim instead of nginx:
	// this limit, refused with a plain 429 (no Retry-After), advertised as
	// Advertise says. Rate and Burst are then the oracle's: the limit's
	// rate before any change, one request at a time.
	Go        *sim.Limit
	Advertise sim.Advertise
}

// shapes are the issue's: what a new user met with default options.
var shapes = []shape{
	{Name: "silent-leaky-60m", Rate: 1, Burst: 5, Status: 503},
	{Name: "geocoder-5s", Rate: 5, Burst: 10, Status: 429, RetryAfter: "1"},
	{Name: "ceiling-600m-hidden-240m", Rate: 4, Burst: 5, Status: 429, Ceiling: 600},
	{Name: "outage-then-120m", Rate: 2, Burst: 5, Status: 429, Outage: 20 * time.Second},
	{Name: "x-ratelimit-5-reset-2", Rate: 5, Burst: 10, Status: 429, RetryAfter: "1",
		Headers: map[string]string{"X-RateLimit-Limit": "5", "X-RateLimit-Reset": "2"}},
	{Name: "fixed-window-100m", Rate: 100.0 / 60, Burst: 1, Status: 429,
		Go: &sim.Limit{Shape: sim.ShapeFixedWindow, Requests: 100, Window: time.Minute}},
	{Name: "quota-1000-per-2m", Rate: 1000.0 / 120, Burst: 1, Status: 429, Advertise: sim.AdvertiseXRate,
		Go: &sim.Limit{Shape: sim.ShapeFixedWindow, Requests: 1000, Window: 2 * time.Minute}},
	{Name: "rising-0.5s-to-4s", Rate: 0.5, Burst: 1, Status: 429,
		Go: &sim.Limit{Shape: sim.ShapeSlidingWindow, Requests: 1, Window: 2 * time.Second,
			Changes: []sim.Change{{After: 2 * time.Minute, Requests: 8}}}},
	{Name: "quota-1000-per-2m-unix", Rate: 1000.0 / 120, Burst: 1, Status: 429, Advertise: sim.AdvertiseXRateUnix,
		Go: &sim.Limit{Shape: sim.ShapeFixedWindow, Requests: 1000, Window: 2 * time.Minute}},
	{Name: "quota-1000-per-2m-ietf", Rate: 1000.0 / 120, Burst: 1, Status: 429, Advertise: sim.AdvertiseIETF,
		Go: &sim.Limit{Shape: sim.ShapeFixedWindow, Requests: 1000, Window: 2 * time.Minute}},
	{Name: "rising-2s-to-8s", Rate: 2, Burst: 1, Status: 429,
		Go: &sim.Limit{Shape: sim.ShapeSlidingWindow, Requests: 4, Window: 2 * time.Second,
			Changes: []sim.Change{{After: time.Minute, Requests: 16}}}},
	{Name: "falling-8s-to-2s", Rate: 8, Burst: 1, Status: 429,
		Go: &sim.Limit{Shape: sim.ShapeSlidingWindow, Requests: 16, Window: 2 * time.Second,
			Changes: []sim.Change{{After: time.Minute, Requests: 4}}}},
}

// allowed is the shape's rate at the end, after its changes, a second.
func (s shape) allowed() float64 {
	if s.Go == nil {
		return s.Rate
	}
	n, w := s.Go.Requests, s.Go.Window
	for _, ch := range s.Go.Changes {
		n = ch.Requests
		if ch.Window != nil {
			w = *ch.Window
		}
	}
	return float64(n) / w.Seconds()
}

var clients = []string{"auditd", "oracle", "retry"}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-pacing:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench-pacing", flag.ContinueOnError)
	sizes := fs.String("n", "200,600", "comma-separated numbers of items per shape and client")
	only := fs.String("shapes", "", "comma-separated shape names (default all)")
	auditdBin := fs.String("auditd", "bin/auditd", "the auditd binary")
	nginxBin := fs.String("nginx", "nginx", "the nginx binary")
	keep := fs.Bool("keep", false, "keep the working directory")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-n: %q is not a positive number", f)
		}
		ns = append(ns, n)
	}
	chosen, err := choose(*only)
	if err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "bench-pacing-")
	if err != nil {
		return err
	}
	if *keep {
		fmt.Fprintln(out, "working directory:", dir)
	} else {
		defer os.RemoveAll(dir)
	}

	// One server per shape, size and client.
	var cases []*bcase
	for _, s := range chosen {
		for _, n := range ns {
			for _, c := range clients {
				port, err := freePort()
				if err != nil {
					return err
				}
				cases = append(cases, &bcase{shape: s, n: n, client: c, port: port,
					flag: filepath.Join(dir, fmt.Sprintf("maintenance-%d", port))})
			}
		}
	}
	ng, ngCases, stop, err := startServers(*nginxBin, dir, cases)
	if err != nil {
		return err
	}
	defer stop()
	ad, err := startAuditd(*auditdBin, filepath.Join(dir, "auditd"))
	if err != nil {
		return err
	}
	defer ad.stop()

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
	defer cancel()
	start := time.Now()
	fmt.Fprintf(out, "bench-pacing: %d shapes x %v items x %d clients, started %s\n", len(chosen), ns, len(clients), start.UTC().Format(time.RFC3339))
	var wg sync.WaitGroup
	for _, c := range cases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.err = c.run(ctx, ad)
		}()
	}
	wg.Wait()
	if ng != nil {
		if err := ng.count(ngCases); err != nil {
			return err
		}
	}
	for _, c := range cases {
		if c.sim != nil {
			c.received = c.sim.Stats(simUpstream).Received
		}
	}
	report(out, cases, ns)
	fmt.Fprintf(out, "took %v\n", time.Since(start).Round(time.Second))
	for _, c := range cases {
		if c.err != nil {
			return fmt.Errorf("%s/%d/%s: %w", c.shape.Name, c.n, c.client, c.err)
		}
	}
	return nil
}

// choose returns the shapes named in only, a comma-separated list; all of
// them when it is empty.
func choose(only string) ([]shape, error) {
	if only == "" {
		return shapes, nil
	}
	var chosen []shape
	for _, name := range strings.Split(only, ",") {
		found := false
		for _, s := range shapes {
			if s.Name == name {
				chosen, found = append(chosen, s), true
			}
		}
		if !found {
			return nil, fmt.Errorf("-shapes: no shape %q", name)
		}
	}
	return chosen, nil
}

// startServers serves every case: one nginx for the nginx shapes (ng, nil
// when none; ngCases, its cases), a simulator each for the Go shapes. stop
// ends them all.
func startServers(nginxBin, dir string, cases []*bcase) (ng *nginx, ngCases []*bcase, stop func(), err error) {
	var stops []func()
	stop = func() {
		for _, f := range stops {
			f()
		}
	}
	for _, c := range cases {
		if c.shape.Go == nil {
			ngCases = append(ngCases, c)
			continue
		}
		f, err := c.serveSim()
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		stops = append(stops, f)
	}
	if len(ngCases) > 0 {
		if ng, err = startNginx(nginxBin, dir, ngCases); err != nil {
			stop()
			return nil, nil, nil, err
		}
		stops = append(stops, ng.stop)
	}
	return ng, ngCases, stop, nil
}

// bcase is one client fetching n items from its own server of one shape.
type bcase struct {
	shape  shape
	n      int
	client string
	port   int
	flag   string // the maintenance flag file nginx checks

	elapsed time.Duration // first request (or the outage's end) to the nth success
	sent    int           // requests the client counted (auditd: dispatches)
	refused int           // refusals for rate (429, a plain 503 outside maintenance)
	// late and lateRefused are the requests sent a minute or more after
	// the client's first (of the measured fetch), and of them the refused.
	late, lateRefused int
	received          int // what the server counted (nginx's log), maintenance included
	note              string
	err               error

	learned float64 // auditd's: the pace it shows at the end, a second

	sim      *sim.Sim  // the shape's Go upstream, when it has one
	simStart time.Time // when its limit's changes count from
}

// goMargin is the share of a Go shape's rate its oracle paces at.
const goMargin = 0.98

// simUpstream names the one upstream of a case's simulator.
const simUpstream = "upstream"

// serveSim serves the case's Go shape on its port, on the real clock.
func (c *bcase) serveSim() (stop func(), err error) {
	lim := *c.shape.Go
	sc := &sim.Scenario{Name: c.shape.Name, Seed: 1, Upstreams: []sim.Upstream{{
		Name: simUpstream, Limit: &lim,
		Reject: sim.Reject{Status: c.shape.Status, RetryAfter: sim.RetryAfterNone, Advertise: c.shape.Advertise},
	}}}
	s, err := sim.New(sc, clock.Real{})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.shape.Name, err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", c.port))
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: s.Handler(simUpstream), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	c.sim, c.simStart = s, time.Now()
	return func() {
		srv.Close()
		s.Close(context.Background())
	}, nil
}

func (c *bcase) base() string { return fmt.Sprintf("http://127.0.0.1:%d", c.port) }

// source is auditd's source id for the case.
func (c *bcase) source() string { return fmt.Sprintf("%s-%d", c.shape.Name, c.n) }

func (c *bcase) run(ctx context.Context, ad *auditd) error {
	if c.client == "auditd" {
		return c.runAuditd(ctx, ad)
	}
	if c.shape.Outage > 0 {
		if err := c.maintenance(ctx, nil); err != nil {
			return err
		}
	}
	fetch := c.oracle
	if c.client == "retry" {
		fetch = c.retry
	}
	start := time.Now()
	var t tally
	err := fetch(ctx, c.n, fmt.Sprintf("/api/%s/", c.client), &t)
	c.elapsed, c.sent, c.refused, c.late, c.lateRefused = time.Since(start), t.sent, t.refused, t.late, t.lateRefused
	return err
}

// maintenance holds the case's server in maintenance for the shape's outage,
// running during while it lasts.
func (c *bcase) maintenance(ctx context.Context, during func() error) error {
	if err := os.WriteFile(c.flag, nil, 0o644); err != nil {
		return err
	}
	var err error
	if during != nil {
		err = during()
	}
	select {
	case <-time.After(c.shape.Outage):
	case <-ctx.Done():
		return ctx.Err()
	}
	if rmErr := os.Remove(c.flag); err == nil {
		err = rmErr
	}
	return err
}
