package api_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/registry"
)

// The fakes of the API's dependencies (api/deps.go) that env wires.

// fakeSources keeps sources in memory and records source.changed as the
// registry's contract says.
type fakeSources struct {
	ledger auditd.Appender
	mu     sync.Mutex
	byID   map[string]api.SourceState
}

func newFakeSources(l auditd.Appender) *fakeSources {
	return &fakeSources{ledger: l, byID: map[string]api.SourceState{}}
}

func (f *fakeSources) PutSource(ctx context.Context, src auditd.Source, principal string) (bool, error) {
	// The registry's own check, so the API's tests refuse what the
	// service refuses.
	if err := registry.CheckSource(src); err != nil {
		return false, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	_, existed := f.byID[src.ID]
	if _, err := f.ledger.Append(ctx, auditd.Event{Type: auditd.EventSourceChanged, SourceID: src.ID, Principal: principal, Detail: `{"id":"` + src.ID + `"}`}); err != nil {
		return false, err
	}
	f.byID[src.ID] = api.SourceState{Config: src, Learned: api.Learned{Limit: src.Limit, Window: src.Window.D(), Cause: "config"}}
	return !existed, nil
}

func (f *fakeSources) Source(_ context.Context, id string) (api.SourceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st, ok := f.byID[id]
	if !ok {
		return st, auditd.Errorf(auditd.ENOTFOUND, "Source %q not found.", id)
	}
	return st, nil
}

func (f *fakeSources) Sources(context.Context) ([]api.SourceState, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.SourceState
	for _, st := range f.byID {
		out = append(out, st)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Config.ID < out[j].Config.ID })
	return out, nil
}

func (f *fakeSources) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.byID)
}

// fakeRuns keeps runs in memory.
type fakeRuns struct {
	clock *clock.Fake
	mu    sync.Mutex
	seq   int
	runs  map[string]*fakeRun
	order []string
	idem  map[string]string
}

type fakeRun struct {
	state auditd.RunView
	items []auditd.ItemView
	acked map[string]bool
	req   auditd.NewRun // what it was created from
}

// sameRequest is whether a and b ask for the same run, whoever asks: what
// the real store fingerprints for an idempotency key.
func sameRequest(a, b auditd.NewRun) bool {
	return a.Name == b.Name && reflect.DeepEqual(a.Award, b.Award) && reflect.DeepEqual(a.Items, b.Items) &&
		a.Deadline.Equal(b.Deadline) && a.Replay == b.Replay
}

// replayed is the run key made, or ECONFLICT when it made it from another
// request than nr.
func (f *fakeRuns) replayed(id string, nr auditd.NewRun) (auditd.RunView, error) {
	r := f.runs[id]
	if !sameRequest(r.req, nr) {
		return auditd.RunView{}, auditd.Errorf(auditd.ECONFLICT, "The idempotency key was first used for run %s, submitted with other contents.", id)
	}
	return r.state, nil
}

func newFakeRuns(c *clock.Fake) *fakeRuns {
	return &fakeRuns{clock: c, runs: map[string]*fakeRun{}, idem: map[string]string{}}
}

func (f *fakeRuns) add(status auditd.RunStatus, items []auditd.ItemView) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.addLocked(auditd.Run{Name: "fixture", Status: status}, items)
}

func (f *fakeRuns) addLocked(r auditd.Run, items []auditd.ItemView) string {
	f.seq++
	r.ID = fmt.Sprintf("01J%023d", f.seq)
	r.CreatedAt = f.clock.Now()
	r.ItemCount = len(items)
	r.ConfigHash, r.CodeVersion, r.HeadAtStart = "cfg", "test", strings.Repeat("0", 64)
	f.runs[r.ID] = &fakeRun{state: auditd.RunView{Run: r, Counts: auditd.Counts{Items: len(items), Pending: len(items)}}, items: items, acked: map[string]bool{}}
	f.order = append(f.order, r.ID)
	return r.ID
}

func (f *fakeRuns) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.runs)
}

func (f *fakeRuns) CreateRun(_ context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := f.idem[nr.IdempotencyKey]; ok && nr.IdempotencyKey != "" {
		st, err := f.replayed(id, nr)
		return st, false, err
	}
	// As the fetch loop does: credentials in paths are redacted before
	// the run is stored and fingerprinted.
	nr.Items = slices.Clone(nr.Items)
	items := make([]auditd.ItemView, len(nr.Items))
	for i := range nr.Items {
		nr.Items[i].Path = redact.New(nil).URL(nr.Items[i].Path)
		items[i] = auditd.ItemView{Item: nr.Items[i]}
	}
	id := f.addLocked(auditd.Run{Name: nr.Name, Award: nr.Award, Status: auditd.RunRunning, InitiatedBy: nr.Principal, Deadline: nr.Deadline, Replay: nr.Replay,
		Mode: nr.Mode, IdleTimeout: auditd.Duration(nr.IdleTimeout), Open: nr.Open}, items)
	f.runs[id].req = nr
	if nr.IdempotencyKey != "" {
		f.idem[nr.IdempotencyKey] = id
	}
	return f.runs[id].state, true, nil
}

