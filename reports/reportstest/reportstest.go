// Package reportstest holds the fixture ledgers the reports package and
// the auditd command test with: a readable NDJSON form of auditd.Event
// (LoadFixture reads it, WriteFixture writes it), an in-memory
// auditd.EventReader with a hash chain, a loader into a real ledger, and
// the mutations that each break exactly one identity R1 to R10.
//
// The fixtures in testdata/reports: loop.ndjson is a run of the real fetch
// loop, written by the fetch package's TestLoopFixture (go test ./fetch
// -run TestLoopFixture -update), which fails when the loop no longer
// writes it; clean.ndjson is written by hand to reach every identity and
// event type (a restart, a shed, an interrupted dispatch), and the reports
// tests hold it to the fields the loop's fixture shows
// (TestCleanFixtureHoldsWhatTheLoopWrites, TestFixtureWaitsCarryTheirAttempt).
package reportstest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
)

// Dir is the repository's testdata/reports, wherever the test runs from.
func Dir() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "testdata", "reports")
}

// FixtureRun is the run id every fixture event belongs to unless it says
// "run".
const FixtureRun = "01JQ8Z6X0RUN0000000000000A"

// FixtureBase is time zero of a fixture; "at" offsets count from it.
var FixtureBase = time.Date(2026, 3, 2, 10, 0, 0, 0, time.UTC)

// dur is a duration written as a Go duration string in fixtures.
type dur time.Duration

func (d *dur) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	*d = dur(v)
	return err
}

// fixtureEvent is one line of a fixture ledger: an auditd.Event in readable
// form. Seq documents the line (mutations name events by it); the ledger
// assigns the real one.
type fixtureEvent struct {
	Seq           uint64          `json:"seq"`
	Type          string          `json:"type"`
	Run           *string         `json:"run"`
	Source        string          `json:"source"`
	Item          string          `json:"item"`
	Page          uint32          `json:"page"`
	Attempt       uint32          `json:"attempt"`
	At            dur             `json:"at"`
	Method        string          `json:"method"`
	Path          string          `json:"path"`
	Status        int             `json:"status"`
	Bytes         int64           `json:"bytes"`
	Latency       dur             `json:"latency"`
	Wait          dur             `json:"wait"`
	Actual        dur             `json:"actual"`
	RetryAfterRaw string          `json:"retry_after_raw"`
	RetryAfter    dur             `json:"retry_after"`
	Clamped       bool            `json:"clamped"`
	Backoff       dur             `json:"backoff"`
	From          string          `json:"from"`
	To            string          `json:"to"`
	Failures      int             `json:"failures"`
	Threshold     int             `json:"threshold"`
	Cooldown      dur             `json:"cooldown"`
	OldLimit      int             `json:"old_limit"`
	NewLimit      int             `json:"new_limit"`
	OldWindow     dur             `json:"old_window"`
	NewWindow     dur             `json:"new_window"`
	Group         string          `json:"group"`
	Outcome       string          `json:"outcome"`
	BodyError     string          `json:"body_error"`
	PayloadHash   string          `json:"payload_hash"`
	Cause         string          `json:"cause"`
	Principal     string          `json:"principal"`
	Detail        json.RawMessage `json:"detail"`
}

