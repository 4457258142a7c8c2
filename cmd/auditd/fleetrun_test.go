package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/xuri/excelize/v2"

	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/internal/nginxtest"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/pack"
	"github.com/auditd/auditd/reports"
)

// fleetRunNode is one auditd node of a fleet test, restartable in place.
type fleetRunNode struct {
	name, data string
	url        atomic.Pointer[string]
	child      *child
}

func (n *fleetRunNode) start(t *testing.T, config, token, etcd string) {
	t.Helper()
	n.child = startServe(t, n.data, config, token, "--fleet-etcd", etcd, "--node", n.name)
	n.url.Store(&n.child.url)
}

// proxyWorkers sends requests of run through the node's proxy route, each
// worker until stop is closed, and counts the answers by status (-1: the
// connection broke, as it does to a node killed).
func proxyWorkers(nodes []*fleetRunNode, perNode int, run, token string, stop <-chan struct{}) (wait func() map[int]int) {
	counts := map[int]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 30 * time.Second}
	for n, node := range nodes {
		for w := range perNode {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					req, _ := http.NewRequest("GET", fmt.Sprintf("%s/proxy/up/n%d/w%d/r%d.json", *node.url.Load(), n+1, w, i), nil)
					req.Header.Set("Proxy-Authorization", "Bearer "+token)
					req.Header.Set("Auditd-Run", run)
					code := -1
					if resp, err := client.Do(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						code = resp.StatusCode
					}
					mu.Lock()
					counts[code]++
					mu.Unlock()
					if code != http.StatusOK {
						time.Sleep(50 * time.Millisecond)
					}
				}
			})
		}
	}
	return func() map[int]int {
		wg.Wait()
		return counts
	}
}

// startFleetRun starts three auditd nodes of one fleet over a real etcd,
// config declaring their sources, and creates a fleet run on node 1.
// Node 3 reaches etcd through cut, a proxy the test can cut.
func startFleetRun(t *testing.T, config, token string) (nodes []*fleetRunNode, id, etcd string, cut *etcdtest.Proxy) {
	t.Helper()
	etcd = etcdtest.Start(t, 1).Endpoints()[0]
	cut = etcdtest.StartProxy(t, etcd)
	dir := t.TempDir()
	for i := range 3 {
		n := &fleetRunNode{name: fmt.Sprintf("node%d", i+1), data: filepath.Join(dir, fmt.Sprintf("node%d", i+1))}
		ep := etcd
		if i == 2 {
			ep = cut.URL()
		}
		n.start(t, config, token, ep)
		nodes = append(nodes, n)
	}
	var run struct {
		ID string `json:"id"`
	}
	if code := nodes[0].child.call(t, "POST", "/v1/fleet/runs", token, map[string]any{"name": "fleet pipeline", "idle_timeout": "10m"}, &run); code != http.StatusCreated {
		t.Fatalf("create fleet run: %d\n%s", code, nodes[0].child.logs)
	}
	return nodes, run.ID, etcd, cut
}

// kill SIGKILLs the node (no shutdown, no last post to the fleet log) and
// starts it again on its data directory.
func (n *fleetRunNode) kill(t *testing.T, config, token, etcd string) {
	t.Helper()
	n.child.cmd.Process.Kill()
	n.child.cmd.Wait()
	n.start(t, config, token, etcd)
}

