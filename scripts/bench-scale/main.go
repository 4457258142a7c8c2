// Command bench-scale measures a run at the scale of a state: the real
// auditd binary (auditd serve, fsync on) fetching n items from a fast
// upstream on loopback (every request answered at once with a small JSON
// body), as a batch run and as a proxy-mode run, each in a data directory
// of its own (docs/bench/fetch.md).
//
//   - batch: a run created open, its items submitted in pages of -page
//     items, each page's JSON generated as it is sent (the program never
//     holds the run), no more than two pages ahead of the items done;
//   - proxy: -workers clients sending the n requests through the proxy
//     route, each naming the run, until it is finished;
//   - ndjson: a run created open, all n items submitted in one page
//     streamed as NDJSON (generated as it is sent), then finished; it
//     prints besides the submit's time and the service's largest
//     anonymous memory while it lasted.
//
// For each it prints the service's anonymous memory (RssAnon of
// /proc/PID/status) when a quarter of the items are done and when all
// are, and the most sampled while 20% to 30% were done and while 90% to
// 100% were, the most it took while the finished run was reconciled in the
// service (as the log line at a run's end asks for it), the run's wall
// time, the time to list every item by cursor (pages
// of 1,000), the time of `auditd reconcile --data` of the run once the
// service has stopped (the second of two, warm), and the bbolt file's size,
// its bytes per item, and the share of its pages that are free; then it
// compacts the file (auditd compact) and prints its size after.
//
// Usage: go run ./scripts/bench-scale [-n 1000000] [-mode batch,proxy,ndjson]
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
)

const token = "bench-scale-admin-token-0123456789abcdef"

