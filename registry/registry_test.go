package registry_test

import (
	"context"
	"errors"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// memLedger is an in-memory auditd.Appender that records what it is given
// and fails on demand.
type memLedger struct {
	mu     sync.Mutex
	events []auditd.Event
	fail   error
	clock  clock.Clock // stamps each event's Time when set
	// stall, when set, holds every Append until it is closed: a disk that
	// refuses writes, as the ledger waits it out. An Append held says so
	// on waiting, when set.
	stall, waiting chan struct{}
}

func (m *memLedger) Append(_ context.Context, e auditd.Event) (auditd.Event, error) {
	m.mu.Lock()
	stall, waiting := m.stall, m.waiting
	m.mu.Unlock()
	if stall != nil {
		if waiting != nil {
			waiting <- struct{}{}
		}
		<-stall
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return auditd.Event{}, m.fail
	}
	e.Seq = uint64(len(m.events) + 1)
	if m.clock != nil {
		e.Time = m.clock.Now()
	}
	m.events = append(m.events, e)
	return e, nil
}

// ofType returns the recorded events of type t, in order.
func (m *memLedger) ofType(t auditd.EventType) []auditd.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []auditd.Event
	for _, e := range m.events {
		if e.Type == t {
			out = append(out, e)
		}
	}
	return out
}

func (m *memLedger) all() []auditd.Event {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]auditd.Event(nil), m.events...)
}

// MustOpenDB opens a bbolt file in a temporary directory, closed at cleanup.
func MustOpenDB(tb testing.TB) *bolt.DB {
	tb.Helper()
	return mustOpenDBAt(tb, filepath.Join(tb.TempDir(), "auditd.db"))
}