func (f fixtureEvent) event() (auditd.Event, error) {
	run := FixtureRun
	if f.Run != nil {
		run = *f.Run
	}
	detail := string(f.Detail)
	var s string
	if json.Unmarshal(f.Detail, &s) == nil {
		detail = s // a JSON string holds the detail as is
	}
	e := auditd.Event{
		Seq: f.Seq, Type: auditd.EventType(f.Type), RunID: run, SourceID: f.Source, ItemKey: f.Item,
		Page: f.Page, Time: FixtureBase.Add(time.Duration(f.At)), Mono: time.Duration(f.At),
		Method: f.Method, Path: f.Path, Status: f.Status, Bytes: f.Bytes, Latency: time.Duration(f.Latency),
		Wait: time.Duration(f.Wait), Actual: time.Duration(f.Actual), RetryAfterRaw: f.RetryAfterRaw,
		RetryAfter: time.Duration(f.RetryAfter), Clamped: f.Clamped, Backoff: time.Duration(f.Backoff),
		From: f.From, To: f.To, Failures: f.Failures, Threshold: f.Threshold, Cooldown: time.Duration(f.Cooldown),
		OldLimit: f.OldLimit, NewLimit: f.NewLimit, OldWindow: time.Duration(f.OldWindow), NewWindow: time.Duration(f.NewWindow),
		Group: f.Group, Outcome: auditd.Outcome(f.Outcome), BodyError: f.BodyError, PayloadHash: f.PayloadHash,
		Principal: f.Principal, Detail: detail,
	}
	// "attempt" and "cause" are as the API's event JSON has them.
	return e, e.SetShared(f.Attempt, f.Cause)
}

// LoadFixture reads testdata/reports/name, a fixture ledger in NDJSON.
func LoadFixture(tb testing.TB, name string) []auditd.Event {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(Dir(), name))
	if err != nil {
		tb.Fatal(err)
	}
	var evs []auditd.Event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for line := 1; sc.Scan(); line++ {
		var f fixtureEvent
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&f); err != nil {
			tb.Fatalf("%s:%d: %v", name, line, err)
		}
		if f.Seq != uint64(line) {
			tb.Fatalf("%s:%d: seq %d out of order", name, line, f.Seq)
		}
		e, err := f.event()
		if err != nil {
			tb.Fatalf("%s:%d: %v", name, line, err)
		}
		evs = append(evs, e)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return evs
}

// Hash stands in for the ledger's canonical hash: SHA-256 of the
// previous hash and the event's JSON in the shape of hashedEvent.
func Hash(prev [32]byte, e *auditd.Event) [32]byte {
	attempt, cause := e.Shared()
	b, err := json.Marshal(&hashedEvent{
		Seq: e.Seq, Type: e.Type, RunID: e.RunID, SourceID: e.SourceID, ItemKey: e.ItemKey, Page: e.Page,
		Attempt: attempt, Time: e.Time, Mono: e.Mono, IdempotencyKey: e.IdempotencyKey, Method: e.Method,
		Path: e.Path, Status: e.Status, Bytes: e.Bytes, Latency: e.Latency, Wait: e.Wait, Actual: e.Actual,
		RetryAfterRaw: e.RetryAfterRaw, RetryAfter: e.RetryAfter, Clamped: e.Clamped, Backoff: e.Backoff,
		From: e.From, To: e.To, Failures: e.Failures, Threshold: e.Threshold, Cooldown: e.Cooldown,
		OldLimit: e.OldLimit, NewLimit: e.NewLimit, OldWindow: e.OldWindow, NewWindow: e.NewWindow,
		Group: e.Group, Outcome: e.Outcome, BodyError: e.BodyError, PayloadHash: e.PayloadHash,
		Cause: cause, Principal: e.Principal, Detail: e.Detail,
	})
	if err != nil {
		panic(err)
	}
	h := sha256.New()
	h.Write(prev[:])
	h.Write(b)
	var out [32]byte
	h.Sum(out[:0])
	return out
}

// hashedEvent is what Hash hashes of an event: its fields as the fixtures'
// golden files were made with (auditd.Event before its shared attempt and
// cause were split into fields by type), so that they do not change with
// auditd.Event's layout.
type hashedEvent struct {
	Seq            uint64
	Type           auditd.EventType
	RunID          string
	SourceID       string
	ItemKey        string
	Page           uint32
	Attempt        uint32
	Time           time.Time
	Mono           time.Duration
	IdempotencyKey string
	Method         string
	Path           string
	Status         int
	Bytes          int64
	Latency        time.Duration
	Wait           time.Duration
	Actual         time.Duration
	RetryAfterRaw  string
	RetryAfter     time.Duration
	Clamped        bool
	Backoff        time.Duration
	From           string
	To             string
	Failures       int
	Threshold      int
	Cooldown       time.Duration
	OldLimit       int
	NewLimit       int
	OldWindow      time.Duration
	NewWindow      time.Duration
	Group          string
	Outcome        auditd.Outcome
	BodyError      string
	PayloadHash    string
	Cause          string
	Principal      string
	Detail         string
	PrevHash       [32]byte
	Hash           [32]byte
}