func main() {
	n := flag.Int("n", 1_000_000, "items per run")
	modes := flag.String("mode", "batch,proxy", "runs to measure, comma-separated: batch, proxy, ndjson")
	page := flag.Int("page", 50_000, "items per page of the batch run")
	workers := flag.Int("workers", 32, "clients of the proxy run")
	bin := flag.String("auditd", "", "auditd binary (default: built from ./cmd/auditd)")
	keep := flag.Bool("keep", false, "keep the data directories")
	flag.Parse()

	tmp, err := os.MkdirTemp("", "bench-scale")
	if err != nil {
		log.Fatal(err)
	}
	if !*keep {
		defer os.RemoveAll(tmp)
	}
	if *bin == "" {
		*bin = filepath.Join(tmp, "auditd")
		build := exec.Command("go", "build", "-o", *bin, "./cmd/auditd")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			log.Fatal(err)
		}
	}
	up := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"features":[]}`)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go up.Serve(ln)

	for _, mode := range strings.Split(*modes, ",") {
		b := &bench{bin: *bin, dir: filepath.Join(tmp, mode), n: *n, upstream: "http://" + ln.Addr().String()}
		b.start()
		var id string
		switch mode {
		case "batch":
			id = b.batch(*page)
		case "proxy":
			id = b.proxy(*workers)
		case "ndjson":
			id = b.ndjson()
		default:
			log.Fatalf("unknown mode %q", mode)
		}
		b.settle(id)
		b.report(mode, id)
	}
}

// bench is one run's measurement against its own auditd serve.
type bench struct {
	bin, dir, upstream string
	n                  int
	cmd                *exec.Cmd
	url                string
	client             *http.Client

	started, ended time.Time
	rssQuarter     int64 // kB when a quarter of the items were done
	rssAll         int64 // kB when all were
	// The most kB sampled while 20% to 30% of the items were done, and
	// while 90% to 100% were: a single sample falls anywhere on the
	// garbage collector's sawtooth, and the peaks compare like with like.
	peakQuarter, peakEnd int64

	submit    time.Duration // ndjson: the streamed page's submit
	rssSubmit int64         // ndjson: the most kB while it lasted

	settled   time.Duration // the finished run's reconciliation in the service
	rssSettle int64         // the most kB while it lasted
}

// settle asks the service for finished run id's reconciliation, which the
// service computes once (its log line at the run's end asks for it too),
// and notes the most anonymous memory the service took until it came.
func (b *bench) settle(id string) {
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			b.rssSettle = max(b.rssSettle, b.rss())
			select {
			case <-done:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	start := time.Now()
	var rep struct {
		Balanced bool `json:"balanced"`
	}
	b.call("GET", "/v1/runs/"+id+"/reconciliation", nil, &rep)
	b.settled = time.Since(start)
	close(done)
	<-sampled
	if !rep.Balanced {
		log.Fatalf("run %s does not balance", id)
	}
}

func (b *bench) start() {
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		log.Fatal(err)
	}
	config := filepath.Join(b.dir, "sources.yaml")
	src := fmt.Sprintf("sources:\n  - id: fast\n    base_url: %s\n    limit: 1000000\n    window: 1s\n    burst: 100000\n    concurrency: 64\n", b.upstream)
	if err := os.WriteFile(config, []byte(src), 0o600); err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	b.cmd = exec.Command(b.bin, "serve", "--data", filepath.Join(b.dir, "data"), "--addr", addr, "--config", config,
		"--start-limit", "1000000", "--start-window", "1s",
		"--token-limit", "1000000", "--token-window", "1s", "--token-burst", "1000000", "--log-level", "warn")
	b.cmd.Env = append(os.Environ(), "AUDITD_BOOTSTRAP_TOKEN="+token)
	logs, err := os.Create(filepath.Join(b.dir, "serve.log"))
	if err != nil {
		log.Fatal(err)
	}
	b.cmd.Stdout, b.cmd.Stderr = logs, logs
	if err := b.cmd.Start(); err != nil {
		log.Fatal(err)
	}
	b.url = "http://" + addr
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	b.client = &http.Client{Transport: tr, Timeout: 5 * time.Minute}
	for i := 0; ; i++ {
		if resp, err := http.Get(b.url + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		if i == 400 {
			log.Fatalf("auditd serve did not come up; see %s", logs.Name())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// call sends an API request and decodes a 2xx answer into out.
func (b *bench) call(method, path string, body io.Reader, out any) {
	req, _ := http.NewRequest(method, b.url+path, body)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := b.client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		log.Fatalf("%s %s: %d %s", method, path, resp.StatusCode, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			log.Fatalf("%s %s: %v", method, path, err)
		}
	}
}

// run is what the benchmark reads of a run.
type run struct {
	ID        string `json:"id"`
	Status    string `json:"status"`
	ItemCount int    `json:"item_count"`
	Counts    struct {
		Items     int `json:"items"`
		Succeeded int `json:"succeeded"`
		Failed    int `json:"failed"`
		Pending   int `json:"pending"`
	} `json:"counts"`
}

func (b *bench) get(id string) run {
	var r run
	b.call("GET", "/v1/runs/"+id, nil, &r)
	return r
}

// rss is the service's anonymous memory now, in kB.
func (b *bench) rss() int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", b.cmd.Process.Pid))
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "RssAnon:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb
		}
	}
	log.Fatal("no RssAnon in /proc/PID/status")
	return 0
}

// sample notes the memory once done items pass a quarter of the run, and
// once all are done.
// It keeps the peaks of the bands around them too (peakQuarter, peakEnd).
func (b *bench) sample(done int) {
	if b.rssQuarter == 0 && done >= b.n/4 {
		b.rssQuarter = b.rss()
	}
	if b.rssAll == 0 && done >= b.n {
		b.rssAll = b.rss()
	}
	switch {
	case 10*done >= 2*b.n && 10*done <= 3*b.n:
		b.peakQuarter = max(b.peakQuarter, b.rss())
	case 10*done >= 9*b.n:
		b.peakEnd = max(b.peakEnd, b.rss())
	}
}

// batch submits an open run in pages, streamed, and waits for its end.
func (b *bench) batch(page int) string {
	var r run
	b.started = time.Now()
	b.call("POST", "/v1/runs", strings.NewReader(`{"name":"scale-batch","open":true,"items":[]}`), &r)
	id := r.ID
	for from := 0; from < b.n; from += page {
		for {
			r = b.get(id)
			done := r.Counts.Items - r.Counts.Pending
			b.sample(done)
			if from-done <= page { // at most two pages ahead
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(writePage(pw, from, min(page, b.n-from))) }()
		b.call("POST", "/v1/runs/"+id+"/items", pr, nil)
	}
	b.call("POST", "/v1/runs/"+id+"/finish", nil, nil)
	return b.wait(id)
}

// wait samples the memory of finished run id until it ends.
func (b *bench) wait(id string) string {
	var r run
	for {
		r = b.get(id)
		b.sample(r.Counts.Items - r.Counts.Pending)
		if r.Status != "running" {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.ended = time.Now()
	b.check(r)
	return id
}

// ndjson submits an open run's n items in one page streamed as NDJSON,
// noting the most memory the service took meanwhile, then finishes it
// and waits for its end.
func (b *bench) ndjson() string {
	var r run
	b.started = time.Now()
	b.call("POST", "/v1/runs", strings.NewReader(`{"name":"scale-ndjson","open":true,"items":[]}`), &r)
	id := r.ID
	stop := make(chan struct{})
	peak := make(chan int64)
	go func() {
		most := int64(0)
		for {
			most = max(most, b.rss())
			select {
			case <-stop:
				peak <- most
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	pr, pw := io.Pipe()
	go func() {
		bw := bufio.NewWriterSize(pw, 64<<10)
		for i := range b.n {
			fmt.Fprintf(bw, `{"key":"parcel-%08d","source":"fast","path":"/query?where=OBJECTID%%3D%d&f=json"}`+"\n", i, i)
		}
		pw.CloseWithError(bw.Flush())
	}()
	start := time.Now()
	req, _ := http.NewRequest("POST", b.url+"/v1/runs/"+id+"/items", pr)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/x-ndjson")
	resp, err := b.client.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	b.submit = time.Since(start)
	close(stop)
	b.rssSubmit = <-peak
	if resp.StatusCode != 200 {
		log.Fatalf("POST the streamed page: %d %s", resp.StatusCode, raw)
	}
	b.call("POST", "/v1/runs/"+id+"/finish", nil, nil)
	return b.wait(id)
}

// writePage writes the JSON of a page of n items from index from.
func writePage(w io.Writer, from, n int) error {
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"items":[`)
	for i := from; i < from+n; i++ {
		if i > from {
			bw.WriteByte(',')
		}
		fmt.Fprintf(bw, `{"key":"parcel-%08d","source":"fast","path":"/query?where=OBJECTID%%3D%d&f=json"}`, i, i)
	}
	bw.WriteString(`]}`)
	return bw.Flush()
}

