package api_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/reports"
	"github.com/xuri/excelize/v2"
)

// fakeFleet is a fleet of two nodes, "a" (this one, whose part is the
// env's run reconciled from the real ledger) and "b", which never answers.
type fakeFleet struct {
	e *env

	mu    sync.Mutex
	calls []string // what was asked, with the authorization passed on

	packErr error // WritePack's answer before it writes, when set
}

func withFleet(f *fakeFleet) envOption {
	return func(e *env) {
		f.e = e
		e.srv.Fleet = f
	}
}

func (f *fakeFleet) record(call string) {
	f.mu.Lock()
	f.calls = append(f.calls, call)
	f.mu.Unlock()
}

// olderFleetRun is a fleet run of node b alone: this node holds no part.
var olderFleetRun = api.FleetRun{ID: "01J00000000000000000000000", Name: "older", Node: "b", CreatedAt: start.Add(-time.Hour), Parts: []string{"b"}}

func (f *fakeFleet) run(id string) (api.FleetRun, error) {
	if id == olderFleetRun.ID {
		return olderFleetRun, nil
	}
	if id != f.e.runID {
		return api.FleetRun{}, auditd.Errorf(auditd.ENOTFOUND, "No fleet run %s.", id)
	}
	return api.FleetRun{ID: id, Name: "fleet", Node: "a", CreatedAt: start, Parts: []string{"a", "b"}}, nil
}

func (f *fakeFleet) CreateRun(_ context.Context, principal, name string, idle time.Duration) (api.FleetRun, error) {
	f.record("create " + principal + " " + name + " " + idle.String())
	r, err := f.run(f.e.runID)
	r.Name, r.IdleTimeout = name, auditd.Duration(idle)
	return r, err
}

// cutOffRun is a run id etcd cannot be asked about: Run waits for its
// context to end, and records an ask without a deadline of a second.
const cutOffRun = "01J0000000000000000000000Z"

func (f *fakeFleet) Run(ctx context.Context, id string) (api.FleetRun, error) {
	if id == cutOffRun {
		if dl, ok := ctx.Deadline(); !ok || time.Until(dl) > time.Second {
			f.record("unbounded run " + id)
			return api.FleetRun{}, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet cannot be asked for run %s.", id)
		}
		<-ctx.Done()
		return api.FleetRun{}, auditd.Errorf(auditd.EUNAVAILABLE, "The fleet cannot be asked for run %s: %v", id, ctx.Err())
	}
	return f.run(id)
}

func (f *fakeFleet) Runs(_ context.Context, before string, limit int) ([]api.FleetRun, error) {
	f.record("list " + before)
	run, _ := f.run(f.e.runID)
	var runs []api.FleetRun
	for _, r := range []api.FleetRun{run, olderFleetRun} {
		if before == "" || r.ID < before {
			runs = append(runs, r)
		}
	}
	return runs[:min(limit, len(runs))], nil
}

func (f *fakeFleet) PartsOf(ctx context.Context, ids []string) map[string]api.FleetPartOf {
	out := map[string]api.FleetPartOf{}
	for _, id := range ids {
		if p, ok := f.PartOf(ctx, id); ok {
			p.Parts = nil
			out[id] = p
		}
	}
	return out
}

func (f *fakeFleet) PartOf(_ context.Context, id string) (api.FleetPartOf, bool) {
	if id != f.e.runID {
		return api.FleetPartOf{}, false
	}
	return api.FleetPartOf{Node: "a", Parts: []string{"a", "b"}, Href: "/v1/fleet/runs/" + id}, true
}

func (f *fakeFleet) FinishRun(_ context.Context, id, principal, authorization string) (api.FleetRun, error) {
	f.record("finish " + principal + " " + authorization)
	return f.run(id)
}

func (f *fakeFleet) Part(ctx context.Context, id string) (reports.FleetPart, error) {
	if _, err := f.run(id); err != nil {
		return reports.FleetPart{}, err
	}
	rep, err := reports.NewReconciler(f.e.ledger).Reconcile(ctx, id, nil)
	if err != nil {
		return reports.FleetPart{}, err
	}
	head, _ := f.e.ledger.Head()
	ds := &reports.PartDispatches{Limits: []reports.FleetLimit{{Source: "county", Limit: 10, Window: int64(time.Second)}},
		Sources: []reports.SourceDispatches{{Source: "county", At: []int64{start.UnixNano()}, Seq: []uint64{2}}}}
	return reports.FleetPart{Node: "a", Report: rep, Logged: head, FleetLeaf: 3, Dispatches: ds}, nil
}

