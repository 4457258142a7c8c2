package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

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
	id, err := ad.submit(ctx, c.source(), "measured", c.n)
	if err != nil {
		return err
	}
	counts, err := ad.await(ctx, id)
	if err != nil {
		return err
	}
	c.elapsed = time.Since(start)
	c.sent, c.refused = counts.Dispatches, counts.Status429+counts.Status5xx
	t, err := ad.timed(ctx, id)
	if err != nil {
		return err
	}
	c.late, c.lateRefused = t.late, t.lateRefused
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
	c.learned, err = ad.learned(ctx, c.source())
	return err
}

// learned reads the pace auditd shows for source (its learned limit), in
// requests per second.
func (a *auditd) learned(ctx context.Context, source string) (float64, error) {
	var st struct {
		Learned struct {
			Limit  int    `json:"limit"`
			Window string `json:"window"`
		} `json:"learned"`
	}
	if code, body, err := a.call(ctx, "GET", "/v1/sources/"+source, nil, &st); err != nil || code != http.StatusOK {
		return 0, fmt.Errorf("get source: %d %s %v", code, body, err)
	}
	w, err := time.ParseDuration(st.Learned.Window)
	if err != nil || w <= 0 {
		return 0, fmt.Errorf("learned window %q: %v", st.Learned.Window, err)
	}
	return float64(st.Learned.Limit) / w.Seconds(), nil
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

// timed tallies run id's requests from its ledger: each dispatch at the
// time on record, refused when its answer (throttle or response) was a 429
// or a 5xx, as the run's counts count refusals.
func (a *auditd) timed(ctx context.Context, id string) (*tally, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", a.url+"/v1/runs/"+id+"/events?type=dispatch,throttle,response", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	req.Header.Set("Accept", "application/x-ndjson")
	resp, err := httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("events of run %s: %d %s", id, resp.StatusCode, body)
	}
	type attempt struct {
		key           string
		page, attempt int
	}
	sent := map[attempt]time.Time{}
	type request struct {
		at      time.Time
		refused bool
	}
	var requests []request
	dec := json.NewDecoder(resp.Body)
	for dec.More() {
		var e struct {
			Type    string    `json:"type"`
			ItemKey string    `json:"item_key"`
			Page    int       `json:"page"`
			Attempt int       `json:"attempt"`
			Time    time.Time `json:"time"`
			Status  int       `json:"status"`
		}
		if err := dec.Decode(&e); err != nil {
			return nil, fmt.Errorf("events of run %s: %w", id, err)
		}
		k := attempt{e.ItemKey, e.Page, e.Attempt}
		if e.Type == "dispatch" {
			sent[k] = e.Time
			continue
		}
		at, ok := sent[k]
		if !ok {
			return nil, fmt.Errorf("run %s: a %s of %v with no dispatch before it", id, e.Type, k)
		}
		delete(sent, k)
		requests = append(requests, request{at, e.Status == http.StatusTooManyRequests || e.Status >= 500})
	}
	for _, at := range sent { // a transport error: sent, not refused
		requests = append(requests, request{at, false})
	}
	t := &tally{}
	for _, r := range requests { // the first minute counts from the first dispatch
		if t.first.IsZero() || r.at.Before(t.first) {
			t.first = r.at
		}
	}
	for _, r := range requests {
		t.add(r.at, r.refused)
	}
	return t, nil
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