// proxy sends n requests through the proxy route and finishes the run.
func (b *bench) proxy(workers int) string {
	var r run
	b.call("POST", "/v1/runs", strings.NewReader(`{"name":"scale-proxy","mode":"proxy","idle_timeout":"1h"}`), &r)
	id := r.ID
	b.started = time.Now()
	var next, done, failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1) - 1; i < int64(b.n); i = next.Add(1) - 1 {
				req, _ := http.NewRequest("GET", fmt.Sprintf("%s/proxy/fast/query?where=OBJECTID%%3D%d&f=json", b.url, i), nil)
				req.Header.Set("Proxy-Authorization", "Bearer "+token)
				req.Header.Set("Auditd-Run", id)
				resp, err := b.client.Do(req)
				if err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
				if err != nil || resp.StatusCode != 200 {
					failed.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
				if d := int(done.Load()); d < b.n {
					b.sample(d)
				}
			}
		}
	}()
	wg.Wait()
	close(stop)
	b.call("POST", "/v1/runs/"+id+"/finish", nil, &r)
	b.ended = time.Now()
	b.sample(b.n)
	if failed.Load() > 0 {
		log.Printf("%d proxied requests failed", failed.Load())
	}
	b.check(r)
	return id
}

func (b *bench) check(r run) {
	if r.Status != "succeeded" || r.ItemCount != b.n || r.Counts.Succeeded != b.n {
		log.Fatalf("run %s: %s, %d items, %d succeeded, %d failed; want %d succeeded", r.ID, r.Status, r.ItemCount, r.Counts.Succeeded, r.Counts.Failed, b.n)
	}
}

