package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/web/webtest"
)

// fleetViewJSON is what the tests read of GET /v1/fleet/sources.
type fleetViewJSON struct {
	Node       string `json:"node"`
	PeersError string `json:"peers_error"`
	Sources    []struct {
		Key           string   `json:"key"`
		Group         bool     `json:"group"`
		Members       []string `json:"members"`
		Limit         int      `json:"limit"`
		Window        string   `json:"window"`
		Learned       int      `json:"learned_limit"`
		LearnedWindow string   `json:"learned_window"`
		Nodes         []struct {
			Node       string    `json:"node"`
			ReportedAt time.Time `json:"reported_at"`
			Span       string    `json:"span"`
			Blocks     int64     `json:"blocks"`
			Reserved   int64     `json:"reserved"`
			Used       int64     `json:"used"`
			Wasted     int64     `json:"wasted"`
			Share      float64   `json:"share"`
			CutOff     bool      `json:"cut_off"`
			Etcd       string    `json:"etcd_latency"`
		} `json:"nodes"`
	} `json:"sources"`
}

// readFleetView reads node's view of the fleet, checked against openapi.yaml.
func readFleetView(t *testing.T, v *contractCheck, node *child, token string) fleetViewJSON {
	t.Helper()
	status, body := v.do(t, node.url, "GET", "/v1/fleet/sources", token, "")
	var out fleetViewJSON
	if status != http.StatusOK || json.Unmarshal(body, &out) != nil {
		t.Fatalf("GET /v1/fleet/sources: %d %s", status, body)
	}
	return out
}

// awaitFleetView polls node's view until ok holds, for at most within: the
// nodes publish every fleetViewEvery.
func awaitFleetView(t *testing.T, v *contractCheck, node *child, token string, within time.Duration, what string, ok func(fleetViewJSON) bool) fleetViewJSON {
	t.Helper()
	for deadline := time.Now().Add(within); ; time.Sleep(200 * time.Millisecond) {
		view := readFleetView(t, v, node, token)
		if ok(view) {
			return view
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v; the view: %+v", what, within, view)
		}
	}
}