// settleFleetRun finishes the fleet run from node 3, waits for every part
// to end, and reconciles it from node 3 over the API and from node 1 with
// auditd reconcile --fleet: balanced, with every request the upstream
// counted a dispatch on record (those a SIGKILL cut off on record as
// interrupted, answered or not).
func settleFleetRun(t *testing.T, nodes []*fleetRunNode, id, token string, upstream int) *reports.FleetReport {
	t.Helper()
	var run struct {
		Parts []string `json:"parts"`
	}
	if st, b := nodes[0].child.get(t, "/v1/fleet/runs/"+id+"/evidence-pack.zip", token); st != http.StatusConflict ||
		!strings.Contains(string(b), "its part can be packed once it has ended. Finish the fleet run") || strings.Contains(string(b), "auditd error") || strings.Contains(string(b), `\"type\"`) {
		t.Errorf("the fleet pack of a fleet run still running: %d %s", st, b)
	}
	early := filepath.Join(t.TempDir(), "early.zip")
	var out bytes.Buffer
	if code := runOut(context.Background(), []string{"pack", "--fleet", "--server", nodes[0].child.url, "--run", id, "--token", token, "--out", early}, &out); code != 2 {
		t.Errorf("auditd pack --fleet of a run still running: exit %d, want 2\n%s", code, out.String())
	}
	if _, err := os.Stat(early); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("auditd pack --fleet of a run still running left %s behind (%v)", early, err)
	}
	// A token only node 3 accepts finishes no part: the others refuse it,
	// and node 3 asks them before it finishes its own.
	var own struct {
		Secret string `json:"secret"`
	}
	if code := nodes[2].child.call(t, "POST", "/v1/tokens", token, map[string]string{"name": "node3 only", "role": "operator"}, &own); code != http.StatusCreated {
		t.Fatalf("a token on node 3: %d", code)
	}
	var refused api.Problem
	if code := nodes[2].child.call(t, "POST", "/v1/fleet/runs/"+id+"/finish", own.Secret, nil, &refused); code != http.StatusForbidden || !strings.Contains(refused.Detail, "same tokens") || !strings.Contains(refused.Detail, "no part finished") {
		t.Errorf("finish with a token only node 3 accepts: %d %+v; want 403 saying the nodes must share tokens and no part finished", code, refused)
	}
	// Nor does it reconcile the fleet run: a token the other nodes refuse
	// is the caller's problem, not a part missing.
	if code := nodes[2].child.call(t, "GET", "/v1/fleet/runs/"+id+"/reconciliation", own.Secret, nil, &refused); code != http.StatusForbidden || !strings.Contains(refused.Detail, "same tokens") {
		t.Errorf("the fleet reconciliation with a token only node 3 accepts: %d %+v; want 403", code, refused)
	}
	var out3 bytes.Buffer
	if code := runOut(context.Background(), []string{"reconcile", "--server", nodes[2].child.url, "--run", id, "--token", own.Secret}, &out3); code != 2 || !strings.Contains(out3.String(), "403") {
		t.Errorf("auditd reconcile with a token only node 3 accepts: exit %d, want 2 naming the 403\n%s", code, out3.String())
	}
	var part struct {
		Status string `json:"status"`
	}
	if nodes[2].child.call(t, "GET", "/v1/runs/"+id, token, nil, &part); part.Status != "running" {
		t.Errorf("after a finish the other nodes refused, node 3's part is %q, want running", part.Status)
	}
	if code := nodes[2].child.call(t, "POST", "/v1/fleet/runs/"+id+"/finish", token, nil, &run); code != http.StatusOK {
		t.Fatalf("finish the fleet run: %d\n%s", code, nodes[2].child.logs)
	}
	for _, n := range nodes {
		n.child.awaitRun(t, id, token, 30*time.Second, nil)
	}
	if len(run.Parts) != 3 {
		t.Fatalf("the fleet run's parts: %v, want the three nodes", run.Parts)
	}
	// Any node lists the fleet run, finished, and shows its own part as one.
	var list struct {
		Runs []api.FleetRun `json:"runs"`
	}
	if code := nodes[1].child.call(t, "GET", "/v1/fleet/runs", token, nil, &list); code != http.StatusOK || len(list.Runs) != 1 || list.Runs[0].ID != id || len(list.Runs[0].Parts) != 3 || list.Runs[0].FinishedAt.IsZero() {
		t.Errorf("GET /v1/fleet/runs on node 2: %d %+v", code, list)
	}
	// A finished fleet run takes no more requests on any node: one with
	// no part of it does not join it.
	var later api.FleetRun
	if code := nodes[0].child.call(t, "POST", "/v1/fleet/runs", token, map[string]any{"name": "finished at once"}, &later); code != http.StatusCreated {
		t.Fatalf("a second fleet run: %d", code)
	}
	if code := nodes[0].child.call(t, "POST", "/v1/fleet/runs/"+later.ID+"/finish", token, nil, &later); code != http.StatusOK || later.FinishedAt.IsZero() {
		t.Errorf("finish the second fleet run: %d %+v", code, later)
	}
	req, _ := http.NewRequest("GET", nodes[1].child.url+"/proxy/up/late.json", nil)
	req.Header.Set("Proxy-Authorization", "Bearer "+token)
	req.Header.Set("Auditd-Run", later.ID)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Error(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusConflict || !strings.Contains(string(b), "was finished") {
			t.Errorf("a request of a finished fleet run through a node with no part: %d %s", resp.StatusCode, b)
		}
	}
	if code := nodes[1].child.call(t, "GET", "/v1/fleet/runs/"+later.ID, token, nil, &later); code != http.StatusOK || strings.Join(later.Parts, ",") != "node1" {
		t.Errorf("the finished fleet run's parts after a request through node 2: %d %v, want node1 alone", code, later.Parts)
	}
	for _, n := range nodes {
		var local struct {
			Fleet *api.FleetPartOf `json:"fleet"`
		}
		if n.child.call(t, "GET", "/v1/runs/"+id, token, nil, &local); local.Fleet == nil || local.Fleet.Node != n.name || len(local.Fleet.Parts) != 3 || local.Fleet.Href != "/v1/fleet/runs/"+id {
			t.Errorf("GET /v1/runs/%s on %s: fleet %+v, want its part of the fleet run named", id, n.name, local.Fleet)
		}
	}
	var rep reports.FleetReport
	if code := nodes[2].child.call(t, "GET", "/v1/fleet/runs/"+id+"/reconciliation", token, nil, &rep); code != http.StatusOK {
		t.Fatalf("fleet reconciliation: %d", code)
	}
	c := rep.Counts
	t.Logf("the upstream counted %d; the fleet's ledgers: %d dispatches (%d 2xx, %d 429, %d interrupted), status %s",
		upstream, c.Dispatches, c.Status2xx, c.Status429, c.Interrupted, rep.Status)
	for _, p := range rep.Parts {
		if p.Report != nil {
			t.Logf("part of %s: %s, %d dispatches, logged at %d (fleet leaf %d)", p.Node, p.Report.Run.Status, p.Report.Counts.Dispatches, p.Logged, p.FleetLeaf)
		}
	}
	if !rep.Balanced || len(rep.Parts) != 3 {
		t.Errorf("the fleet reconciliation does not balance: %v\n%+v", rep.Failed(), rep.Checks)
	}
	for _, n := range nodes {
		var st struct {
			Posted   uint64 `json:"posted_size"`
			Cosigned uint64 `json:"cosigned_size"`
			Failures int64  `json:"failures"`
		}
		if code := n.child.call(t, "GET", "/v1/fleet/log", token, nil, &st); code != http.StatusOK || st.Posted == 0 || st.Cosigned == 0 {
			t.Errorf("%s's posting to the fleet log: %d %+v", n.name, code, st)
		}
	}
	var table bytes.Buffer
	code := runOut(context.Background(), []string{"reconcile", "--fleet", "--server", nodes[0].child.url, "--run", id, "--token", token, "--allow-partial"}, &table)
	if code != 0 || !strings.Contains(table.String(), "node2") {
		t.Errorf("auditd reconcile --fleet: exit %d\n%s", code, table.String())
	}
	t.Logf("auditd reconcile --fleet:\n%s", table.String())
	// Without --fleet, any node answers for the fleet run, not its part.
	table.Reset()
	code = runOut(context.Background(), []string{"reconcile", "--server", nodes[1].child.url, "--run", id, "--token", token, "--allow-partial", "--format", "json"}, &table)
	var plain reports.FleetReport
	if err := json.Unmarshal(table.Bytes(), &plain); code != 0 || err != nil || len(plain.Parts) != 3 || plain.Counts.Dispatches != c.Dispatches {
		t.Errorf("auditd reconcile --server (no --fleet) of a fleet run: exit %d, %v, %d parts, %d dispatches (want 3, %d)\n%s",
			code, err, len(plain.Parts), plain.Counts.Dispatches, c.Dispatches, table.String())
	}
	// R9 over the fleet reads each part's dispatches: all of the node's
	// but those closed as not sent, which are among its interrupted. The
	// upstream counted at most those, and at least the ones answered.
	var sent int64
	for i, n := range nodes {
		var part reports.FleetPart
		code := n.child.call(t, "GET", "/v1/fleet/runs/"+id+"/part", token, nil, &part)
		if code != http.StatusOK || part.Dispatches == nil || len(part.Dispatches.Sources) != 1 {
			t.Errorf("node %d's part: %d, its dispatches for R9 over the fleet %+v", i+1, code, part.Dispatches)
			continue
		}
		pc := part.Report.Counts
		if got := int64(len(part.Dispatches.Sources[0].At)); got > pc.Dispatches || got < pc.Dispatches-pc.Interrupted {
			t.Errorf("node %d's part: %d dispatches for R9 over the fleet, of %d on record, %d of them interrupted", i+1, got, pc.Dispatches, pc.Interrupted)
		}
		sent += int64(len(part.Dispatches.Sources[0].At))
	}
	t.Logf("the upstream counted %d; sent by the ledgers (not closed as not sent) %d", upstream, sent)
	if answered := c.Dispatches - c.Interrupted; int64(upstream) < answered || int64(upstream) > sent {
		t.Errorf("the upstream counted %d requests; the ledgers hold %d dispatches, %d of them interrupted, %d not closed as not sent",
			upstream, c.Dispatches, c.Interrupted, sent)
	}
	checkFleetEvidence(t, nodes, id, token, &rep)
	return &rep
}

