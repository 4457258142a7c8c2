// Command bench-concurrency measures how close auditd's concurrency
// learning comes to a client told the limit, against real HTTP servers on
// loopback that refuse beyond N requests in flight, each admitted request
// taking 300 ms (docs/bench/pacing.md).
//
// For each shape (N of 2, 4 and 8; refusals a 503 with Retry-After: 1, or a
// plain 429) and each size it starts three servers, each with its own
// count, and fetches n items from each with one client:
//
//   - learning: the fetch loop's gates and learning as a library (package
//     limiter on the real clock, package registry with its default
//     options), the source registered with a base URL and a ceiling of 60
//     a second only, so that it starts at the default concurrency; as many
//     workers as learning may grow to (registry.MaxConcurrency), each
//     passing the limiter, sending, and handing the response and the
//     number in flight to both, as the fetch loop does;
//   - oracle: N workers, told the limit, retrying a refusal after its
//     Retry-After;
//   - retry: no pacing, four requests at a time, retrying a refusal after
//     its Retry-After or an exponential backoff from 1s to 30s, as
//     go-retryablehttp does.
//
// Every case runs at once. It prints, per shape and size: each client's
// time against the oracle's, the share of its requests refused (all, and
// after the first minute), the requests each server received, and the
// concurrency learning ended with.
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
	"sync/atomic"
	"text/tabwriter"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// latency is how long a server holds a request it admits.
const latency = 300 * time.Millisecond

// shape is one hidden concurrency limit.
type shape struct {
	max        int  // requests in flight the server takes
	retryAfter bool // refuse with 503 and Retry-After: 1; else a plain 429
}

func (s shape) String() string {
	if s.retryAfter {
		return fmt.Sprintf("%d in flight, 503 + Retry-After", s.max)
	}
	return fmt.Sprintf("%d in flight, plain 429", s.max)
}

// result is what one client did.
type result struct {
	took          time.Duration
	sent, refused int
	late, lateRef int // sent and refused after the first minute
	received      int64
	concurrency   int // learning's, at the end; 0 for the others
	concChanges   int
	learnedPerSec float64
	err           error
}

// bcase is one shape at one size, with a result per client.
type bcase struct {
	shape                   shape
	n                       int
	learning, oracle, retry result
}

var httpClient = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 200, MaxConnsPerHost: 0}}

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench-concurrency:", err)
		os.Exit(1)
	}
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench-concurrency", flag.ContinueOnError)
	sizes := fs.String("n", "300,1000", "items per case, comma-separated")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var ns []int
	for _, f := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			return fmt.Errorf("-n: %q is not a count", f)
		}
		ns = append(ns, n)
	}
	dir, err := os.MkdirTemp("", "bench-concurrency")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	var cases []*bcase
	for _, m := range []int{2, 4, 8} {
		for _, ra := range []bool{true, false} {
			for _, n := range ns {
				cases = append(cases, &bcase{shape: shape{max: m, retryAfter: ra}, n: n})
			}
		}
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for i, c := range cases {
		for _, r := range []struct {
			res   *result
			fetch func(context.Context, string, *result) error
		}{
			{&c.learning, func(ctx context.Context, base string, res *result) error {
				return c.learn(ctx, base, filepath.Join(dir, fmt.Sprintf("case%d.db", i)), res)
			}},
			{&c.oracle, c.oracleFetch},
			{&c.retry, c.retryFetch},
		} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				srv, base, err := serve(c.shape)
				if err != nil {
					r.res.err = err
					return
				}
				defer srv.Close()
				start := time.Now()
				r.res.err = r.fetch(ctx, base, r.res)
				r.res.took = time.Since(start)
				r.res.received = srv.received.Load()
			}()
		}
	}
	wg.Wait()
	report(out, cases)
	for _, c := range cases {
		for _, r := range []result{c.learning, c.oracle, c.retry} {
			if r.err != nil {
				return fmt.Errorf("%v, %d items: %w", c.shape, c.n, r.err)
			}
		}
	}
	return nil
}

// server refuses a request that arrives with max in flight already.
type server struct {
	shape    shape
	inFlight atomic.Int64
	received atomic.Int64
	http     *http.Server
}

func serve(s shape) (*server, string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, "", err
	}
	srv := &server{shape: s}
	srv.http = &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
	go srv.http.Serve(ln)
	return srv, "http://" + ln.Addr().String(), nil
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.received.Add(1)
	defer s.inFlight.Add(-1)
	if s.inFlight.Add(1) > int64(s.shape.max) {
		if s.shape.retryAfter {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusTooManyRequests)
		return
	}
	time.Sleep(latency)
	io.WriteString(w, "ok\n")
}