// Three auditd nodes share source "up" through a three-member etcd: every
// node's GET /v1/fleet/sources shows the three nodes' slots of the last
// minute, this node first, shares summing to one and, summed, never more
// slots than the limit allows; each node's own row agrees with its
// metrics. Cut from etcd, node 3 shows itself cut off and says it cannot
// see the others, while the others see its report age. The Sources page
// shows a row per node, and the cut-off, in Chromium; a node not in a
// fleet shows no fleet at all.
func TestFleetViewShowsEveryNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three etcd members, four auditd nodes and a browser")
	}
	const limit, token = 20, "fleet-view-admin-token-0123456789ab"
	cluster := etcdtest.Start(t, 3)
	eps := cluster.Endpoints()
	cut := etcdtest.StartProxy(t, eps[2]) // node 3 reaches etcd only through it
	up := startFleetUpstream(t)
	f := startFleetNodes(t, up.URL, limit, token, func(i int) []string {
		ep := eps[i]
		if i == 2 {
			ep = cut.URL()
		}
		return []string{"--fleet-etcd", ep}
	})
	stop := make(chan struct{})
	wait := fleetLoad(t, f.nodes, f.runs, token, 4, stop)
	defer func() {
		cut.Heal()
		close(stop)
		wait()
		stopGracefully(t, f.nodes...)
	}()
	v := newContractCheck(t)
	names := []string{"node1", "node2", "node3"}

	t.Run("API", func(t *testing.T) {
		var views []fleetViewJSON
		for i, n := range f.nodes {
			me := names[i]
			view := awaitFleetView(t, v, n, token, 15*time.Second, me+" sees every node's slots", func(view fleetViewJSON) bool {
				if len(view.Sources) != 1 || len(view.Sources[0].Nodes) != 3 {
					return false
				}
				for _, row := range view.Sources[0].Nodes {
					if row.Used == 0 {
						return false
					}
				}
				return true
			})
			src := view.Sources[0]
			if view.Node != me || view.PeersError != "" || src.Key != "up" || src.Group || !slices.Equal(src.Members, []string{"up"}) ||
				src.Limit != limit || src.Window != "1s" || src.Learned == 0 {
				t.Errorf("%s: view %+v", me, view)
			}
			var got []string
			var share, perSecond float64
			for _, row := range src.Nodes {
				got = append(got, row.Node)
				share += row.Share
				span, err := time.ParseDuration(row.Span)
				etcd, err2 := time.ParseDuration(row.Etcd)
				if err != nil || err2 != nil || span <= 0 || span > time.Minute || etcd <= 0 || row.CutOff || row.Blocks == 0 ||
					row.Share <= 0 || row.Used > row.Reserved || row.Used+row.Wasted > row.Reserved+limit {
					t.Errorf("%s: row of %s: %+v", me, row.Node, row)
				}
				if row.Node != me && time.Since(row.ReportedAt) > 3*fleetViewEvery+time.Second {
					t.Errorf("%s: %s's report is %v old", me, row.Node, time.Since(row.ReportedAt))
				}
				// Slots granted in the span: no grant came before the load,
				// and each node's blocks reach at most a second (and the
				// lead) past now.
				perSecond += float64(row.Reserved) / (span + 3*fleet.DefaultBlock + fleet.DefaultLead).Seconds()
			}
			if !slices.Equal(got, append([]string{me}, slices.DeleteFunc(slices.Clone(names), func(s string) bool { return s == me })...)) {
				t.Errorf("%s: rows %v, want itself first, then the others by name", me, got)
			}
			if math.Abs(share-1) > 1e-9 {
				t.Errorf("%s: shares sum to %v", me, share)
			}
			if perSecond > limit {
				t.Errorf("%s: the nodes were granted %.1f slots a second, over the limit of %d", me, perSecond, limit)
			}
			// The node's own row is its counters now: what its metrics,
			// read after, hold at least.
			m := parseMetrics(t, scrape(t, n.url+"/metrics"))
			series := fmt.Sprintf(`{key="up",node="%s"}`, me)
			if own := src.Nodes[0]; float64(own.Reserved) > m["auditd_fleet_slots_reserved_total"+series] || float64(own.Used) > m["auditd_fleet_slots_used_total"+series] {
				t.Errorf("%s: own row %+v, more than its metrics: reserved %v, used %v", me, own,
					m["auditd_fleet_slots_reserved_total"+series], m["auditd_fleet_slots_used_total"+series])
			}
			t.Logf("%s: %+v", me, src.Nodes)
			views = append(views, view)
		}
		// What a node shows of another is that node's last report: never
		// more than the other shows of itself, read after.
		for i, n := range f.nodes {
			live := readFleetView(t, v, n, token).Sources[0].Nodes[0]
			for j, view := range views {
				for _, row := range view.Sources[0].Nodes {
					if row.Node == names[i] && (row.Reserved > live.Reserved || row.Used > live.Used || row.Blocks > live.Blocks) {
						t.Errorf("%s shows %s's slots %+v, more than %s counts now: %+v", names[j], names[i], row, names[i], live)
					}
				}
			}
		}
	})

	cut.Cut()
	cutAt := time.Now()
	node3 := awaitFleetView(t, v, f.nodes[2], token, 15*time.Second, "node 3 sees itself cut off", func(view fleetViewJSON) bool {
		return len(view.Sources) == 1 && len(view.Sources[0].Nodes) > 0 && view.Sources[0].Nodes[0].CutOff
	})
	if own := node3.Sources[0].Nodes[0]; node3.PeersError == "" || len(node3.Sources[0].Nodes) != 1 || own.Node != "node3" || own.Share != 0 {
		t.Errorf("node 3, cut off: the others are shown as known: %+v", node3)
	}
	node1 := readFleetView(t, v, f.nodes[0], token)
	for _, row := range node1.Sources[0].Nodes {
		if row.Node == "node3" && row.ReportedAt.After(cutAt) {
			t.Errorf("node 1 shows a report of node 3 from after its cut: %v", row.ReportedAt)
		}
		if row.Node == "node3" {
			t.Logf("node 1 sees node 3's report from %v before now", time.Since(row.ReportedAt))
		}
	}

	t.Run("Browser", func(t *testing.T) {
		exe := webtest.Chromium(t)
		b := newUIBrowser(t, exe)
		signIn := func(url string) {
			b.must("sign in at "+url, chromedp.Do(b.ctx,
				chromedp.Navigate(url+"/"),
				chromedp.WaitVisible(chromedp.CSS("#signin")),
				chromedp.SendKeys(chromedp.CSS("#token"), token),
				chromedp.Click(chromedp.CSS("#signin-submit")),
				chromedp.WaitVisible(chromedp.CSS("#runs-table tbody tr")),
				chromedp.Click(chromedp.CSS(`#nav a[data-nav="sources"]`)),
				chromedp.WaitVisible(chromedp.CSS(`#sources-table a[href="#/sources/up"]`)),
			))
		}
		signIn(f.nodes[0].url)
		b.must("node 1's fleet view", chromedp.Do(b.ctx, chromedp.WaitVisible(chromedp.CSS(`#fleet-view tr[data-node="node3"]`))))
		rows := b.evalList(`[...document.querySelectorAll('#fleet-up tbody tr')].map((tr) => tr.dataset.node)`)
		if !slices.Equal(rows, names) {
			t.Errorf("node 1's Sources page: fleet rows %v, want %v", rows, names)
		}
		if row := b.rowText(`#fleet-up tr[data-node="node1"] td`); !strings.Contains(row, "(this node)") || !strings.Contains(row, "%") {
			t.Errorf("node 1's own row: %q", row)
		}
		if b.eval(`document.querySelector('#fleet-cutoff') ? 'cut' : ''`) != "" {
			t.Errorf("node 1 says it is cut off: %s", b.text("#fleet-view"))
		}
		b.noJunk("node 1's Sources page")
		b.shot("fleet-sources", "")

		// A node's part of a fleet run says so on its Run page, with the
		// fleet run's verdict and downloads; a run of the node alone
		// does not.
		status, body := v.do(t, f.nodes[0].url, "POST", "/v1/fleet/runs", token, `{"name":"fleet pipeline"}`)
		var fr struct {
			ID string `json:"id"`
		}
		if status != http.StatusCreated || json.Unmarshal(body, &fr) != nil {
			t.Fatalf("create a fleet run on node 1: %d %s", status, body)
		}
		status, body = v.do(t, f.nodes[0].url, "GET", "/v1/runs/"+f.runs[0], token, "")
		if status != http.StatusOK || strings.Contains(string(body), `"fleet"`) {
			t.Errorf("GET /v1/runs/{id} of a run of node 1 alone: %d %s", status, body)
		}
		b.must("node 1's part of the fleet run", chromedp.Do(b.ctx,
			chromedp.Navigate(f.nodes[0].url+"/#/runs/"+fr.ID),
			chromedp.WaitVisible(chromedp.CSS(`#fleet-verdict.verdict`)),
			chromedp.WaitVisible(chromedp.CSS(`#dl-fleet-pack`)),
			// Recount asks the fleet again, and answers the same way.
			chromedp.Click(chromedp.CSS(`#fleet-recount`)),
			chromedp.WaitVisible(chromedp.CSS(`#fleet-verdict.verdict`)),
		))
		if text := b.text("#fleet-part"); !strings.Contains(text, "Part of a fleet run") || !strings.Contains(text, "node node1") || !strings.Contains(text, "of 1 nodes") {
			t.Errorf("node 1's part of the fleet run: %q", text)
		}
		b.noJunk("a fleet run's part")
		b.shot("fleet-run-part", "")

		// With node 2 holding a part too, a token only node 1 accepts
		// gets the fleet verdict's failure, and Recount, in its place.
		req, _ := http.NewRequest("GET", f.nodes[1].url+"/proxy/up/part2.json", nil)
		req.Header.Set("Proxy-Authorization", "Bearer "+token)
		req.Header.Set("Auditd-Run", fr.ID)
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("a request of the fleet run through node 2: %v %v", resp, err)
		} else {
			resp.Body.Close()
		}
		var own struct {
			Secret string `json:"secret"`
		}
		status, body = v.do(t, f.nodes[0].url, "POST", "/v1/tokens", token, `{"name":"node1 only","role":"auditor"}`)
		if status != http.StatusCreated || json.Unmarshal(body, &own) != nil {
			t.Fatalf("a token on node 1: %d %s", status, body)
		}
		b.eval(fmt.Sprintf(`sessionStorage.setItem('auditd.token', %q), 'ok'`, own.Secret))
		b.must("the fleet verdict refused", chromedp.Do(b.ctx,
			chromedp.Navigate(f.nodes[0].url+"/#/runs/"+f.runs[0]),
			chromedp.Navigate(f.nodes[0].url+"/#/runs/"+fr.ID),
			chromedp.WaitVisible(chromedp.CSS(`#fleet-verdict .problem`)),
			chromedp.WaitVisible(chromedp.CSS(`#fleet-recount`)),
		))
		if text := b.text("#fleet-verdict"); !strings.Contains(text, "Could not reconcile the fleet run") || !strings.Contains(text, "node node2 refused") || strings.Contains(text, "Reconciling") {
			t.Errorf("the fleet verdict with a token node 2 refuses: %q", text)
		}
		b.eval(fmt.Sprintf(`sessionStorage.setItem('auditd.token', %q), 'ok'`, token))
		b.expectConsole("status of 403 (Forbidden)")
		b.must("node 1's own run", chromedp.Do(b.ctx,
			chromedp.Navigate(f.nodes[0].url+"/#/runs/"+f.runs[0]),
			chromedp.WaitVisible(chromedp.CSS(`#run-summary[aria-busy="false"]`)),
		))
		if b.eval(`document.querySelector('#fleet-part') && !document.querySelector('#fleet-part').hidden ? 'shown' : ''`) != "" {
			t.Errorf("a run of node 1 alone shows a fleet part: %s", b.text("#fleet-part"))
		}
		// The Runs list marks the part, and only it.
		b.must("node 1's runs", chromedp.Do(b.ctx,
			chromedp.Navigate(f.nodes[0].url+"/#/runs"),
			chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#runs-table tr[data-run=%q] .badge-fleet`, fr.ID))),
		))
		if got := b.evalList(`[...document.querySelectorAll('#runs-table tr .badge-fleet')].map((e) => e.closest('tr').dataset.run)`); !slices.Equal(got, []string{fr.ID}) {
			t.Errorf("node 1's Runs list marks %v as fleet parts, want %s alone", got, fr.ID)
		}

		signIn(f.nodes[2].url)
		b.must("node 3's cut-off", chromedp.Do(b.ctx, chromedp.WaitVisible(chromedp.CSS(`#fleet-cutoff`))))
		if text := b.text("#fleet-cutoff"); !strings.Contains(text, "node3") || !strings.Contains(text, "cut off") {
			t.Errorf("node 3's cut-off note: %q", text)
		}
		if row := b.rowText(`#fleet-up tr[data-node="node3"] td`); !strings.Contains(row, "cut off") || !strings.Contains(row, "unknown") {
			t.Errorf("node 3's own row: %q", row)
		}
		b.noJunk("node 3's Sources page")
		b.shot("fleet-sources-cut-off", "")

		// Cut off, node 3 cannot tell whether its run is a part of a
		// fleet run, and says so rather than present it as a whole run.
		status, body = v.do(t, f.nodes[2].url, "GET", "/v1/runs/"+f.runs[2], token, "")
		if status != http.StatusOK || !strings.Contains(string(body), `"fleet":{"node":"node3","unknown":true}`) {
			t.Errorf("GET /v1/runs/{id} on node 3, cut off from etcd: %d %s", status, body)
		}
		b.must("node 3's run, cut off", chromedp.Do(b.ctx,
			chromedp.Navigate(f.nodes[2].url+"/#/runs/"+f.runs[2]),
			chromedp.WaitVisible(chromedp.CSS(`#fleet-unknown`)),
		))
		if text := b.text("#fleet-unknown"); !strings.Contains(text, "could not ask the fleet") {
			t.Errorf("node 3's run, cut off: %q", text)
		}

		alone := startServe(t, filepath.Join(t.TempDir(), "alone"), f.config, token)
		signIn(alone.url)
		// The stamp is set once the page is done, the fleet's part included.
		_, err := chromedp.Run(b.ctx, chromedp.Poll[bool](`document.querySelector('#sources-updated').textContent !== ''`))
		b.must("sources page done", err)
		if got := b.eval(`document.querySelector('#fleet-view') ? document.querySelector('#fleet-view').textContent : ''`); got != "" {
			t.Errorf("a node not in a fleet shows a fleet view: %q", got)
		}
		b.consoleErrors()
	})
}