func (f *fakeRuns) RunByIdempotencyKey(_ context.Context, nr auditd.NewRun) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if id, ok := f.idem[nr.IdempotencyKey]; ok {
		return f.replayed(id, nr)
	}
	return auditd.RunView{}, auditd.Errorf(auditd.ENOTFOUND, "no run with that key")
}

func (f *fakeRuns) get(id string) (*fakeRun, error) {
	r, ok := f.runs[id]
	if !ok {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "Run %q not found.", id)
	}
	return r, nil
}

func (f *fakeRuns) Run(_ context.Context, id string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	return r.state, nil
}

func (f *fakeRuns) Runs(_ context.Context, flt auditd.RunFilter) ([]auditd.RunView, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []auditd.RunView
	skipping := flt.After != ""
	for i := len(f.order) - 1; i >= 0; i-- {
		r := f.runs[f.order[i]]
		if skipping {
			skipping = r.state.Run.ID != flt.After
			continue
		}
		if flt.Status != "" && r.state.Run.Status != flt.Status {
			continue
		}
		if flt.FAIN != "" && r.state.Run.Award.FAIN != flt.FAIN {
			continue
		}
		if len(out) == flt.Limit {
			return out, out[len(out)-1].Run.ID, nil
		}
		out = append(out, r.state)
	}
	return out, "", nil
}

func (f *fakeRuns) CancelRun(_ context.Context, id, _ string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if r.state.Run.Status.Terminal() {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s is %s.", id, r.state.Run.Status)
	}
	r.state.Run.Status = auditd.RunCancelled
	return r.state, nil
}

// AddRunItems adds a page to an open run, as the fetch loop does: a key
// the run has is refused, naming it.
func (f *fakeRuns) AddRunItems(_ context.Context, id string, items []auditd.Item) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if !r.state.Run.Open {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s takes no more items.", id)
	}
	for i, it := range items {
		for _, have := range r.items {
			if have.Key == it.Key {
				return auditd.RunView{}, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d].key", i), Message: "repeated"}
			}
		}
	}
	for _, it := range items {
		r.items = append(r.items, auditd.ItemView{Item: it})
	}
	r.state.Run.ItemCount = len(r.items)
	return r.state, nil
}

// AddRunItemsStream adds the chunks next yields as one page, all or
// nothing, as the fetch loop does: a key the run or the page has already
// is refused, naming it in its chunk.
func (f *fakeRuns) AddRunItemsStream(ctx context.Context, id string, next func() ([]auditd.Item, error)) (auditd.RunView, error) {
	f.mu.Lock()
	r, err := f.get(id)
	keys := map[string]bool{}
	if err == nil {
		for _, it := range r.items {
			keys[it.Key] = true
		}
	}
	f.mu.Unlock()
	if err != nil {
		return auditd.RunView{}, err
	}
	var page []auditd.Item
	for {
		items, err := next()
		if errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return auditd.RunView{}, err
		}
		for i, it := range items {
			if keys[it.Key] {
				return auditd.RunView{}, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d].key", i), Message: "repeated"}
			}
			keys[it.Key] = true
		}
		page = append(page, items...)
	}
	return f.AddRunItems(ctx, id, page)
}

func (f *fakeRuns) FinishRun(_ context.Context, id, _ string) (auditd.RunView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(id)
	if err != nil {
		return auditd.RunView{}, err
	}
	if r.state.Run.Open {
		r.state.Run.Open = false
		return r.state, nil
	}
	if r.state.Run.Mode != auditd.RunProxy || r.state.Run.Status.Terminal() {
		return r.state, auditd.Errorf(auditd.ECONFLICT, "Run %s is not a running proxy-mode run.", id)
	}
	r.state.Run.Status = auditd.RunSucceeded
	return r.state, nil
}