func mustOpenDBAt(tb testing.TB, path string) *bolt.DB {
	tb.Helper()
	// NoSync: these tests check what is stored, not power-loss durability,
	// and an fsync per change would make them slow on a loaded disk.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

var epoch = time.Date(2026, 3, 2, 9, 0, 0, 0, time.UTC)

// harness is a registry on a fresh bbolt file, a fake clock and a memLedger.
type harness struct {
	db  *bolt.DB
	clk *clock.Fake
	led *memLedger
	reg *registry.Registry
}

func newHarness(tb testing.TB, opts registry.Options) *harness {
	tb.Helper()
	h := &harness{db: MustOpenDB(tb), clk: clock.NewFake(epoch), led: &memLedger{}}
	opts.Ledger, opts.Clock = h.led, h.clk
	reg, err := registry.Open(h.db, opts)
	if err != nil {
		tb.Fatal(err)
	}
	h.reg = reg
	return h
}

// put configures a source with a base URL derived from its ID.
func (h *harness) put(tb testing.TB, src auditd.Source) {
	tb.Helper()
	if src.BaseURL == "" {
		src.BaseURL = "https://" + src.ID + ".example.gov"
	}
	if err := h.reg.PutSource(context.Background(), "ops@example.gov", src); err != nil {
		tb.Fatalf("put %s: %v", src.ID, err)
	}
}

// adv and left are in learn_test.go.

func (h *harness) observe(tb testing.TB, obs auditd.Outcome, id string) registry.Decision {
	tb.Helper()
	return h.observeWith(tb, registry.Observation{SourceID: id, Outcome: obs, RunID: "run-1"})
}

func (h *harness) observeWith(tb testing.TB, obs registry.Observation) registry.Decision {
	tb.Helper()
	d, err := h.reg.Observe(context.Background(), obs)
	if err != nil {
		tb.Fatalf("observe %+v: %v", obs, err)
	}
	return d
}

// succeed sends n successes of source id, one every interval of fake time.
func (h *harness) succeed(tb testing.TB, id string, n int, interval time.Duration) {
	tb.Helper()
	for range n {
		h.clk.Advance(interval)
		h.observe(tb, auditd.OutcomeSuccess, id)
	}
}

// paceAtLimit sends successes of source id at exactly its current limit for
// the given number of windows, so every window is a sustained run.
func (h *harness) paceAtLimit(tb testing.TB, id string, windows int) {
	tb.Helper()
	for range windows {
		l := h.limits(tb, id)
		h.succeed(tb, id, l.Limit, l.Window/time.Duration(l.Limit))
	}
}

func (h *harness) limits(tb testing.TB, id string) registry.Limits {
	tb.Helper()
	l, err := h.reg.Limits(id)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

func TestOpen(t *testing.T) {
	t.Run("RequiresLedger", func(t *testing.T) {
		if _, err := registry.Open(MustOpenDB(t), registry.Options{}); !errors.Is(err, registry.ErrNoLedger) {
			t.Fatalf("err = %v, want ErrNoLedger", err)
		}
	})
	t.Run("UnknownSourceIsNotFound", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		_, err := h.reg.Observe(context.Background(), registry.Observation{SourceID: "nope", Outcome: auditd.OutcomeSuccess})
		if !errors.Is(err, registry.ErrSourceNotFound) || auditd.ErrorCode(err) != auditd.ENOTFOUND {
			t.Fatalf("err = %v, want ErrSourceNotFound", err)
		}
		if _, err := h.reg.RequestHeaders("nope"); !errors.Is(err, registry.ErrSourceNotFound) {
			t.Fatalf("RequestHeaders err = %v", err)
		}
	})
}

func TestPutSource(t *testing.T) {
	t.Run("Validates", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			src   auditd.Source
			field string
			want  string // in the message, when set
		}{
			{"MissingID", auditd.Source{BaseURL: "https://x.gov"}, "id", "id is required."},
			{"BadURL", auditd.Source{ID: "a", BaseURL: "ftp//x"}, "base_url", `"ftp//x" has no scheme: write it with http:// or https:// in front, such as https://ftp//x`},
			{"BadTier", auditd.Source{ID: "a", BaseURL: "https://x.gov", Tier: "lax"}, "tier", "tier must be one of strict, standard, relaxed."},
			{"LimitTooHigh", auditd.Source{ID: "a", BaseURL: "https://x.gov", Limit: 2000000, Window: auditd.Duration(time.Second)}, "limit", "limit must be at most 1000000."},
			{"IDTooLong", auditd.Source{ID: strings.Repeat("a", 101), BaseURL: "https://x.gov"}, "id", "id must be at most 100 characters."},
			{"ZeroLimitWithWindow", auditd.Source{ID: "a", BaseURL: "https://x.gov", Window: auditd.Duration(time.Minute)}, "limit", ""},
			{"BadHeaderName", auditd.Source{ID: "a", BaseURL: "https://x.gov", Headers: map[string]string{"X Key": "v"}}, "headers", ""},
			{"GroupNamedLikeSource", auditd.Source{ID: "a", BaseURL: "https://x.gov", Group: "a"}, "group", ""},
			{"BreakerThreshold", auditd.Source{ID: "a", BaseURL: "https://x.gov", Breaker: auditd.BreakerPolicy{Threshold: -1}}, "breaker.threshold", ""},
			{"WindowPastTheLimiters", auditd.Source{ID: "a", BaseURL: "https://x.gov", Limit: 1, Window: auditd.Duration(limiter.MaxWindow + time.Second)}, "window", "The window must be at most 8784h0m0s (366 days)."},
			{"IDWithLeadingSpace", auditd.Source{ID: " a", BaseURL: "https://x.gov"}, "id", "id must be printable ASCII, without a leading or trailing space."},
			{"GroupWithTrailingSpace", auditd.Source{ID: "a", BaseURL: "https://x.gov", Group: "g "}, "group", ""},
		} {
			t.Run(tc.name, func(t *testing.T) {
				h := newHarness(t, registry.Options{})
				err := h.reg.PutSource(context.Background(), "ops", tc.src)
				var aerr *auditd.Error
				if !errors.As(err, &aerr) || aerr.Code != auditd.EINVALID || aerr.Field != tc.field {
					t.Fatalf("err = %v, want invalid %s", err, tc.field)
				}
				if tc.want != "" && aerr.Message != tc.want {
					t.Errorf("message %q, want %q", aerr.Message, tc.want)
				}
				if n := len(h.led.all()); n != 0 {
					t.Fatalf("%d events appended for an invalid source", n)
				}
				if got := h.reg.ListSources(); len(got) != 0 {
					t.Fatalf("invalid source stored: %+v", got)
				}
			})
		}
	})

	t.Run("StoresConfigAndKeepsSecretsApart", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		const secret = "s3cr3t-key-value"
		src := auditd.Source{
			ID: "grants", BaseURL: "https://api.grants.gov", Limit: 60, Window: auditd.Duration(time.Minute),
			Tier: "strict", Breaker: auditd.BreakerPolicy{Threshold: 5, Cooldown: auditd.Duration(time.Minute)},
			Headers: map[string]string{"X-Api-Key": secret},
		}
		h.put(t, src)

		got, err := h.reg.GetSource("grants")
		if err != nil {
			t.Fatal(err)
		}
		want := src
		want.Headers = nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("GetSource = %+v, want %+v", got, want)
		}
		if list := h.reg.ListSources(); len(list) != 1 || list[0].Headers != nil {
			t.Fatalf("ListSources = %+v", list)
		}
		hdr, err := h.reg.RequestHeaders("grants")
		if err != nil || hdr["X-Api-Key"] != secret {
			t.Fatalf("RequestHeaders = %v, %v", hdr, err)
		}

		evs := h.led.ofType(auditd.EventSourceChanged)
		if len(evs) != 1 || evs[0].SourceID != "grants" || evs[0].Principal != "ops@example.gov" {
			t.Fatalf("source.changed events = %+v", evs)
		}
		if !strings.Contains(evs[0].Detail, `"base_url":"https://api.grants.gov"`) || !strings.Contains(evs[0].Detail, `"tier":"strict"`) {
			t.Fatalf("Detail lacks the config: %s", evs[0].Detail)
		}
		if strings.Contains(evs[0].Detail, "X-Api-Key") || strings.Contains(evs[0].Detail, secret) {
			t.Fatalf("Detail carries the secret header: %s", evs[0].Detail)
		}
	})

	t.Run("ReplacingRemovesSecrets", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a", Headers: map[string]string{"Authorization": "Bearer x"}})
		h.put(t, auditd.Source{ID: "a"})
		if hdr, err := h.reg.RequestHeaders("a"); err != nil || len(hdr) != 0 {
			t.Fatalf("RequestHeaders after replace = %v, %v", hdr, err)
		}
		if n := len(h.led.ofType(auditd.EventSourceChanged)); n != 2 {
			t.Fatalf("%d source.changed events, want 2", n)
		}
	})

	t.Run("LoweredCeilingClampsLearnedLimit", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		h.put(t, auditd.Source{ID: "a", Limit: 6, Window: auditd.Duration(time.Minute)})
		if l := h.limits(t, "a"); l.Limit != 6 || l.Window != time.Minute {
			t.Fatalf("limits = %+v, want 6/min", l)
		}
		evs := h.led.ofType(auditd.EventRegistryChanged)
		if len(evs) != 1 || evs[0].Cause != registry.CauseOperator || evs[0].OldLimit != 15 || evs[0].NewLimit != 6 || evs[0].Principal != "ops@example.gov" {
			t.Fatalf("registry.changed = %+v", evs)
		}
	})

	t.Run("LedgerFailureStoresNothing", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.led.fail = errors.New("disk full")
		if err := h.reg.PutSource(context.Background(), "ops", auditd.Source{ID: "a", BaseURL: "https://a.gov"}); err == nil {
			t.Fatal("PutSource succeeded without a ledger")
		}
		if _, err := h.reg.GetSource("a"); !errors.Is(err, registry.ErrSourceNotFound) {
			t.Fatalf("GetSource err = %v", err)
		}
	})
}

func TestSetLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		limit     int
		window    time.Duration
		wantLimit int
		wantWin   time.Duration
	}{
		{"WithinCeiling", 40, time.Minute, 40, time.Minute},
		{"AboveCeilingIsClamped", 500, time.Minute, 120, time.Minute},
		{"OtherWindowScaled", 100, time.Second, 2, time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, registry.Options{})
			h.put(t, auditd.Source{ID: "a", Limit: 120, Window: auditd.Duration(time.Minute)})
			l, err := h.reg.SetLimit(context.Background(), "ops", "a", tc.limit, tc.window)
			if err != nil {
				t.Fatal(err)
			}
			if l.Limit != tc.wantLimit || l.Window != tc.wantWin {
				t.Fatalf("limits = %+v, want %d per %v", l, tc.wantLimit, tc.wantWin)
			}
			evs := h.led.ofType(auditd.EventRegistryChanged)
			if len(evs) != 1 || evs[0].Cause != registry.CauseOperator || evs[0].NewLimit != tc.wantLimit || evs[0].Principal != "ops" {
				t.Fatalf("events = %+v", evs)
			}
		})
	}
	t.Run("RejectsZero", func(t *testing.T) {
		h := newHarness(t, registry.Options{})
		h.put(t, auditd.Source{ID: "a"})
		if _, err := h.reg.SetLimit(context.Background(), "ops", "a", 0, time.Minute); auditd.ErrorCode(err) != auditd.EINVALID {
			t.Fatalf("err = %v", err)
		}
	})
}