// MemLedger is an in-memory auditd.EventReader holding a fixture ledger.
type MemLedger struct {
	Events []auditd.Event
}

// NewMemLedger appends evs as the ledger would: contiguous sequence numbers
// from 1 and a hash chain.
func NewMemLedger(evs []auditd.Event) *MemLedger {
	l := &MemLedger{Events: make([]auditd.Event, 0, len(evs))}
	for _, e := range evs {
		l.append(e)
	}
	return l
}

func (l *MemLedger) append(e auditd.Event) {
	var prev [32]byte
	if n := len(l.Events); n > 0 {
		prev = l.Events[n-1].Hash
	}
	e.Seq = uint64(len(l.Events) + 1)
	e.PrevHash = prev
	e.Hash = Hash(prev, &e)
	l.Events = append(l.Events, e)
}

func (l *MemLedger) ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error {
	for i := range l.Events {
		if e := l.Events[i]; e.RunID == runID && e.Seq > after {
			if err := fn(&e); err != nil {
				return err
			}
		}
	}
	return nil
}

func (l *MemLedger) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	for i := range l.Events {
		e := l.Events[i]
		if e.Seq < from || (to != 0 && e.Seq > to) {
			continue
		}
		if err := fn(&e); err != nil {
			return err
		}
	}
	return nil
}

// PayloadSet verifies the payload hashes it holds.
type PayloadSet map[string]bool

func (p PayloadSet) VerifyPayload(hash string) error {
	if !p[hash] {
		return errors.New("staged payload does not hash to " + hash)
	}
	return nil
}

// CleanPayloads are the payloads the clean fixture staged.
func CleanPayloads() PayloadSet {
	return PayloadSet{
		"b5bb9d8014a0f9b1d61e21e796d78dccdf1352f23cd32812f4850b878ae4944c": true,
		"7d865e959b2466918c9863afca942d0fb89d7c9ac0c99bafc3749504ded97730": true,
		"a948904f2f0f479b8f8197694b30184b0d2ed1c1cd2a1ec0fb85d299a192a447": true,
	}
}

// CleanLive are the counters the fetch loop would have kept for the clean
// fixture.
func CleanLive() *reports.LiveCounters {
	return &reports.LiveCounters{
		Total: auditd.Counts{Items: 6, Succeeded: 3, Cached: 1, Failed: 1, Shed: 1, Dispatches: 11, Retries: 5,
			Status2xx: 5, Status429: 1, Status5xx: 2, StatusOther: 1, TransportErrors: 1, Interrupted: 1, Waits: 4,
			BreakerOpens: 1, Staged: 3, Acknowledged: 4},
		Sources: map[string]auditd.Counts{
			"gis": {Items: 2, Succeeded: 2, Dispatches: 5, Retries: 2, Status2xx: 3, Status429: 1, Status5xx: 1,
				Waits: 2, BreakerOpens: 1, Staged: 2, Acknowledged: 2},
			"grants": {Items: 4, Succeeded: 1, Cached: 1, Failed: 1, Shed: 1, Dispatches: 6, Retries: 3, Status2xx: 2,
				Status5xx: 1, StatusOther: 1, TransportErrors: 1, Interrupted: 1, Waits: 2, Staged: 1, Acknowledged: 2},
		},
	}
}

// Mutation breaks one identity of the clean fixture: it edits the events
// before they are appended (so the chain is intact), or tampers with the
// ledger after, or gives live counters that disagree with the events.
type Mutation struct {
	Name   string
	Breaks string // the one check that must fail
	// Offending is a seq the failure must name (0: none expected).
	Offending uint64
	Before    func(evs []auditd.Event) []auditd.Event
	After     func(l *MemLedger)
	Live      *reports.LiveCounters
}

