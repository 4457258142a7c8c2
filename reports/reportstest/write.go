package reportstest

import (
	"encoding/json"
	"io"
	"strings"
	"time"

	"github.com/auditd/auditd"
)

// fixtureLine is an event as a fixture line holds it, zero fields left
// out: fixtureEvent's fields, written.
type fixtureLine struct {
	Seq           uint64  `json:"seq"`
	Type          string  `json:"type"`
	Run           *string `json:"run,omitempty"`
	Source        string  `json:"source,omitempty"`
	Item          string  `json:"item,omitempty"`
	Page          uint32  `json:"page,omitempty"`
	Attempt       uint32  `json:"attempt,omitempty"`
	At            string  `json:"at"`
	Method        string  `json:"method,omitempty"`
	Path          string  `json:"path,omitempty"`
	Status        int     `json:"status,omitempty"`
	Bytes         int64   `json:"bytes,omitempty"`
	Latency       string  `json:"latency,omitempty"`
	Wait          string  `json:"wait,omitempty"`
	Actual        string  `json:"actual,omitempty"`
	RetryAfterRaw string  `json:"retry_after_raw,omitempty"`
	RetryAfter    string  `json:"retry_after,omitempty"`
	Clamped       bool    `json:"clamped,omitempty"`
	Backoff       string  `json:"backoff,omitempty"`
	From          string  `json:"from,omitempty"`
	To            string  `json:"to,omitempty"`
	Failures      int     `json:"failures,omitempty"`
	Threshold     int     `json:"threshold,omitempty"`
	Cooldown      string  `json:"cooldown,omitempty"`
	OldLimit      int     `json:"old_limit,omitempty"`
	NewLimit      int     `json:"new_limit,omitempty"`
	OldWindow     string  `json:"old_window,omitempty"`
	NewWindow     string  `json:"new_window,omitempty"`
	Group         string  `json:"group,omitempty"`
	Outcome       string  `json:"outcome,omitempty"`
	BodyError     string  `json:"body_error,omitempty"`
	PayloadHash   string  `json:"payload_hash,omitempty"`
	Cause         string  `json:"cause,omitempty"`
	Principal     string  `json:"principal,omitempty"`
	Detail        string  `json:"detail,omitempty"`
}

// WriteFixture writes events, as a ledger stored them, as fixture lines
// that LoadFixture reads back: sequence numbers from 1 in their order,
// events of run runID under FixtureRun (others keep theirs, and their
// lines say so), times as offsets from the first event's (so the fixture's
// events fall at FixtureBase on), durations as Go duration strings. The
// monotonic offsets and hashes are left out; loading gives them anew.
// replace holds pairs, old then new: strings that name things of one
// ledger only (other runs' ids, a test server's address) and the fixed
// ones written instead, wherever they occur in a string field.
func WriteFixture(w io.Writer, events []auditd.Event, runID string, replace ...string) error {
	if len(events) == 0 {
		return nil
	}
	t0 := events[0].Time
	d := func(v time.Duration) string {
		if v == 0 {
			return ""
		}
		return v.String()
	}
	r := strings.NewReplacer(replace...)
	s := r.Replace
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	for i := range events {
		e := &events[i]
		attempt, cause := e.Shared()
		l := fixtureLine{
			Seq: uint64(i + 1), Type: string(e.Type), Source: s(e.SourceID), Item: s(e.ItemKey), Page: e.Page,
			Attempt: attempt, At: e.Time.Sub(t0).String(), Method: e.Method, Path: s(e.Path), Status: e.Status,
			Bytes: e.Bytes, Latency: d(e.Latency), Wait: d(e.Wait), Actual: d(e.Actual), RetryAfterRaw: e.RetryAfterRaw,
			RetryAfter: d(e.RetryAfter), Clamped: e.Clamped, Backoff: d(e.Backoff), From: e.From, To: e.To,
			Failures: e.Failures, Threshold: e.Threshold, Cooldown: d(e.Cooldown), OldLimit: e.OldLimit,
			NewLimit: e.NewLimit, OldWindow: d(e.OldWindow), NewWindow: d(e.NewWindow), Group: s(e.Group),
			Outcome: string(e.Outcome), BodyError: e.BodyError, PayloadHash: e.PayloadHash, Cause: s(cause),
			Principal: s(e.Principal), Detail: s(e.Detail),
		}
		if e.RunID != runID {
			run := s(e.RunID)
			l.Run = &run
		}
		if err := enc.Encode(&l); err != nil {
			return err
		}
	}
	return nil
}