func (f *fakeFleet) Reconciliation(ctx context.Context, id, authorization string) (*reports.FleetReport, error) {
	f.record("reconcile " + authorization)
	a, err := f.Part(ctx, id)
	if err != nil {
		return nil, err
	}
	return reports.CombineFleet(id, []reports.FleetPart{a, {Node: "b", Error: "node b: connection refused"}}), nil
}

func (f *fakeFleet) WritePack(_ context.Context, w io.Writer, id, authorization string) error {
	f.record("pack " + authorization)
	if f.packErr != nil {
		return f.packErr
	}
	_, err := io.WriteString(w, "PK\x03\x04 fake fleet pack")
	return err
}

func (f *fakeFleet) WritePart(_ context.Context, w io.Writer, id string) error {
	if _, err := f.run(id); err != nil {
		return err
	}
	_, err := io.WriteString(w, "PK\x03\x04 fake part")
	return err
}

// WriteEvidence merges node a's workbook of the env's run, exported from
// the real ledger, as both nodes' parts.
func (f *fakeFleet) WriteEvidence(ctx context.Context, w io.Writer, id, authorization string) error {
	f.record("evidence " + authorization)
	var book bytes.Buffer
	x := reports.NewExporter(reports.NewReconciler(f.e.ledger))
	x.Ledger = f.e.ledger
	if _, err := x.Export(ctx, &book, reports.Request{RunIDs: []string{id}, Filters: "run " + id}); err != nil {
		return err
	}
	b := book.Bytes()
	parts := []reports.FleetWorkbook{{Node: "a", Book: bytes.NewReader(b), Size: int64(len(b))}, {Node: "b", Book: bytes.NewReader(b), Size: int64(len(b))}}
	return reports.WriteFleetEvidence(w, reports.FleetEvidence{RunID: id, Parts: parts})
}

// Timeline is node a's real timeline of the env's run, as both nodes'.
func (f *fakeFleet) Timeline(ctx context.Context, id string, q auditd.TimelineQuery, authorization string) (*reports.FleetTimeline, error) {
	f.record("timeline " + authorization)
	tl, err := f.e.srv.Timelines.RunTimeline(ctx, id, q)
	if err != nil {
		return nil, err
	}
	return reports.CombineFleetTimelines(id, map[string]*auditd.Timeline{"a": tl, "b": tl})
}

func (f *fakeFleet) Cosign(_ context.Context, size uint64) (api.FleetTree, error) {
	if size > 7 {
		return api.FleetTree{}, &auditd.Error{Code: auditd.EINVALID, Field: "size", Message: "The fleet log holds 7 leaves."}
	}
	return api.FleetTree{Origin: "auditd-fleet", Size: size, Root: "cm9vdA=="}, nil
}

func (f *fakeFleet) LogStatus(context.Context) api.FleetLogStatus {
	return api.FleetLogStatus{Node: "a", Posted: 12, Leaf: 3, Cosigned: 7, Posts: 4, Failures: 1, LastError: "post: etcd: context deadline exceeded", LastErrorAt: start}
}