func (s *server) Close() { s.http.Close() }

// get sends one request and returns its status and headers.
func get(ctx context.Context, url string) (int, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header, nil
}

func refusal(status int) bool { return status == 429 || status == 503 }

// tally counts requests, concurrently.
type tally struct {
	mu    sync.Mutex
	start time.Time
	res   *result
}

// add counts a request that left at sent, refused or not: the first
// minute is judged by when a request left, as bench-pacing does.
func (t *tally) add(sent time.Time, refused bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.res.sent++
	late := sent.Sub(t.start) >= time.Minute
	if late {
		t.res.late++
	}
	if refused {
		t.res.refused++
		if late {
			t.res.lateRef++
		}
	}
}

// items hands out item numbers to workers.
type items struct {
	next atomic.Int64
	n    int64
}

func (it *items) take() (int64, bool) {
	i := it.next.Add(1) - 1
	return i, i < it.n
}

// workers runs fetch on k goroutines until it returns false or an error.
func workers(k int, fetch func() (bool, error)) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range k {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				more, err := fetch()
				if err != nil {
					mu.Lock()
					first = cmpErr(first, err)
					mu.Unlock()
					return
				}
				if !more {
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// oracleFetch fetches n items with exactly as many workers as the server
// takes in flight.
func (c *bcase) oracleFetch(ctx context.Context, base string, res *result) error {
	t := &tally{start: time.Now(), res: res}
	its := &items{n: int64(c.n)}
	return workers(c.shape.max, func() (bool, error) {
		i, ok := its.take()
		if !ok {
			return false, nil
		}
		for {
			at := time.Now()
			status, h, err := get(ctx, fmt.Sprintf("%s/item/%d", base, i))
			if err != nil {
				return false, err
			}
			t.add(at, refusal(status))
			if !refusal(status) {
				return true, nil
			}
			if d, ok := retryAfter(h.Get("Retry-After")); ok {
				time.Sleep(d)
			}
		}
	})
}

// retryFetch fetches n items four at a time, unpaced, retrying refusals
// after Retry-After or 1s, 2s, 4s ... 30s.
func (c *bcase) retryFetch(ctx context.Context, base string, res *result) error {
	t := &tally{start: time.Now(), res: res}
	its := &items{n: int64(c.n)}
	return workers(4, func() (bool, error) {
		i, ok := its.take()
		if !ok {
			return false, nil
		}
		wait := time.Second
		for {
			at := time.Now()
			status, h, err := get(ctx, fmt.Sprintf("%s/item/%d", base, i))
			if err != nil {
				return false, err
			}
			t.add(at, refusal(status))
			if !refusal(status) {
				return true, nil
			}
			d, ok := retryAfter(h.Get("Retry-After"))
			if !ok {
				d, wait = wait, min(2*wait, 30*time.Second)
			}
			time.Sleep(d)
		}
	})
}

func retryAfter(v string) (time.Duration, bool) {
	s, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}

// ledger keeps the registry's events in memory.
type ledger struct {
	mu     sync.Mutex
	events []auditd.Event
}

func (l *ledger) Append(_ context.Context, e auditd.Event) (auditd.Event, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e.Seq, e.Time = uint64(len(l.events)+1), time.Now()
	l.events = append(l.events, e)
	return e, nil
}

// ceiling is the learning client's operator ceiling per minute: 60 a
// second, above what every shape allows (8 in flight of 300 ms is 26.7 a
// second), so that what is measured is learning.
const ceiling = 3600

// openGates registers source id at base in a registry on db and
// configures a limiter from it, as the fetch loop configures a source's
// gates.
func openGates(ctx context.Context, db *bolt.DB, clk clock.Clock, id, base string) (*registry.Registry, *limiter.Limiter, *ledger, error) {
	led := &ledger{}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clk})
	if err != nil {
		return nil, nil, nil, err
	}
	src := auditd.Source{ID: id, BaseURL: base, Limit: ceiling, Window: auditd.Duration(time.Minute)}
	if err := reg.PutSource(ctx, "bench", src); err != nil {
		return nil, nil, nil, err
	}
	lim := limiter.New(clk)
	cfg := limiter.ConfigFromSource(src)
	cfg.BackoffBase = max(time.Minute/ceiling, 50*time.Millisecond) // as the fetch loop sets it
	if err := lim.Configure(id, cfg); err != nil {
		return nil, nil, nil, err
	}
	st, err := reg.State(id)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := lim.SetLimit(id, st.Limit, st.Window); err != nil {
		return nil, nil, nil, err
	}
	if err := lim.SetConcurrency(id, st.Concurrency); err != nil {
		return nil, nil, nil, err
	}
	return reg, lim, led, nil
}