// Apply returns the clean fixture with m applied, in memory.
func (m Mutation) Apply(tb testing.TB) *MemLedger {
	tb.Helper()
	evs := LoadFixture(tb, "clean.ndjson")
	if m.Before != nil {
		evs = m.Before(evs)
	}
	l := NewMemLedger(evs)
	if m.After != nil {
		m.After(l)
	}
	return l
}

// at returns the event with fixture seq seq.
func at(evs []auditd.Event, seq uint64) *auditd.Event {
	for i := range evs {
		if evs[i].Seq == seq {
			return &evs[i]
		}
	}
	panic(fmt.Sprint("no fixture event with seq ", seq))
}

func edit(seq uint64, fn func(e *auditd.Event)) func([]auditd.Event) []auditd.Event {
	return func(evs []auditd.Event) []auditd.Event { fn(at(evs, seq)); return evs }
}

func drop(seqs ...uint64) func([]auditd.Event) []auditd.Event {
	return func(evs []auditd.Event) []auditd.Event {
		return slices.DeleteFunc(evs, func(e auditd.Event) bool { return slices.Contains(seqs, e.Seq) })
	}
}

// insertAfter adds add after the event with fixture seq seq, at its time.
func insertAfter(seq uint64, add ...auditd.Event) func([]auditd.Event) []auditd.Event {
	return func(evs []auditd.Event) []auditd.Event {
		i := slices.IndexFunc(evs, func(x auditd.Event) bool { return x.Seq == seq })
		for j := range add {
			if add[j].RunID == "" {
				add[j].RunID = FixtureRun
			}
			add[j].Time = evs[i].Time
		}
		return slices.Insert(evs, i+1, add...)
	}
}

func mut(name string, m Mutation, breaks string, offending uint64) Mutation {
	m.Name, m.Breaks, m.Offending = name, breaks, offending
	return m
}