func TestSnapshots(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "b", Group: "gw"})
	h.put(t, auditd.Source{ID: "a", Limit: 10, Window: auditd.Duration(time.Minute), Tier: "strict"})
	ctx := context.Background()
	if err := h.reg.StartRun(ctx, "run-7", []string{"b", "a", "b"}); err != nil {
		t.Fatal(err)
	}
	h.observe(t, auditd.OutcomeThrottled, "a")
	if err := h.reg.EndRun(ctx, "run-7", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	type snap struct {
		src, cause, group string
		limit             int
	}
	var got []snap
	for _, e := range h.led.ofType(auditd.EventRegistrySnapshot) {
		if e.RunID != "run-7" || e.NewWindow != time.Minute {
			t.Fatalf("snapshot %+v", e)
		}
		got = append(got, snap{e.SourceID, e.Snapshot, e.Group, e.NewLimit})
	}
	want := []snap{
		{"a", registry.CauseRunStart, "", 10}, {"b", registry.CauseRunStart, "gw", 15},
		{"a", registry.CauseRunEnd, "", 5}, {"b", registry.CauseRunEnd, "gw", 15},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("snapshots = %+v\nwant %+v", got, want)
	}
	first := h.led.ofType(auditd.EventRegistrySnapshot)[0]
	if !strings.Contains(first.Detail, `"ceiling_limit":10`) || !strings.Contains(first.Detail, `"tier":"strict"`) {
		t.Fatalf("snapshot Detail = %s", first.Detail)
	}
	if err := h.reg.EndRun(ctx, "run-7", []string{"zzz"}); !errors.Is(err, registry.ErrSourceNotFound) {
		t.Fatalf("snapshot of unknown source: %v", err)
	}
}

func TestPersistence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "auditd.db")
	clk := clock.NewFake(epoch)
	led := &memLedger{}
	open := func(db *bolt.DB) *registry.Registry {
		reg, err := registry.Open(db, registry.Options{Ledger: led, Clock: clk})
		if err != nil {
			t.Fatal(err)
		}
		return reg
	}

	db := mustOpenDBAt(t, path)
	h := &harness{db: db, clk: clk, led: led, reg: open(db)}
	h.put(t, auditd.Source{ID: "a", Group: "gw", Tier: "relaxed", Headers: map[string]string{"X-Key": "k1"}})
	h.put(t, auditd.Source{ID: "b", Group: "gw"})
	h.observeWith(t, registry.Observation{SourceID: "a", RunID: "r1", Outcome: auditd.OutcomeSuccess, Hint: adv(50, time.Minute)})
	h.observe(t, auditd.OutcomeThrottled, "a") // a member's throttle cuts the group: 50 -> 45
	h.observe(t, auditd.OutcomeThrottled, "b") // within the settling time: no second cut
	before, err := h.reg.State("a")
	if err != nil {
		t.Fatal(err)
	}
	if before.Limit != 50 || before.GroupLimit != 45 || before.GroupCause != registry.CauseThrottle || before.Phase != registry.PhaseSteady {
		t.Fatalf("state before reopen = %+v", before)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}

	db = mustOpenDBAt(t, path)
	reg := open(db)
	after, err := reg.State("a")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, before) {
		t.Fatalf("state after reopen:\n %+v\nwant\n %+v", after, before)
	}
	if hdr, err := reg.RequestHeaders("a"); err != nil || hdr["X-Key"] != "k1" {
		t.Fatalf("headers after reopen = %v, %v", hdr, err)
	}
	if b, err := reg.Limits("b"); err != nil || b.GroupLimit != 45 || b.Limit != 15 {
		t.Fatalf("b after reopen = %+v, %v", b, err)
	}
}

