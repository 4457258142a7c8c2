// Command bench-pacing measures how close auditd's learning comes to a
// client told the exact limit, against real nginx limit_req servers whose
// limits auditd is not told (make bench-pacing; docs/BENCHMARKS.md), and,
// for the shapes nginx cannot express (fixed windows, quotas that count
// down to a reset, limits that rise), against package sim's upstreams on
// loopback, on the real clock.
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
// oracle's, the share of requests refused for rate, and how many requests
// each server received (nginx's access log, or the simulator's count),
// which for auditd must equal the dispatches its ledger holds.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"text/template"
	"time"

	"golang.org/x/time/rate"

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
	chosen := shapes
	if *only != "" {
		chosen = nil
		for _, name := range strings.Split(*only, ",") {
			found := false
			for _, s := range shapes {
				if s.Name == name {
					chosen, found = append(chosen, s), true
				}
			}
			if !found {
				return fmt.Errorf("-shapes: no shape %q", name)
			}
		}
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

	elapsed  time.Duration // first request (or the outage's end) to the nth success
	sent     int           // requests the client counted (auditd: dispatches)
	refused  int           // refusals for rate (429, a plain 503 outside maintenance)
	received int           // what the server counted (nginx's log), maintenance included
	note     string
	err      error

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
	sent, refused, err := fetch(ctx, c.n, fmt.Sprintf("/api/%s/", c.client))
	c.elapsed, c.sent, c.refused = time.Since(start), sent, refused
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

var httpClient = &http.Client{Timeout: 30 * time.Second}

// get fetches one path and reports its status and Retry-After.
func get(ctx context.Context, url string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After"), nil
}

func refusal(status int) bool { return status == 429 || status == 503 }

// oracle fetches n items one at a time, paced by x/time/rate at the hidden
// rate and burst.
func (c *bcase) oracle(ctx context.Context, n int, prefix string) (sent, refused int, err error) {
	lim := rate.NewLimiter(rate.Limit(c.shape.Rate), c.shape.Burst)
	if c.shape.Go != nil {
		// Told the limit's changes too: each takes effect on time. A Go
		// shape has no burst to absorb a request's latency jitter, so the
		// oracle paces 2% under the rate, as a careful client would.
		lim.SetLimit(rate.Limit(goMargin * c.shape.Rate))
		for _, ch := range c.shape.Go.Changes {
			w := c.shape.Go.Window
			if ch.Window != nil {
				w = *ch.Window
			}
			t := time.AfterFunc(time.Until(c.simStart.Add(ch.After)), func() {
				lim.SetLimit(rate.Limit(goMargin * float64(ch.Requests) / w.Seconds()))
			})
			defer t.Stop()
		}
	}
	for i := 0; i < n; {
		if err := lim.Wait(ctx); err != nil {
			return sent, refused, err
		}
		status, ra, err := get(ctx, fmt.Sprintf("%s%s%d", c.base(), prefix, i))
		if err != nil {
			return sent, refused, err
		}
		sent++
		if refusal(status) {
			refused++
			if d, ok := retryAfter(ra); ok {
				time.Sleep(d)
			}
			continue
		}
		i++
	}
	return sent, refused, nil
}

// retry fetches n items four at a time, unpaced, retrying refusals after
// Retry-After or 1s, 2s, 4s ... 30s.
func (c *bcase) retry(ctx context.Context, n int, prefix string) (sent, refused int, err error) {
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	var first error
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				wait := time.Second
				for {
					status, ra, err := get(ctx, fmt.Sprintf("%s%s%d", c.base(), prefix, i))
					mu.Lock()
					sent++
					if err != nil && first == nil {
						first = err
					}
					if refusal(status) {
						refused++
					}
					mu.Unlock()
					if err != nil {
						return
					}
					if !refusal(status) {
						break
					}
					d, ok := retryAfter(ra)
					if !ok {
						d, wait = wait, min(2*wait, 30*time.Second)
					}
					select {
					case <-time.After(d):
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	return sent, refused, first
}

func retryAfter(v string) (time.Duration, bool) {
	s, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

// runAuditd registers the case's source with auditd and fetches n items as
// one run: for the outage shape, after a warm-up run and a small run through
// the maintenance.
func (c *bcase) runAuditd(ctx context.Context, ad *auditd) error {
	src := map[string]any{"base_url": c.base()}
	if c.shape.Ceiling > 0 {
		src["limit"], src["window"] = c.shape.Ceiling, "1m"
	}
	if code, body, err := ad.call(ctx, "PUT", "/v1/sources/"+c.source(), src, nil); err != nil || code >= 300 {
		return fmt.Errorf("put source: %d %s %v", code, body, err)
	}
	if c.shape.Outage > 0 {
		if _, err := ad.fetch(ctx, c.source(), "warm", 60); err != nil {
			return err
		}
		// A small run meets the maintenance; the measured one starts as
		// it ends (the small run may still be finishing).
		if err := c.maintenance(ctx, func() error {
			_, err := ad.submit(ctx, c.source(), "outage", 10)
			return err
		}); err != nil {
			return err
		}
	}
	start := time.Now()
	counts, err := ad.fetch(ctx, c.source(), "measured", c.n)
	if err != nil {
		return err
	}
	c.elapsed = time.Since(start)
	c.sent, c.refused = counts.Dispatches, counts.Status429+counts.Status5xx
	if counts.Succeeded != c.n {
		c.note = fmt.Sprintf("%d of %d succeeded", counts.Succeeded, c.n)
	}
	// The ledger's dispatches for every run of the source, to compare with
	// what nginx logged.
	total, err := ad.dispatches(ctx, c.source())
	if err != nil {
		return err
	}
	c.note = strings.TrimSpace(c.note + fmt.Sprintf(" ledger dispatches %d", total))
	return nil
}

// auditd is a running auditd serve.
type auditd struct {
	cmd   *exec.Cmd
	url   string
	token string
	logs  *bytes.Buffer
	runs  sync.Map // source -> []string run ids
}

func startAuditd(bin, data string) (*auditd, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	a := &auditd{url: fmt.Sprintf("http://127.0.0.1:%d", port), token: "bench-pacing-admin-token-0123456789", logs: &bytes.Buffer{}}
	a.cmd = exec.Command(bin, "serve", "--data", data, "--addr", fmt.Sprintf("127.0.0.1:%d", port))
	a.cmd.Env = append(os.Environ(), "AUDITD_BOOTSTRAP_TOKEN="+a.token)
	a.cmd.Stdout, a.cmd.Stderr = a.logs, a.logs
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start auditd (make build first): %w", err)
	}
	for i := 0; ; i++ {
		if resp, err := http.Get(a.url + "/healthz"); err == nil {
			resp.Body.Close()
			return a, nil
		}
		if i == 400 {
			a.stop()
			return nil, fmt.Errorf("auditd serve did not come up:\n%s", a.logs)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

func (a *auditd) stop() {
	a.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { a.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		a.cmd.Process.Kill()
		<-done
	}
}

func (a *auditd) call(ctx context.Context, method, path string, body, out any) (int, string, error) {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, "", err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, rd)
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, "", err
	}
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, string(data), err
		}
	}
	return resp.StatusCode, string(data), nil
}

// runCounts is the part of a run's counts the benchmark reads.
type runCounts struct {
	Succeeded  int `json:"succeeded"`
	Dispatches int `json:"dispatches"`
	Status429  int `json:"status_429"`
	Status5xx  int `json:"status_5xx"`
}

// submit starts a run of n items of source and returns its id.
func (a *auditd) submit(ctx context.Context, source, name string, n int) (string, error) {
	items := make([]map[string]any, n)
	for i := range items {
		items[i] = map[string]any{"key": fmt.Sprintf("%s-%d", name, i), "source": source, "path": fmt.Sprintf("/api/auditd/%s-%d", name, i)}
	}
	var created struct {
		ID string `json:"id"`
	}
	code, body, err := a.call(ctx, "POST", "/v1/runs", map[string]any{"name": source + " " + name, "items": items}, &created)
	if err != nil || code != http.StatusCreated {
		return "", fmt.Errorf("submit %s: %d %s %v", name, code, body, err)
	}
	ids, _ := a.runs.LoadOrStore(source, &[]string{})
	*ids.(*[]string) = append(*ids.(*[]string), created.ID)
	return created.ID, nil
}

// await polls run id until it ends and returns its counts.
func (a *auditd) await(ctx context.Context, id string) (*runCounts, error) {
	for {
		var run struct {
			Status string    `json:"status"`
			Counts runCounts `json:"counts"`
		}
		if code, body, err := a.call(ctx, "GET", "/v1/runs/"+id, nil, &run); err != nil || code != http.StatusOK {
			return nil, fmt.Errorf("run %s: %d %s %v", id, code, body, err)
		}
		switch run.Status {
		case "succeeded", "partial", "cancelled":
			return &run.Counts, nil
		}
		select {
		case <-time.After(100 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// fetch runs n items of source to the end.
func (a *auditd) fetch(ctx context.Context, source, name string, n int) (*runCounts, error) {
	id, err := a.submit(ctx, source, name, n)
	if err != nil {
		return nil, err
	}
	return a.await(ctx, id)
}

// dispatches sums the dispatches of every run of source.
func (a *auditd) dispatches(ctx context.Context, source string) (int, error) {
	ids, ok := a.runs.Load(source)
	if !ok {
		return 0, nil
	}
	total := 0
	for _, id := range *ids.(*[]string) {
		c, err := a.await(ctx, id)
		if err != nil {
			return 0, err
		}
		total += c.Dispatches
	}
	return total, nil
}

// nginxConf holds one server per case, each with a limit_req zone of its
// own, and logs every request with its port.
const nginxConf = `error_log {{.Dir}}/error.log warn;
worker_processes 1;
events { worker_connections 1024; }
http {
    default_type application/json;
    log_format bench '$server_port $status';
    access_log {{.Dir}}/access.log bench;
    open_file_cache off;
    client_body_temp_path {{.Dir}}/body;
    proxy_temp_path       {{.Dir}}/proxy;
    fastcgi_temp_path     {{.Dir}}/fastcgi;
    uwsgi_temp_path       {{.Dir}}/uwsgi;
    scgi_temp_path        {{.Dir}}/scgi;
    limit_req_log_level warn;
{{range .Cases}}
    limit_req_zone $server_port zone=z{{.Port}}:1m rate={{.Rate}};
    server {
        listen 127.0.0.1:{{.Port}};
        limit_req_status {{.Status}};
        {{range .Headers}}add_header {{.}} always;
        {{end}}
        location /api/ {
            # Maintenance: a plain 503 in the rewrite phase, before limit_req.
            if (-f {{.Flag}}) { return 503; }
            limit_req zone=z{{.Port}} burst={{.Burst}} nodelay;
            {{if .RetryAfter}}error_page {{.Status}} = @refused;{{end}}
            # Not "return 200": return ends the request in the rewrite
            # phase, before limit_req ever sees it; try_files runs after.
            root {{$.Dir}};
            try_files /ok.json =500;
        }
        {{if .RetryAfter}}location @refused {
            add_header Retry-After {{.RetryAfter}} always;
            {{range .Headers}}add_header {{.}} always;
            {{end}}
            return {{.Status}};
        }{{end}}
        location = /healthz { access_log off; return 200 '{"ok":true}'; }
    }
{{end}}
}
`

// nginx is a running nginx with the cases' servers.
type nginx struct {
	cmd *exec.Cmd
	dir string
}

func startNginx(bin, dir string, cases []*bcase) (*nginx, error) {
	ndir := filepath.Join(dir, "nginx")
	for _, d := range []string{"body", "proxy", "fastcgi", "uwsgi", "scgi"} {
		if err := os.MkdirAll(filepath.Join(ndir, d), 0o755); err != nil {
			return nil, err
		}
	}
	type server struct {
		Port, Burst, Status int
		Rate, Flag          string
		RetryAfter          string
		Headers             []string
	}
	var servers []server
	for _, c := range cases {
		s := server{Port: c.port, Burst: c.shape.Burst, Status: c.shape.Status, Flag: c.flag, RetryAfter: c.shape.RetryAfter}
		// limit_req's rate is whole requests per second or per minute.
		if c.shape.Rate >= 1 && c.shape.Rate == float64(int(c.shape.Rate)) {
			s.Rate = fmt.Sprintf("%dr/s", int(c.shape.Rate))
		} else {
			s.Rate = fmt.Sprintf("%dr/m", int(c.shape.Rate*60))
		}
		for k, v := range c.shape.Headers {
			s.Headers = append(s.Headers, k+" "+v)
		}
		servers = append(servers, s)
	}
	var conf bytes.Buffer
	if err := template.Must(template.New("nginx").Parse(nginxConf)).Execute(&conf, map[string]any{"Dir": ndir, "Cases": servers}); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(ndir, "ok.json"), []byte(`{"ok":true}`+"\n"), 0o644); err != nil {
		return nil, err
	}
	confPath := filepath.Join(ndir, "nginx.conf")
	if err := os.WriteFile(confPath, conf.Bytes(), 0o644); err != nil {
		return nil, err
	}
	n := &nginx{dir: ndir}
	n.cmd = exec.Command(bin, "-p", ndir, "-e", filepath.Join(ndir, "error.log"), "-c", confPath,
		"-g", "daemon off; master_process off; pid "+filepath.Join(ndir, "nginx.pid")+";")
	var stderr bytes.Buffer
	n.cmd.Stderr = &stderr
	if err := n.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nginx: %w", err)
	}
	for _, c := range cases {
		for i := 0; ; i++ {
			resp, err := http.Get(c.base() + "/healthz")
			if err == nil {
				resp.Body.Close()
				break
			}
			if i == 200 {
				n.stop()
				errLog, _ := os.ReadFile(filepath.Join(ndir, "error.log"))
				return nil, fmt.Errorf("nginx did not come up on %d: %v\n%s%s", c.port, err, stderr.String(), errLog)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
	return n, nil
}

func (n *nginx) stop() {
	n.cmd.Process.Signal(os.Interrupt)
	n.cmd.Wait()
}

// count reads the access log into each case's received.
func (n *nginx) count(cases []*bcase) error {
	f, err := os.Open(filepath.Join(n.dir, "access.log"))
	if err != nil {
		return err
	}
	defer f.Close()
	byPort := map[int]*bcase{}
	for _, c := range cases {
		byPort[c.port] = c
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		port, _, _ := strings.Cut(sc.Text(), " ")
		p, err := strconv.Atoi(port)
		if err != nil {
			return fmt.Errorf("access log line %q", sc.Text())
		}
		if c := byPort[p]; c != nil {
			c.received++
		}
	}
	return sc.Err()
}

func report(out io.Writer, cases []*bcase, ns []int) {
	oracle := map[string]time.Duration{}
	for _, c := range cases {
		if c.client == "oracle" {
			oracle[fmt.Sprintf("%s/%d", c.shape.Name, c.n)] = c.elapsed
		}
	}
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tn\tclient\ttime\tx oracle\trefused\trequests sent\tserver received\t\t")
	for _, c := range cases {
		o := oracle[fmt.Sprintf("%s/%d", c.shape.Name, c.n)]
		ratio := "-"
		if o > 0 {
			ratio = fmt.Sprintf("%.2f", c.elapsed.Seconds()/o.Seconds())
		}
		share := 0.0
		if c.sent > 0 {
			share = 100 * float64(c.refused) / float64(c.sent)
		}
		status := c.note
		if c.err != nil {
			status = "error: " + c.err.Error()
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%.1fs\t%s\t%.1f%%\t%d\t%d\t  %s\t\n", c.shape.Name, c.n, c.client,
			c.elapsed.Seconds(), ratio, share, c.sent, c.received, status)
	}
	tw.Flush()
}

// usedPorts are the ports freePort has handed out: the kernel may hand a
// closed one out again.
var usedPorts = map[int]bool{}

func freePort() (int, error) {
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		ln.Close()
		if !usedPorts[port] {
			usedPorts[port] = true
			return port, nil
		}
	}
}