// Mutations are the cases that each break exactly one identity.
func Mutations() []Mutation {
	wrongLive := CleanLive()
	wrongLive.Total.Dispatches++
	wrongSource := CleanLive()
	g := wrongSource.Sources["grants"]
	g.Retries--
	wrongSource.Sources["grants"] = g

	return []Mutation{
		mut("R1/ItemFinishedTwice", Mutation{Before: insertAfter(38, auditd.Event{Type: auditd.EventItemFinished, SourceID: "grants", ItemKey: "opps", Outcome: auditd.ItemFailed})}, reports.R1, 39),
		mut("R1/ItemQueuedTwice", Mutation{Before: insertAfter(9, auditd.Event{Type: auditd.EventItemQueued, SourceID: "grants", ItemKey: "budget"})}, reports.R1, 10),
		mut("R1/UnknownOutcome", Mutation{Before: edit(25, func(e *auditd.Event) { e.Outcome = "gone" })}, reports.R1, 25),
		// The run's status disagrees with how its items ended: run.finished fails R1.
		mut("R1/SucceededWithItemsFailed", Mutation{Before: edit(55, func(e *auditd.Event) { e.Outcome = auditd.Outcome(auditd.RunSucceeded) })}, reports.R1, 55),
		mut("R1/FinishedWithItemPending", Mutation{Before: drop(25)}, reports.R1, 54),
		mut("R2/OutcomeMissing", Mutation{Before: drop(37)}, reports.R2, 36),
		mut("R2/OutcomeTwice", Mutation{Before: insertAfter(29, auditd.Event{Type: auditd.EventResponse, SourceID: "gis", ItemKey: "parcels", Page: 1, Attempt: 2, Status: 200, Outcome: auditd.OutcomeSuccess})}, reports.R2, 30),
		mut("R3/AttemptGap", Mutation{Before: func(evs []auditd.Event) []auditd.Event {
			at(evs, 36).Attempt, at(evs, 37).Attempt = 4, 4
			return evs
		}}, reports.R3, 36),
		mut("R3/RetryAfterSuccess", Mutation{Before: insertAfter(11,
			auditd.Event{Type: auditd.EventDispatch, SourceID: "gis", ItemKey: "parcels", Attempt: 2, Method: "GET"},
			auditd.Event{Type: auditd.EventResponse, SourceID: "gis", ItemKey: "parcels", Attempt: 2, Status: 200, Outcome: auditd.OutcomeSuccess})}, reports.R3, 12),
		mut("R4/ThrottleWithoutWait", Mutation{Before: drop(27)}, reports.R4, 13),
		mut("R4/DispatchInsidePause", Mutation{Before: edit(13, func(e *auditd.Event) { e.Wait = 3 * time.Second })}, reports.R4, 28),
		mut("R5/DispatchHalfOpenNotProbe", Mutation{Before: edit(44, func(e *auditd.Event) { e.Probe = false })}, reports.R5, 44),
		mut("R5/IllegalTransition", Mutation{Before: edit(43, func(e *auditd.Event) { e.From, e.To = "closed", "half_open" })}, reports.R5, 43),
		mut("R6/HashDoesNotVerify", Mutation{Before: edit(51, func(e *auditd.Event) { e.PayloadHash = "00" + e.PayloadHash[2:] })}, reports.R6, 51),
		mut("R6/PayloadMissing", Mutation{Before: drop(51)}, reports.R6, 51),
		mut("R7/TotalDiffers", Mutation{Live: wrongLive}, reports.R7, 0),
		mut("R7/SourceDiffers", Mutation{Live: wrongSource}, reports.R7, 0),
		mut("R8/EventAltered", Mutation{After: func(l *MemLedger) { l.Events[28].Bytes = 999 }}, reports.R8, 29),
		mut("R8/EventDeleted", Mutation{After: func(l *MemLedger) { l.Events = slices.Delete(l.Events, 25, 26) }}, reports.R8, 27),
		mut("R9/OverLimit", Mutation{Before: edit(3, func(e *auditd.Event) { e.NewLimit = 1 })}, reports.R9, 39),
		mut("R10/AckMissing", Mutation{Before: drop(59)}, reports.R10, 52),
		mut("R10/AckUndelivered", Mutation{Before: insertAfter(59, auditd.Event{Type: auditd.EventAcknowledged, SourceID: "grants", ItemKey: "history"})}, reports.R10, 60),
	}
}

// HashEvent is the ledger's chain hash: SHA-256 of the previous hash and
// the event's canonical encoding (ledger/ledger.go, commit).
func HashEvent(prev [32]byte, e *auditd.Event) [32]byte {
	b := make([]byte, sha256.Size, 512)
	copy(b, prev[:])
	return sha256.Sum256(ledger.MarshalCanonical(b, e))
}

// WriteLedger appends evs to a new real ledger in dir (bbolt file
// auditd.db, signing key beside it), each at its fixture time, and closes
// it: a data directory as a stopped server leaves it.
func WriteLedger(tb testing.TB, dir string, evs []auditd.Event) {
	tb.Helper()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, nil)
	if err != nil {
		tb.Fatal(err)
	}
	clk := clock.NewFake(FixtureBase)
	l, err := ledger.Open(db, ledger.Options{KeyDir: dir, Clock: clk})
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	for _, e := range evs {
		clk.Set(e.Time)
		e.Seq, e.Time, e.Mono = 0, time.Time{}, 0 // the ledger assigns them
		if _, err := l.Append(ctx, e); err != nil {
			tb.Fatal(err)
		}
	}
	if err := l.Close(ctx); err != nil {
		tb.Fatal(err)
	}
	if err := db.Close(); err != nil {
		tb.Fatal(err)
	}
}

// LineDiff shows the first n lines where got differs from want, for a
// golden file's failure message; "" when they are the same.
func LineDiff(want, got string, n int) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out strings.Builder
	shown := 0
	for i := range max(len(w), len(g)) {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			fmt.Fprintf(&out, "line %d:\n  want: %s\n  got:  %s\n", i+1, a, b)
			if shown++; shown == n {
				break
			}
		}
	}
	return out.String()
}