// TestSecretsNeverInEvents drives every kind of event the registry writes
// for a source with secret headers and looks for the secret in all of them.
func TestSecretsNeverInEvents(t *testing.T) {
	const secret = "Bearer very-secret-token"
	h := newHarness(t, registry.Options{})
	ctx := context.Background()
	h.put(t, auditd.Source{ID: "a", Group: "gw", Headers: map[string]string{"Authorization": secret}})
	h.put(t, auditd.Source{ID: "b", Group: "gw", Headers: map[string]string{"X-Api-Key": secret}})
	if err := h.reg.StartRun(ctx, "r", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	h.observeWith(t, registry.Observation{SourceID: "a", Outcome: auditd.OutcomeSuccess, Hint: adv(30, 0)})
	h.observe(t, auditd.OutcomeThrottled, "a")
	h.observe(t, auditd.OutcomeThrottled, "b")
	h.paceAtLimit(t, "a", 3)
	if _, err := h.reg.SetLimit(ctx, "ops", "b", 3, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := h.reg.EndRun(ctx, "r", []string{"a", "b"}); err != nil {
		t.Fatal(err)
	}
	evs := h.led.all()
	types := map[auditd.EventType]bool{}
	for _, e := range evs {
		types[e.Type] = true
		v := reflect.ValueOf(e)
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.String && (strings.Contains(f.String(), "very-secret") || strings.Contains(f.String(), "Authorization") || strings.Contains(f.String(), "X-Api-Key")) {
				t.Fatalf("event %d (%s) field %s carries a secret: %q", e.Seq, e.Type, v.Type().Field(i).Name, f.String())
			}
		}
	}
	for _, typ := range []auditd.EventType{auditd.EventSourceChanged, auditd.EventRegistryChanged, auditd.EventRegistrySnapshot} {
		if !types[typ] {
			t.Fatalf("no %s event was produced; the check proves nothing for it", typ)
		}
	}
}

// A change waiting on a stalled ledger holds its source; Peek and
// PeekState, what run views and the metrics read, answer meanwhile with
// what was last read, as do the source views (its configuration, header
// names and the list of sources), and the change lands once the ledger
// writes again.
func TestPeekDoesNotWaitOnAStalledLedger(t *testing.T) {
	h := newHarness(t, registry.Options{DefaultLimit: 60})
	h.put(t, auditd.Source{ID: "a", Headers: map[string]string{"X-Key": "secret", "Accept": "json"}})
	before, err := h.reg.Limits("a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.reg.State("a"); err != nil { // read once: PeekState answers with it
		t.Fatal(err)
	}
	stall, waiting := make(chan struct{}), make(chan struct{}, 1)
	h.led.mu.Lock()
	h.led.stall, h.led.waiting = stall, waiting
	h.led.mu.Unlock()

	cut := make(chan registry.Decision, 1)
	go func() {
		d, err := h.reg.Observe(context.Background(), registry.Observation{SourceID: "a", RunID: "run-1", Status: 429, Sent: h.clk.Now()})
		if err != nil {
			t.Error(err)
		}
		cut <- d
	}()
	<-waiting // the cut's registry.changed is held by the stalled ledger

	peeked := make(chan registry.Limits, 1)
	go func() {
		l, err := h.reg.Peek("a")
		if err != nil {
			t.Error(err)
		}
		st, err := h.reg.PeekState("a") // what /metrics reads
		if err != nil {
			t.Error(err)
		}
		if st.Limit != l.Limit {
			t.Errorf("PeekState during the stall = %d, Peek %d", st.Limit, l.Limit)
		}
		if names, err := h.reg.HeaderNames("a"); err != nil || !slices.Equal(names, []string{"Accept", "X-Key"}) {
			t.Errorf("HeaderNames during the stall = %v, %v", names, err)
		}
		if srcs := h.reg.ListSources(); len(srcs) != 1 || srcs[0].ID != "a" || srcs[0].Headers != nil {
			t.Errorf("ListSources during the stall = %+v", srcs)
		}
		if src, err := h.reg.GetSource("a"); err != nil || src.ID != "a" || src.Headers != nil {
			t.Errorf("GetSource during the stall = %+v, %v", src, err)
		}
		peeked <- l
	}()
	select {
	case l := <-peeked:
		if l.Limit != before.Limit || l.Window != before.Window {
			t.Errorf("Peek during the stall = %d per %v, want the limits last read, %d per %v", l.Limit, l.Window, before.Limit, before.Window)
		}
	case <-time.After(10 * time.Second):
		close(stall)
		t.Fatal("Peek waited on the stalled ledger")
	}
	close(stall)
	d := <-cut
	if !d.Retune || d.Limit >= before.Limit {
		t.Fatalf("decision after the stall = %+v, want a cut below %d", d, before.Limit)
	}
	if l, _ := h.reg.Peek("a"); l.Limit != d.Limit {
		t.Fatalf("Peek after the stall = %d, want the cut's %d", l.Limit, d.Limit)
	}
}