// checkFleetEvidence reads the fleet run's workbook and timeline from
// node 2: every node's rows, each naming its node, as many Dispatches rows
// per node as its part has dispatches, and the timeline's dispatches per
// node the same.
func checkFleetEvidence(t *testing.T, nodes []*fleetRunNode, id, token string, rep *reports.FleetReport) {
	t.Helper()
	st, b := nodes[1].child.get(t, "/v1/fleet/runs/"+id+"/evidence.xlsx", token)
	if st != http.StatusOK {
		t.Fatalf("the fleet run's workbook: %d %s", st, b)
	}
	f, err := excelize.OpenReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	want, got, timeline := map[string]int64{}, map[string]int64{}, map[string]int64{}
	for _, p := range rep.Parts {
		want[p.Node] = p.Report.Counts.Dispatches
	}
	for _, name := range f.GetSheetList()[1:] {
		rows, err := f.GetRows(name)
		if err != nil || len(rows) == 0 || rows[0][0] != reports.FleetNodeColumn {
			t.Fatalf("sheet %s of the fleet workbook: %v, header %q", name, err, rows[:min(1, len(rows))])
		}
		for _, r := range rows[1:] {
			if _, ok := want[r[0]]; !ok && (name != reports.SheetReconciliation || r[0] != reports.FleetRowsNode) {
				t.Errorf("sheet %s: a row of node %q: %q", name, r[0], r)
			} else if name == reports.SheetDispatches {
				got[r[0]]++
			}
		}
	}
	var tl reports.FleetTimeline
	if code := nodes[1].child.call(t, "GET", "/v1/fleet/runs/"+id+"/timeline?bucket=1s", token, nil, &tl); code != http.StatusOK {
		t.Fatalf("the fleet run's timeline: %d", code)
	}
	for _, s := range tl.Sources {
		for _, bk := range s.Timeline.Buckets {
			timeline[s.Node] += int64(bk.Dispatches)
		}
	}
	t.Logf("dispatches per node: reconciliation %v, workbook %v, timeline %v", want, got, timeline)
	if !maps.Equal(got, want) || !maps.Equal(timeline, want) {
		t.Errorf("the fleet workbook's Dispatches rows per node %v, the timeline's %v; the parts have %v", got, timeline, want)
	}
}