// The fleet routes answer as the contract says (every response is held to
// openapi.yaml by the env), pass the caller's token on to the fleet, and
// answer 404 not_in_fleet on a node not in a fleet.
func TestFleetRoutes(t *testing.T) {
	f := &fakeFleet{}
	e := newEnv(t, withFleet(f))
	op, aud := e.secret[auth.RoleOperator], e.secret[auth.RoleAuditor]
	id := e.runID

	r := e.do(request{method: "POST", path: "/v1/fleet/runs", secret: op, body: `{"name":"pipeline","idle_timeout":"10m"}`})
	if r.status != http.StatusCreated || r.header.Get("Location") != "/v1/fleet/runs/"+id {
		t.Fatalf("create: %d %s %s", r.status, r.header.Get("Location"), r.body)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/runs", secret: op, body: `{"idle_timeout":"10m"}`}); r.status != http.StatusBadRequest || r.problem(t).Field != "name" {
		t.Errorf("create without a name: %d %s", r.status, r.body)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/runs", secret: aud, body: `{"name":"x"}`}); r.status != http.StatusForbidden {
		t.Errorf("an auditor creates a fleet run: %d", r.status)
	}
	var run api.FleetRun
	e.do(request{path: "/v1/fleet/runs/" + id, secret: aud}).decode(t, &run)
	if strings.Join(run.Parts, ",") != "a,b" {
		t.Errorf("the run's parts: %v", run.Parts)
	}
	if r := e.do(request{path: "/v1/fleet/runs/not-a-ulid", secret: aud}); r.status != http.StatusNotFound {
		t.Errorf("a malformed id: %d", r.status)
	}
	// The fleet's runs, a page at a time, newest first.
	var page struct {
		Runs []api.FleetRun `json:"runs"`
		Next string         `json:"next_cursor"`
	}
	e.do(request{path: "/v1/fleet/runs?limit=1", secret: aud}).decode(t, &page)
	if len(page.Runs) != 1 || page.Runs[0].ID != id || page.Next == "" {
		t.Fatalf("the first page of fleet runs: %+v", page)
	}
	next := page.Next
	page.Runs, page.Next = nil, ""
	e.do(request{path: "/v1/fleet/runs?limit=1&cursor=" + next, secret: aud}).decode(t, &page)
	if len(page.Runs) != 1 || page.Runs[0].Name != "older" || page.Next != "" {
		t.Errorf("the second page of fleet runs: %+v", page)
	}
	for _, cursor := range []string{"bm90LWEtdWxpZA", base64.RawURLEncoding.EncodeToString([]byte(id))} { // not a run id; GET /v1/runs's cursor
		if r := e.do(request{path: "/v1/fleet/runs?cursor=" + cursor, secret: aud}); r.status != http.StatusBadRequest || r.problem(t).Field != "cursor" {
			t.Errorf("the cursor %s: %d %s", cursor, r.status, r.body)
		}
	}
	// A fleet run this node holds no part of is said to be one.
	if r := e.do(request{path: "/v1/runs/" + olderFleetRun.ID, secret: aud}); r.status != http.StatusNotFound || !strings.Contains(r.problem(t).Detail, "a fleet run this node holds no part of (parts: b)") {
		t.Errorf("GET /v1/runs/{id} of a fleet run with no part here: %d %s", r.status, r.body)
	}
	// A fleet run's id in lower case is the same run.
	var older api.FleetRun
	e.do(request{path: "/v1/fleet/runs/" + strings.ToLower(olderFleetRun.ID), secret: aud}).decode(t, &older)
	if older.ID != olderFleetRun.ID {
		t.Errorf("GET /v1/fleet/runs/{id} in lower case found %+v", older)
	}
	// When etcd cannot be asked, the 404 comes within a second, without
	// the hint.
	if r := e.do(request{path: "/v1/runs/" + cutOffRun, secret: aud}); r.status != http.StatusNotFound || strings.Contains(r.problem(t).Detail, "fleet") {
		t.Errorf("GET /v1/runs/{id} of a run etcd cannot be asked about: %d %s", r.status, r.body)
	}
	f.mu.Lock()
	if slices.Contains(f.calls, "unbounded run "+cutOffRun) {
		t.Errorf("a 404's hint asked etcd without a deadline of a second")
	}
	f.mu.Unlock()
	// The node's run that is its part of the fleet run says so, in the
	// list of runs too.
	var runs struct {
		Runs []struct {
			ID    string           `json:"id"`
			Fleet *api.FleetPartOf `json:"fleet"`
		} `json:"runs"`
	}
	e.do(request{path: "/v1/runs", secret: aud}).decode(t, &runs)
	marked := 0
	for _, r := range runs.Runs {
		if (r.Fleet != nil) != (r.ID == id) || (r.Fleet != nil && r.Fleet.Href != "/v1/fleet/runs/"+id) {
			t.Errorf("GET /v1/runs: run %s with fleet %+v", r.ID, r.Fleet)
		}
		if r.Fleet != nil {
			marked++
		}
	}
	if marked != 1 {
		t.Errorf("GET /v1/runs: %d runs, %d marked as a fleet run's part; want the env's run marked", len(runs.Runs), marked)
	}
	var local struct {
		ID    string           `json:"id"`
		Fleet *api.FleetPartOf `json:"fleet"`
	}
	e.do(request{path: "/v1/runs/" + id, secret: aud}).decode(t, &local)
	if local.ID != id || local.Fleet == nil || local.Fleet.Node != "a" || local.Fleet.Href != "/v1/fleet/runs/"+id || strings.Join(local.Fleet.Parts, ",") != "a,b" {
		t.Errorf("GET /v1/runs/%s of a fleet part: %+v", id, local)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/runs/" + id + "/finish", secret: op}); r.status != http.StatusOK {
		t.Errorf("finish: %d %s", r.status, r.body)
	}

	var rep reports.FleetReport
	r = e.do(request{path: "/v1/fleet/runs/" + id + "/reconciliation", secret: aud})
	r.decode(t, &rep)
	if f1 := rep.Checks[len(rep.Checks)-2]; rep.Balanced || f1.ID != "F1" || f1.Pass || f1.Note != "no part from b" || len(rep.Parts) != 2 {
		t.Errorf("a fleet run with node b's part missing: balanced %t, failed %v\n%s", rep.Balanced, rep.Failed(), r.body)
	}
	var part reports.FleetPart
	e.do(request{path: "/v1/fleet/runs/" + id + "/part", secret: aud}).decode(t, &part)
	if part.Node != "a" || part.Report == nil || part.Report.RunID != id || part.Logged != e.head() || part.Dispatches == nil || part.Dispatches.Sources[0].Seq[0] != 2 {
		t.Errorf("the part: %+v", part)
	}

	// A fleet pack refused before its first byte (a part still running, a
	// token a node refuses) records no download.
	before := e.head()
	f.packErr = auditd.Errorf(auditd.ECONFLICT, "Fleet run %s: node b's part has not ended.", id)
	if r := e.do(request{path: "/v1/fleet/runs/" + id + "/evidence-pack.zip", secret: aud}); r.status != http.StatusConflict {
		t.Errorf("a fleet pack refused: %d %s", r.status, r.body)
	}
	f.packErr = nil
	if evs := e.eventsAfter(before); len(evs) != 0 {
		t.Errorf("a refused fleet pack recorded %+v", evs)
	}
	r = e.do(request{path: "/v1/fleet/runs/" + id + "/evidence-pack.zip", secret: aud})
	if r.status != http.StatusOK || r.header.Get("Content-Type") != "application/zip" || !strings.HasPrefix(string(r.body), "PK") {
		t.Errorf("fleet pack: %d %s %q", r.status, r.header.Get("Content-Type"), r.body)
	}
	if evs := e.eventsAfter(before); len(evs) != 1 || evs[0].Type != auditd.EventExport || !strings.Contains(evs[0].Detail, "fleet-evidence-pack") {
		t.Errorf("the fleet pack's download on record: %+v", evs)
	}
	before = e.head()
	r = e.do(request{path: "/v1/fleet/runs/" + id + "/evidence.xlsx", secret: aud})
	if r.status != http.StatusOK || r.header.Get("Content-Type") != api.MIMEXLSX {
		t.Fatalf("fleet workbook: %d %s %s", r.status, r.header.Get("Content-Type"), r.body)
	}
	if evs := e.eventsAfter(before); len(evs) != 1 || evs[0].Type != auditd.EventExport || !strings.Contains(evs[0].Detail, `"what":"fleet-evidence"`) {
		t.Errorf("the fleet workbook's download on record: %+v", evs)
	}
	checkFleetWorkbook(t, r.body)
	var tl reports.FleetTimeline
	e.do(request{path: "/v1/fleet/runs/" + id + "/timeline?bucket=1m", secret: aud}).decode(t, &tl)
	if tl.Bucket.D() != time.Minute || len(tl.Sources) != 2 || tl.Sources[0].Node != "a" || tl.Sources[1].Node != "b" || len(tl.Sources[0].Timeline.Buckets) == 0 {
		t.Errorf("fleet timeline: %+v", tl)
	}
	if r := e.do(request{path: "/v1/fleet/runs/" + id + "/timeline?bucket=1ms", secret: aud}); r.status != http.StatusBadRequest || r.problem(t).Field != "bucket" {
		t.Errorf("fleet timeline with a bucket too narrow: %d %s", r.status, r.body)
	}
	before = e.head()
	if r := e.do(request{path: "/v1/fleet/runs/" + id + "/part.zip", secret: aud}); r.status != http.StatusOK || r.header.Get("Content-Type") != "application/zip" {
		t.Errorf("part: %d %s", r.status, r.body)
	}
	if evs := e.eventsAfter(before); len(evs) != 1 || evs[0].Type != auditd.EventExport || !strings.Contains(evs[0].Detail, `"what":"fleet-part"`) {
		t.Errorf("the part's download on record: %+v", evs)
	}
	if r := e.do(request{path: "/v1/fleet/runs/01JAAAAAAAAAAAAAAAAAAAAAAA/part.zip", secret: aud}); r.status != http.StatusNotFound {
		t.Errorf("the part of an unknown run: %d", r.status)
	}

	var st api.FleetLogStatus
	e.do(request{path: "/v1/fleet/log", secret: aud}).decode(t, &st)
	if st.Failures != 1 || st.LastError == "" {
		t.Errorf("log status: %+v", st)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/log/cosignatures", secret: op, body: `{"size":7}`}); r.status != http.StatusOK {
		t.Errorf("cosign: %d %s", r.status, r.body)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/log/cosignatures", secret: op, body: `{"size":9}`}); r.status != http.StatusBadRequest || r.problem(t).Field != "size" {
		t.Errorf("cosign past the head: %d %s", r.status, r.body)
	}
	if r := e.do(request{method: "POST", path: "/v1/fleet/log/cosignatures", secret: op, body: `{"size":0}`}); r.status != http.StatusBadRequest {
		t.Errorf("cosign size 0: %d %s", r.status, r.body)
	}

	f.mu.Lock()
	calls := strings.Join(f.calls, "\n")
	f.mu.Unlock()
	for _, want := range []string{"create operator-test (", " pipeline 10m0s", "finish operator-test (", ") Bearer " + op, "reconcile Bearer " + aud, "pack Bearer " + aud,
		"evidence Bearer " + aud, "timeline Bearer " + aud} {
		if !strings.Contains(calls, want) {
			t.Errorf("the fleet was not asked %q; it was asked:\n%s", want, calls)
		}
	}
}