// learn fetches n items through the limiter and the registry, as the fetch
// loop does, with registry.MaxConcurrency workers.
func (c *bcase) learn(ctx context.Context, base, dbPath string, res *result) error {
	db, err := bolt.Open(dbPath, 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		return err
	}
	defer db.Close()
	const id = "upstream"
	clk := clock.Real{}
	reg, lim, led, err := openGates(ctx, db, clk, id, base)
	if err != nil {
		return err
	}

	t := &tally{start: time.Now(), res: res}
	its := &items{n: int64(c.n)}
	err = workers(registry.MaxConcurrency, func() (bool, error) {
		i, ok := its.take()
		if !ok {
			return false, nil
		}
		for attempt := 1; ; attempt++ {
			p, err := lim.Acquire(ctx, id, limiter.Request{})
			if err != nil {
				return false, err
			}
			sent := clk.Now() // the real clock: also when the request left
			status, h, err := get(ctx, fmt.Sprintf("%s/item/%d", base, i))
			if err != nil {
				p.Release()
				return false, err
			}
			hint := hints.Parse(h, clk.Now())
			obs := registry.Observation{RunID: "bench", SourceID: id, Status: status, Sent: sent, Hint: hint, InFlight: p.InFlight}
			gate := hint
			gate.HasRemaining, gate.HasReset = false, false
			v := p.Observe(limiter.Outcome{Status: status, Hint: gate, Attempt: attempt, Refused: reg.Refusal(obs)})
			switch v.Class {
			case limiter.ClassThrottled:
				obs.Outcome = auditd.OutcomeThrottled
			case limiter.ClassSuccess:
				obs.Outcome = auditd.OutcomeSuccess
			default:
				obs.Outcome = auditd.OutcomeServerError
			}
			d, err := reg.Observe(ctx, obs)
			if err != nil {
				return false, err
			}
			if d.Retune {
				limit, window := d.Pace()
				if err := lim.SetLimit(id, limit, window); err != nil {
					return false, err
				}
			}
			if d.ConcurrencyChanged {
				if err := lim.SetConcurrency(id, d.Concurrency); err != nil {
					return false, err
				}
			}
			if d.Pause > 0 {
				lim.Pause(id, clk.Now().Add(d.Pause))
			}
			t.add(sent, refusal(status))
			if !refusal(status) {
				return true, nil
			}
		}
	})
	st, serr := reg.State(id)
	if serr != nil {
		return cmpErr(err, serr)
	}
	res.concurrency = st.Concurrency
	res.learnedPerSec = float64(st.Limit) / st.Window.Seconds()
	led.mu.Lock()
	for _, e := range led.events {
		if e.Cause == registry.CauseConcurrency {
			res.concChanges++
		}
	}
	led.mu.Unlock()
	return err
}

func report(out io.Writer, cases []*bcase) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shape\tn\toracle s\tlearning vs oracle\trefused (after 1 min)\tretry vs oracle\trefused (after 1 min)\treceived = sent (learning, oracle, retry)\tconcurrency learned (changes)\tpace shown/s\t")
	share := func(a, b int) string {
		if b == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(a)/float64(b))
	}
	for _, c := range cases {
		o, l, r := c.oracle, c.learning, c.retry
		fmt.Fprintf(tw, "%v\t%d\t%.1f\t%.2fx\t%s (%s)\t%.2fx\t%s (%s)\t%d=%d, %d=%d, %d=%d\t%d of %d (%d)\t%.3g\t\n",
			c.shape, c.n, o.took.Seconds(),
			l.took.Seconds()/o.took.Seconds(), share(l.refused, l.sent), share(l.lateRef, l.late),
			r.took.Seconds()/o.took.Seconds(), share(r.refused, r.sent), share(r.lateRef, r.late),
			l.received, l.sent, o.received, o.sent, r.received, r.sent,
			l.concurrency, c.shape.max, l.concChanges, l.learnedPerSec)
	}
	tw.Flush()
}
