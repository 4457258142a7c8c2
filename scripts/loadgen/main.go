// Command loadgen sends GET requests at a fixed rate, open loop, and prints
// latency percentiles. It is the load generator of scripts/bench-api.sh.
//
// Request i is scheduled at start + i/rate and sent from a goroutine of its
// own whether or not earlier requests have answered, so a slow server does
// not slow the offered load. Latency is measured from the scheduled time,
// not from the moment the request left: a generator that falls behind
// counts its own lag against the server instead of hiding it (coordinated
// omission). Tokens are used round-robin, one per request.
//
// Usage:
//
//	loadgen -url URL -tokens FILE [-rate 200] [-duration 30s] [-timeout 10s]
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
}

// result is one request's outcome.
type result struct {
	latency time.Duration // from the scheduled send time to the last body byte
	lag     time.Duration // from the scheduled send time to the actual send
	status  int           // 0 on a transport error
	bytes   int64
	err     error
}

func run(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	url := fs.String("url", "", "`URL` to GET")
	tokensPath := fs.String("tokens", "", "`file` of bearer tokens, one a line, used round-robin")
	rate := fs.Float64("rate", 200, "requests per second")
	duration := fs.Duration("duration", 30*time.Second, "how long to send")
	timeout := fs.Duration("timeout", 10*time.Second, "per-request timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *url == "" || *rate <= 0 || *duration <= 0 {
		return errors.New("usage: loadgen -url URL [-tokens FILE] [-rate N] [-duration D]")
	}
	tokens, err := readTokens(*tokensPath)
	if err != nil {
		return err
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	client := &http.Client{
		Timeout: *timeout,
		Transport: &http.Transport{
			MaxIdleConns:        1000,
			MaxIdleConnsPerHost: 1000,
			IdleConnTimeout:     90 * time.Second,
			DisableCompression:  true,
		},
	}
	n := int(float64(*duration/time.Millisecond) * *rate / 1000)
	interval := time.Duration(float64(time.Second) / *rate)
	results := make([]result, n)
	var wg sync.WaitGroup
	start := time.Now().Add(50 * time.Millisecond)
	sent := 0
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		tok := ""
		if len(tokens) > 0 {
			tok = tokens[i%len(tokens)]
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = get(client, *url, tok, due)
		}()
		sent++
	}
	sending := time.Since(start)
	wg.Wait()
	report(stdout, results[:sent], sending, *rate)
	return nil
}

func get(client *http.Client, url, token string, due time.Time) result {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return result{err: err}
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	sent := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return result{latency: time.Since(due), lag: sent.Sub(due), err: err}
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return result{latency: time.Since(due), lag: sent.Sub(due), status: resp.StatusCode, bytes: n, err: err}
}

func readTokens(path string) ([]string, error) {
	if path == "" {
		return nil, nil
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if t := strings.TrimSpace(sc.Text()); t != "" {
			out = append(out, t)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	return out, nil
}

// report prints one "key value" line per figure, so a script can grep them.
// Percentiles are over every request sent, errors included (an error's
// latency is how long it took to fail), nearest-rank.
func report(w io.Writer, rs []result, sending time.Duration, rate float64) {
	lat := make([]time.Duration, 0, len(rs))
	var lags []time.Duration
	statuses := map[int]int{}
	errs, non200 := 0, 0
	var bytes int64
	var firstErr error
	for _, r := range rs {
		lat = append(lat, r.latency)
		lags = append(lags, r.lag)
		bytes += r.bytes
		switch {
		case r.err != nil:
			errs++
			if firstErr == nil {
				firstErr = r.err
			}
		case r.status != http.StatusOK:
			non200++
		}
		if r.err == nil {
			statuses[r.status]++
		}
	}
	slices.Sort(lat)
	slices.Sort(lags)
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/float64(time.Millisecond)) }
	pct := func(s []time.Duration, p float64) time.Duration {
		if len(s) == 0 {
			return 0
		}
		i := int(p*float64(len(s))+0.999999) - 1
		return s[min(max(i, 0), len(s)-1)]
	}
	fmt.Fprintf(w, "target_rate %.0f\n", rate)
	fmt.Fprintf(w, "requests %d\n", len(rs))
	// The rate requests went out at, over the sending period only.
	fmt.Fprintf(w, "achieved_rate %.1f\n", float64(len(rs))/sending.Seconds())
	fmt.Fprintf(w, "errors %d\n", errs)
	fmt.Fprintf(w, "non_200 %d\n", non200)
	var codes []int
	for c := range statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d:%d", c, statuses[c]))
	}
	fmt.Fprintf(w, "statuses %s\n", strings.Join(parts, ","))
	if len(rs) > 0 {
		fmt.Fprintf(w, "mean_bytes %d\n", bytes/int64(len(rs)))
	}
	fmt.Fprintf(w, "p50_ms %s\n", ms(pct(lat, 0.50)))
	fmt.Fprintf(w, "p90_ms %s\n", ms(pct(lat, 0.90)))
	fmt.Fprintf(w, "p99_ms %s\n", ms(pct(lat, 0.99)))
	fmt.Fprintf(w, "max_ms %s\n", ms(pct(lat, 1)))
	fmt.Fprintf(w, "send_lag_p99_ms %s\n", ms(pct(lags, 0.99)))
	if firstErr != nil {
		fmt.Fprintf(w, "first_error %v\n", firstErr)
	}
}