// fleetPackOf downloads the fleet run's pack from node 1 with auditd
// pack --fleet and checks that it verifies; it returns the pack and the nodes' published keys.
func fleetPackOf(t *testing.T, nodes []*fleetRunNode, id, token string) (*pack.FleetPack, map[string]string) {
	t.Helper()
	keys := map[string]string{}
	for _, n := range nodes {
		k, err := ledger.ReadPublicKey(n.data)
		if err != nil {
			t.Fatal(err)
		}
		keys[n.name] = k
	}
	path := filepath.Join(t.TempDir(), "fleet-run.zip")
	var out bytes.Buffer
	if code := runOut(context.Background(), []string{"pack", "--fleet", "--server", nodes[0].child.url, "--run", id, "--token", token, "--out", path}, &out); code != 0 {
		t.Fatalf("auditd pack --fleet: exit %d\n%s", code, out.String())
	}
	if want := fmt.Sprintf("%d nodes", len(nodes)); !strings.Contains(out.String(), want) {
		t.Errorf("auditd pack --fleet says %q, want it to name %s", out.String(), want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	checkFleetPack(t, b, keys, "")
	fp, err := pack.OpenFleet(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		t.Fatal(err)
	}
	blocks := 0
	for _, n := range fp.Manifest.Nodes {
		blocks += len(n.Blocks)
	}
	if fp.Workbook == nil {
		t.Error("the fleet pack carries no fleet workbook")
	}
	if blocks == 0 || len(fp.Manifest.Limits) != 1 || fp.Manifest.SlotSlack == 0 {
		t.Errorf("the pack's over-limit proof: %d blocks, limits %+v, slack %d", blocks, fp.Manifest.Limits, fp.Manifest.SlotSlack)
	}
	return fp, keys
}

// One proxy run across three auditd nodes sharing a budget through etcd:
// it is created on one node, Go clients send its requests through all
// three, one node is SIGKILLed and restarted midway. The fleet
// reconciliation balances against the upstream's own count; the fleet
// pack, its reservations taken from the nodes' ledgers, verifies offline
// with auditd verify --pack and with the outsider's verifier; a pack with
// a node's part dropped, or with reservations that overlap, fails both.
func TestFleetRunAcrossNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and three auditd nodes")
	}
	t.Parallel() // bound by the clock, not the CPU: it runs beside the long fleet tests
	const limit, token = 25, "fleetrun-admin-token-0123456789abcdef"
	// A slow upstream: some requests are always on the wire, so the
	// SIGKILL cuts some off after their dispatch was recorded.
	var arrived atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Add(1)
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, `{"ok":true}`)
	}))
	t.Cleanup(up.Close)
	config := writeConfig(t, t.TempDir(), fmt.Sprintf("sources:\n  - id: up\n    base_url: %s\n    limit: %d\n    window: 1s\n    concurrency: 16\n", up.URL, limit))
	nodes, id, etcd, cut := startFleetRun(t, config, token)

	stop := make(chan struct{})
	wait := proxyWorkers(nodes, 4, id, token, stop)
	time.Sleep(3 * time.Second)
	nodes[1].kill(t, config, token, etcd)
	// Node 3 cut off from etcd: its posts to the fleet log fail, and say so.
	cut.Cut()
	time.Sleep(3 * time.Second)
	var st struct {
		Failures  int64  `json:"failures"`
		LastError string `json:"last_error"`
	}
	nodes[2].child.call(t, "GET", "/v1/fleet/log", token, nil, &st)
	cut.Heal()
	time.Sleep(time.Second)
	close(stop)
	t.Logf("the clients' statuses: %v; node 3's posting while cut off: %+v", wait(), st)
	if st.Failures == 0 || st.LastError == "" {
		t.Errorf("node 3, cut off from etcd, shows no failure to post: %+v", st)
	}
	rep := settleFleetRun(t, nodes, id, token, int(arrived.Load()))
	if rep.Counts.Interrupted == 0 {
		t.Log("the SIGKILL cut off no request on the wire this time")
	}

	// Node 3 cut off from etcd cannot say whether the run is a fleet run:
	// the plain reconcile exits 2 rather than answer with node 3's part.
	cut.Cut()
	var out bytes.Buffer
	code := runOut(context.Background(), []string{"reconcile", "--server", nodes[2].child.url, "--run", id, "--token", token, "--allow-partial"}, &out)
	cut.Heal()
	if code != 2 || !strings.Contains(out.String(), "503") {
		t.Errorf("auditd reconcile --server of a node cut off from etcd: exit %d, want 2 naming the 503\n%s", code, out.String())
	}

	fp, keys := fleetPackOf(t, nodes, id, token)
	rewrite := func(edit func(m *pack.FleetManifest)) []byte {
		m := fp.Manifest
		m.Nodes = append([]pack.FleetNode(nil), m.Nodes...)
		edit(&m)
		packs := map[string]io.Reader{}
		for _, n := range m.Nodes {
			packs[n.Name] = fp.NodePack(n.Name)
		}
		var out bytes.Buffer
		if err := pack.WriteFleet(&out, pack.FleetParts{Manifest: m, Checkpoint: fp.Checkpoint, Packs: packs}); err != nil {
			t.Fatal(err)
		}
		return out.Bytes()
	}
	t.Run("DroppedNode", func(t *testing.T) {
		checkFleetPack(t, rewrite(func(m *pack.FleetManifest) { m.Nodes = append(m.Nodes[:1], m.Nodes[2:]...) }), keys, "node node2: the pack has no part of it")
	})
	t.Run("OverlappingReservations", func(t *testing.T) {
		checkFleetPack(t, rewrite(func(m *pack.FleetManifest) {
			for i := range m.Nodes {
				if len(m.Nodes[i].Blocks) > 0 {
					bs := append([]pack.FleetBlock(nil), m.Nodes[i].Blocks...)
					bs[0].Count *= 1000 // reaches into the blocks after it
					m.Nodes[i].Blocks = bs
					return
				}
			}
		}), keys, "overlaps")
	})
}

