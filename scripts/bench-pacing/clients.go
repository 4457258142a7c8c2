package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

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

// tally counts a client's requests and refusals, over the whole fetch and
// after its first minute (from its first request), which is how the
// targets judge refusals: slow start's overshoot is the first minute's.
// Safe for concurrent use.
type tally struct {
	mu                sync.Mutex
	first             time.Time
	sent, refused     int
	late, lateRefused int
}

// add counts a request sent at at, refused or not.
func (t *tally) add(at time.Time, refused bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.first.IsZero() || at.Before(t.first) {
		t.first = at // a first request that came back after a later one
	}
	t.sent++
	if refused {
		t.refused++
	}
	if at.Sub(t.first) >= time.Minute {
		t.late++
		if refused {
			t.lateRefused++
		}
	}
}

// oracle fetches n items one at a time, paced by x/time/rate at the hidden
// rate and burst.
func (c *bcase) oracle(ctx context.Context, n int, prefix string, t *tally) error {
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
			return err
		}
		at := time.Now()
		status, ra, err := get(ctx, fmt.Sprintf("%s%s%d", c.base(), prefix, i))
		if err != nil {
			return err
		}
		t.add(at, refusal(status))
		if refusal(status) {
			if d, ok := retryAfter(ra); ok {
				time.Sleep(d)
			}
			continue
		}
		i++
	}
	return nil
}

// retry fetches n items four at a time, unpaced, retrying refusals after
// Retry-After or 1s, 2s, 4s ... 30s.
func (c *bcase) retry(ctx context.Context, n int, prefix string, t *tally) error {
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
					at := time.Now()
					status, ra, err := get(ctx, fmt.Sprintf("%s%s%d", c.base(), prefix, i))
					t.add(at, refusal(status))
					if err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
					}
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
	return first
}

func retryAfter(v string) (time.Duration, bool) {
	s, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || s < 0 {
		return 0, false
	}
	return time.Duration(s) * time.Second, true
}