// A node's use of a key is counted over the last minute: from the newest
// sample at or before its start, so a minute of samples shows
// the minute's slots, not the node's since it started; a key whose Slots
// were made again (a new ceiling) is counted from zero; a key no longer
// shared is forgotten.
func TestFleetSamplesCountTheLastMinute(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	c := fleetSamples{}
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * fleetViewEvery) }
	// 10 slots granted, 8 used and 1 wasted between samples, from zero.
	stats := func(i int) fleet.Stats {
		return fleet.Stats{Blocks: int64(i), Reserved: int64(10 * i), Used: int64(8 * i), Wasted: int64(i), Held: 1, Trip: 3 * time.Millisecond}
	}
	for i := range 100 { // 200 s
		c.record(at(i), map[string]fleet.Stats{"up": stats(i)})
		u := c.use("up", at(i), stats(i))
		span := min(time.Duration(i)*fleetViewEvery, fleetViewSpan)
		if u.Span.D() != span || u.Reserved != int64(span/fleetViewEvery)*10 || u.Used != int64(span/fleetViewEvery)*8 ||
			u.Wasted != int64(span/fleetViewEvery) || u.Blocks != int64(span/fleetViewEvery) || u.Held != 1 || u.Etcd.D() != 3*time.Millisecond {
			t.Fatalf("after %v: %+v, want %v of use", at(i).Sub(t0), u, span)
		}
	}
	if n := len(c["up"]); n > int(fleetViewSpan/fleetViewEvery)+1 {
		t.Errorf("%d samples kept for a span of %v every %v", n, fleetViewSpan, fleetViewEvery)
	}

	// Made again at a new ceiling: its counters start over.
	c.record(at(100), map[string]fleet.Stats{"up": {Reserved: 4, Used: 2}})
	if u := c.use("up", at(101), fleet.Stats{Reserved: 14, Used: 9}); u.Span.D() != fleetViewEvery || u.Reserved != 14 || u.Used != 9 {
		t.Errorf("after its Slots were made again: %+v", u)
	}
	c.record(at(101), map[string]fleet.Stats{"other": {}})
	if _, ok := c["up"]; ok || len(c) != 1 {
		t.Errorf("a key no longer shared is kept: %v", c)
	}
}