// Sixteen Python client processes (requests and httpx) send one fleet
// run's requests through three nodes to an nginx gateway whose quota is
// the source's limit; one node is SIGKILLed midway, its clients cut off,
// and restarted, with five more clients. nginx refuses none, the fleet
// reconciliation balances against nginx's own log, and the fleet pack
// verifies.
func TestFleetRunPythonWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd, nginx, three auditd nodes and 21 Python processes")
	}
	const quota, token = 20, "fleetrun-python-token-0123456789abcdef"
	python(t)
	gw := nginxtest.Start(t, nginxtest.Config{Template: "gateway.conf.tmpl", Rate: quota, Burst: 10})
	config := writeConfig(t, t.TempDir(), fmt.Sprintf("sources:\n  - id: gw\n    base_url: %s/a\n    limit: %d\n    window: 1s\n    concurrency: 16\n", gw.URL, quota))
	nodes, id, etcd, _ := startFleetRun(t, config, token)

	first := []*clients{startClients(t, 6, 25, nodes[0].child.url, token, id, "gw", ""),
		startClients(t, 5, 25, nodes[1].child.url, token, id, "gw", ""),
		startClients(t, 5, 25, nodes[2].child.url, token, id, "gw", "")}
	time.Sleep(4 * time.Second)
	nodes[1].kill(t, config, token, etcd)
	again := startClients(t, 5, 10, nodes[1].child.url, token, id, "gw", "")
	ok, broken := 0, 0
	for _, c := range append(first, again) {
		for _, r := range c.wait(t) {
			ok += r.Statuses["200"]
			broken += r.Errors
		}
	}
	gw.Stop(t) // every line logged
	lines := gatewayLog(t, gw)
	refused := 0
	for _, l := range lines {
		if l.status != http.StatusOK {
			refused++
		}
	}
	t.Logf("the clients got %d 200s and %d broken connections; nginx logged %d requests, refused %d", ok, broken, len(lines), refused)
	if refused > 0 {
		t.Errorf("the gateway refused %d requests: the fleet went over its quota", refused)
	}
	settleFleetRun(t, nodes, id, token, len(lines))
	fleetPackOf(t, nodes, id, token)
}