// report lists the run's items, stops the service, reconciles the run
// offline and reads the bbolt file's figures, and prints them all.
func (b *bench) report(mode, id string) {
	start := time.Now()
	listed, cursor := 0, ""
	for {
		var p struct {
			Items      []json.RawMessage `json:"items"`
			NextCursor string            `json:"next_cursor"`
		}
		path := "/v1/runs/" + id + "/items?limit=1000"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		b.call("GET", path, nil, &p)
		listed += len(p.Items)
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	list := time.Since(start)
	if listed != b.n {
		log.Fatalf("listed %d items, want %d", listed, b.n)
	}
	b.cmd.Process.Signal(syscall.SIGTERM)
	b.cmd.Wait()

	var reconcile time.Duration
	var reconcileRSS int64
	for range 2 {
		start := time.Now()
		cmd := exec.Command(b.bin, "reconcile", "--data", filepath.Join(b.dir, "data"), "--run", id)
		out, err := cmd.CombinedOutput()
		reconcile = time.Since(start)
		if err != nil {
			log.Fatalf("auditd reconcile: %v\n%s", err, out)
		}
		reconcileRSS = cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss
	}

	path := filepath.Join(b.dir, "data", "auditd.db")
	fi, err := os.Stat(path)
	if err != nil {
		log.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second}) // not read-only: a read-only open loads no freelist
	if err != nil {
		log.Fatal(err)
	}
	st := db.Stats()
	pages := fi.Size() / int64(db.Info().PageSize)
	db.Close()
	free := float64(st.FreePageN+st.PendingPageN) / float64(pages)

	out, err := exec.Command(b.bin, "compact", "--data", filepath.Join(b.dir, "data")).CombinedOutput()
	if err != nil {
		log.Fatalf("auditd compact: %v\n%s", err, out)
	}
	compacted, err := os.Stat(path)
	if err != nil {
		log.Fatal(err)
	}

	var w bytes.Buffer
	fmt.Fprintf(&w, "%s run of %d items: %v (%.0f items/s)\n", mode, b.n, b.ended.Sub(b.started).Round(time.Second), float64(b.n)/b.ended.Sub(b.started).Seconds())
	fmt.Fprintf(&w, "  anonymous memory: %.1f MB at %d items done, %.1f MB at %d (%+.1f%%)\n",
		float64(b.rssQuarter)/1024, b.n/4, float64(b.rssAll)/1024, b.n, 100*float64(b.rssAll-b.rssQuarter)/float64(b.rssQuarter))
	fmt.Fprintf(&w, "  anonymous memory at most: %.1f MB while 20%% to 30%% of the items were done, %.1f MB while 90%% to 100%% (%+.1f%%)\n",
		float64(b.peakQuarter)/1024, float64(b.peakEnd)/1024, 100*float64(b.peakEnd-b.peakQuarter)/float64(max(1, b.peakQuarter)))
	if b.submit > 0 {
		fmt.Fprintf(&w, "  streamed submit of %d items: %v, anonymous memory at most %.1f MB meanwhile\n", b.n, b.submit.Round(time.Millisecond), float64(b.rssSubmit)/1024)
	}
	fmt.Fprintf(&w, "  its reconciliation in the service: %v, anonymous memory at most %.1f MB meanwhile\n", b.settled.Round(time.Millisecond), float64(b.rssSettle)/1024)
	fmt.Fprintf(&w, "  items listed by cursor: %d in %v\n", listed, list.Round(time.Millisecond))
	fmt.Fprintf(&w, "  auditd reconcile --data (warm): %v, peak RSS %.0f MB\n", reconcile.Round(time.Millisecond), float64(reconcileRSS)/1024)
	fmt.Fprintf(&w, "  bbolt file: %.1f MB, %.0f bytes per item, %.1f%% of its pages free\n",
		float64(fi.Size())/(1<<20), float64(fi.Size())/float64(b.n), 100*free)
	fmt.Fprintf(&w, "  after auditd compact: %.1f MB, %.0f bytes per item\n", float64(compacted.Size())/(1<<20), float64(compacted.Size())/float64(b.n))
	fmt.Print(w.String())
}
