package pack

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"golang.org/x/mod/sumdb/tlog"
)

// TestLeafLineIsJSON: the hand-written NDJSON line is byte for byte what
// encoding/json makes of the event, for plain and awkward values.
func TestLeafLineIsJSON(t *testing.T) {
	full := auditd.Event{Seq: 42, Type: auditd.EventThrottle, RunID: "01JRUN", SourceID: "county", ItemKey: "k", Page: 3, Attempt: 2,
		Time: time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC), Mono: 1500 * time.Millisecond, IdempotencyKey: "idem",
		Method: "GET", Path: "/q?a=1&b=<2>", Status: 429, Bytes: -1, Latency: time.Microsecond, Wait: time.Hour, Actual: 3,
		RetryAfterRaw: "Wed, 21 Oct 2015 07:28:00 GMT", RetryAfter: time.Minute, Clamped: true, Backoff: 7 * time.Second,
		From: "closed", To: "open", Failures: 5, Threshold: 5, Cooldown: time.Minute, OldLimit: 10, NewLimit: 20,
		OldWindow: time.Second, NewWindow: 2 * time.Second, Group: "g", Outcome: auditd.OutcomeSuccess, BodyError: "498",
		PayloadHash: "ab", Reason: "tab\there \"quoted\" \\ \u2028 é", Principal: "token:x", Detail: `{"a":"<b>"}` + "\x01\xff"}
	full.PrevHash[0], full.Hash[31] = 1, 2
	for _, e := range []auditd.Event{full, {Seq: 1, Type: auditd.EventRunStarted}, {Seq: 7, Type: auditd.EventWait, Time: time.Unix(0, 0)}} {
		var leaf tlog.Hash
		leaf[5] = 9
		got, err := appendLeafLine(nil, &e, leaf)
		if err != nil {
			t.Fatal(err)
		}
		want, err := json.Marshal(newLeafJSON(&e, leaf))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want)+"\n" {
			t.Errorf("event %d:\n got %s\nwant %s", e.Seq, got, want)
		}
	}
}

// FuzzLeafLine: whatever the strings and numbers, the line is what
// encoding/json writes.
func FuzzLeafLine(f *testing.F) {
	f.Add("a\x00<&>\u2028", int64(-5), int64(time.Second), uint32(1))
	f.Fuzz(func(t *testing.T, s string, n, d int64, p uint32) {
		e := auditd.Event{Seq: uint64(p) + 1, Type: auditd.EventType(s), Path: s, Detail: s, Bytes: n, Status: int(n),
			Wait: time.Duration(d), Page: p, Time: time.Unix(0, d)}
		var leaf tlog.Hash
		got, err := appendLeafLine(nil, &e, leaf)
		want, werr := json.Marshal(newLeafJSON(&e, leaf))
		if (err == nil) != (werr == nil) || err == nil && string(got) != string(want)+"\n" {
			t.Fatalf("got %s (%v)\nwant %s (%v)", got, err, want, werr)
		}
	})
}