// runOut is run with one output for stdout and stderr.
func runOut(ctx context.Context, args []string, out io.Writer) int { return run(ctx, args, out, out) }

// checkFleetPack verifies a fleet pack with auditd verify --pack and with
// the outsider's verifier: both accept it when fault is empty, else both
// refuse it and verify names fault.
func checkFleetPack(t *testing.T, b []byte, keys map[string]string, fault string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "fleet-pack.zip")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--pack", path}
	for name, k := range keys {
		args = append(args, "--node-key", name+"="+k)
	}
	var out bytes.Buffer
	code := runVerify(context.Background(), args, &out, &out)
	outside := outsideVerifyFleet(b, keys)
	switch {
	case fault == "" && (code != 0 || outside != nil):
		t.Errorf("auditd verify --pack: exit %d\n%s\nthe outsider: %v", code, out.String(), outside)
	case fault != "" && (code != 1 || !strings.Contains(out.String(), fault)):
		t.Errorf("auditd verify --pack: exit %d, want 1 naming %q\n%s", code, fault, out.String())
	case fault != "" && outside == nil:
		t.Error("the outsider's verifier accepts it")
	default:
		t.Logf("auditd verify --pack: exit %d: %s; the outsider: %v", code, strings.TrimSpace(out.String()), outside)
	}
}
