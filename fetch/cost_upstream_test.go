package fetch_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
)

// TestProxyRecordsUpstream sends batch uploads through the proxy route to
// a real gateway that counts records (recordsUpstream: at most 4000 records
// in any 2 s) on the real clock: 8 clients post batches of 1 to 200
// records, each saying its cost in Auditd-Cost, and retry an answer of
// auditd's with the Retry-After it gave, under the same Idempotency-Key.
// The source is configured to the gateway's ceiling with 100 ms for
// delivery (4000 per 2.1 s, refilled at 1900 a second, bucket 400).
//
// It checks: the records the gateway received (accepted or not) never pass
// 4000 in any 2 s; at least 90% of the gateway's rate is used over the
// busy spell; every POST is admitted or answered by auditd with a
// Retry-After, and every record reaches the gateway exactly once.
func TestProxyRecordsUpstream(t *testing.T) {
	const (
		ceiling = 4000
		window  = 2 * time.Second
		clients = 8
	)
	spell := 8 * time.Second // four of the gateway's windows
	if testing.Short() {
		spell = 4 * time.Second
	}
	up := &recordsUpstream{clk: clock.Real{}, ceiling: ceiling, window: window}
	srv := httptest.NewServer(up)
	t.Cleanup(srv.Close)
	e := newProxyEnv(t, proxyEnvOptions{noSync: true})
	e.source(auditd.Source{ID: "gateway", BaseURL: srv.URL, Limit: ceiling, Window: auditd.Duration(window + 100*time.Millisecond),
		Rate: 1900, Burst: 400, Concurrency: clients, MaxAttempts: 10})
	id := e.proxyRun("")

	type sent struct {
		key     string
		records int
		answers []int // auditd's answers, in order; the last is 200
	}
	var (
		mu       sync.Mutex
		batches  []sent
		problems []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		problems = append(problems, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	start := time.Now()
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(c), 32))
			for j := 0; time.Since(start) < spell; j++ {
				b := sent{key: fmt.Sprintf("c%d-%d", c, j), records: 1 + r.IntN(200)}
				body := recordsBody(b.records, b.key)
				for {
					status, retryAfter, err := postRecords(e, id, b.key, body, b.records)
					if err != nil {
						fail("%s: %v", b.key, err)
						return
					}
					b.answers = append(b.answers, status)
					if status == http.StatusOK {
						break
					}
					if status != http.StatusServiceUnavailable || retryAfter < 1 {
						fail("%s: answered %d with Retry-After %d", b.key, status, retryAfter)
						return
					}
					time.Sleep(time.Duration(retryAfter) * time.Second) // as the client is told
				}
				mu.Lock()
				batches = append(batches, b)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(problems) > 0 {
		t.Fatalf("%d problems, the first: %s", len(problems), problems[0])
	}

	arr := up.snapshot()
	if most := busiest(arr, window); most > ceiling {
		t.Errorf("the gateway received %d records in one %v, over its ceiling of %d", most, window, ceiling)
	}
	accepted := map[string]int{}
	refused := 0
	for _, a := range arr {
		if a.accepted {
			accepted[a.key] += a.records
		} else {
			refused++
		}
	}
	sentRecords, retried := 0, 0
	for _, b := range batches {
		sentRecords += b.records
		if accepted[b.key] != b.records {
			t.Errorf("batch %s of %d records: the gateway accepted %d", b.key, b.records, accepted[b.key])
		}
		retried += len(b.answers) - 1
	}
	// The busy spell: from the first arrival to the last batch's; its
	// records against what the ceiling allows in it.
	first, last := arr[0].at, arr[len(arr)-1].at
	allowed := float64(ceiling) * last.Sub(first).Seconds() / window.Seconds()
	used := float64(sentRecords) / allowed
	t.Logf("%d batches, %d records in %v (%.1f%% of the gateway's rate); %d answered by auditd with Retry-After first; the gateway refused %d",
		len(batches), sentRecords, last.Sub(first).Round(time.Millisecond), 100*used, retried, refused)
	if used < 0.9 {
		t.Errorf("used %.1f%% of the gateway's rate, want at least 90%%", 100*used)
	}
	run := e.finish(id)
	if run.Counts.Dispatches < len(batches) {
		t.Errorf("run %+v: fewer dispatches than batches (%d)", run.Counts, len(batches))
	}
	e.reconcile(id)
}

// postRecords posts one batch through the proxy route as a pipeline would
// and returns auditd's answer and its Retry-After (0 when none).
func postRecords(e *proxyEnv, run, key string, body []byte, records int) (status, retryAfter int, err error) {
	req, err := http.NewRequestWithContext(context.Background(), "POST", e.srv.URL+"/proxy/gateway/records", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Proxy-Authorization", "Bearer "+e.token)
	req.Header.Set("Auditd-Run", run)
	req.Header.Set("Auditd-Item-Key", key+"#"+strconv.FormatInt(time.Now().UnixNano(), 36))
	req.Header.Set("Auditd-Cost", strconv.Itoa(records))
	req.Header.Set("Auditd-Deadline", "3s")
	req.Header.Set("Idempotency-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if v := resp.Header.Get("Retry-After"); v != "" {
		retryAfter, _ = strconv.Atoi(v)
	}
	return resp.StatusCode, retryAfter, nil
}