func (f *fakeRuns) Acknowledge(_ context.Context, runID string, keys []string, _ string) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return 0, err
	}
	for i, k := range keys {
		ok := false
		for _, it := range r.items {
			ok = ok || (it.Item.Key == k && it.Result != nil && it.Result.PayloadHash != "")
		}
		if !ok {
			return 0, &auditd.Error{Code: auditd.EINVALID, Field: fmt.Sprintf("items[%d]", i), Message: "not a delivered item"}
		}
	}
	n := 0
	for _, k := range keys {
		if !r.acked[k] {
			r.acked[k] = true
			n++
		}
	}
	return n, nil
}

func (f *fakeRuns) Items(_ context.Context, runID, after string, limit int) ([]auditd.ItemView, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return nil, "", err
	}
	i := 0
	if after != "" {
		for i = 0; i < len(r.items) && r.items[i].Item.Key != after; i++ {
		}
		if i == len(r.items) {
			return nil, "", &auditd.Error{Code: auditd.EINVALID, Field: "cursor", Message: "cursor names no item of this run"}
		}
		i++
	}
	out := r.items[i:]
	if len(out) > limit {
		return out[:limit], out[limit-1].Item.Key, nil
	}
	return out, "", nil
}

func (f *fakeRuns) Item(_ context.Context, runID, key string) (auditd.ItemView, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, err := f.get(runID)
	if err != nil {
		return auditd.ItemView{}, err
	}
	for _, it := range r.items {
		if it.Item.Key == key {
			return it, nil
		}
	}
	return auditd.ItemView{}, auditd.Errorf(auditd.ENOTFOUND, "Item %q not found.", key)
}

func (f *fakeRuns) Payload(ctx context.Context, runID, key string) (io.ReadCloser, error) {
	it, err := f.Item(ctx, runID, key)
	if err != nil {
		return nil, err
	}
	if it.Result == nil || it.Result.PayloadHash == "" {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "no payload")
	}
	return io.NopCloser(strings.NewReader("payload")), nil
}

// fakeIntegrity answers from the real ledger's head.
type fakeIntegrity struct{ l *ledger.Ledger }

func (f fakeIntegrity) Verify(context.Context) (api.Verification, error) {
	seq, hash := f.l.Head()
	return api.Verification{OK: true, Events: seq, HeadSeq: seq, HeadHash: fmt.Sprintf("%x", hash)}, nil
}

func (f fakeIntegrity) Prove(_ context.Context, seq uint64) (api.Proof, error) {
	head, _ := f.l.Head()
	if seq > head {
		return api.Proof{}, auditd.Errorf(auditd.ENOTFOUND, "No event %d.", seq)
	}
	return api.Proof{Seq: seq, LeafHash: "bGVhZg==", TreeSize: head, RootHash: "cm9vdA==", Hashes: []string{}, Checkpoint: "note"}, nil
}

// fakeReports writes small stand-ins for the real documents.
type fakeReports struct{}

func (fakeReports) WriteReconciliation(_ context.Context, w io.Writer, runID, format string) error {
	var err error
	switch format {
	case "json":
		_, err = fmt.Fprintf(w, `{"run_id":%[1]q,"run":{"id":%[1]q,"status":"succeeded","first_seq":1,"last_seq":9},"balanced":true,"counts":{"queued":2},`+
			`"checks":[{"id":"R1","scope":"total","description":"items queued = finished + pending","status":"pass","expected":2,"actual":2,"difference":0,"pass":true}],`+
			`"sources":[],"control":[]}`, runID)
	case "csv":
		_, err = io.WriteString(w, "id,scope,expected,actual,difference,pass\nR1,total,2,2,0,true\n")
	default:
		_, err = io.WriteString(w, "PK\x03\x04 fake workbook")
	}
	return err
}

func (fakeReports) WriteRunEvidence(_ context.Context, w io.Writer, _ string) error {
	_, err := io.WriteString(w, "PK\x03\x04 fake workbook")
	return err
}

func (fakeReports) WriteAwardEvidence(_ context.Context, w io.Writer, _ auditd.RunFilter) error {
	_, err := io.WriteString(w, "PK\x03\x04 fake workbook")
	return err
}

// fakePacks writes a stand-in for a pack and keeps what it was asked for.
type fakePacks struct {
	mu    sync.Mutex
	calls []packCall
}

type packCall struct {
	runIDs  []string
	filters string
}

func (f *fakePacks) WritePack(_ context.Context, w io.Writer, runIDs []string, filters string) error {
	f.mu.Lock()
	f.calls = append(f.calls, packCall{slices.Clone(runIDs), filters})
	f.mu.Unlock()
	_, err := io.WriteString(w, "PK\x03\x04 fake pack")
	return err
}

func (f *fakePacks) last() (packCall, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return packCall{}, 0
	}
	return f.calls[len(f.calls)-1], len(f.calls)
}