func TestFleetRoutesWithoutFleet(t *testing.T) {
	e := newEnv(t, func(e *env) { e.srv.Fleet = nil })
	for _, r := range []request{
		{method: "POST", path: "/v1/fleet/runs", secret: e.secret[auth.RoleOperator], body: `{"name":"x"}`},
		{path: "/v1/fleet/runs", secret: e.secret[auth.RoleAuditor]},
		{path: "/v1/fleet/runs/" + e.runID + "/reconciliation", secret: e.secret[auth.RoleAuditor]},
		{path: "/v1/fleet/log", secret: e.secret[auth.RoleAuditor]},
		{path: "/v1/fleet/runs/" + e.runID + "/evidence.xlsx", secret: e.secret[auth.RoleAuditor]},
		{path: "/v1/fleet/runs/" + e.runID + "/timeline", secret: e.secret[auth.RoleAuditor]},
	} {
		got := e.do(r)
		if p := got.problem(t); got.status != http.StatusNotFound || p.Type != api.ProblemTypeBase+"not_in_fleet" || !strings.Contains(p.Detail, "--fleet-etcd") {
			t.Errorf("%s %s on a node not in a fleet: %d %s", r.method, r.path, got.status, got.body)
		}
	}
}

// checkFleetWorkbook reads a fleet workbook back: every sheet but the
// Manifest starts with the Node column, and the Dispatches rows of node a
// and node b are the same run's.
func checkFleetWorkbook(t *testing.T, b []byte) {
	t.Helper()
	f, err := excelize.OpenReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, name := range f.GetSheetList()[1:] {
		rows, err := f.GetRows(name)
		if err != nil || len(rows) == 0 || rows[0][0] != reports.FleetNodeColumn {
			t.Errorf("sheet %s: %v, header %q", name, err, rows[:min(1, len(rows))])
		}
	}
	rows, _ := f.GetRows(reports.SheetDispatches)
	nodes := map[string]int{}
	for _, r := range rows[1:] {
		nodes[r[0]]++
	}
	if len(rows) < 3 || nodes["a"] == 0 || nodes["a"] != nodes["b"] || len(nodes) != 2 {
		t.Errorf("the Dispatches rows by node: %v", nodes)
	}
}
