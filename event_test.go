package auditd_test

import (
	"testing"

	"github.com/auditd/auditd"
)

// TestSharedFields: each typed field that shares the encoding's attempt or
// cause goes there for its type and comes back from there; an event that
// sets a field its type does not carry is refused, since the encoding
// could not keep it.
func TestSharedFields(t *testing.T) {
	for _, tc := range []struct {
		name    string
		e       auditd.Event
		attempt uint32
		cause   string
	}{
		{"WaitGate", auditd.Event{Type: auditd.EventWait, Gate: "rate", Attempt: 1}, 1, "rate"},
		{"ShedGate", auditd.Event{Type: auditd.EventShed, Gate: "concurrency"}, 0, "concurrency"},
		{"Probe", auditd.Event{Type: auditd.EventDispatch, Attempt: 2, Probe: true}, 2, "probe"},
		{"NoProbe", auditd.Event{Type: auditd.EventDispatch, Attempt: 1}, 1, ""},
		{"TransportError", auditd.Event{Type: auditd.EventTransportError, ErrorText: "reset"}, 0, "reset"},
		{"RegistryCause", auditd.Event{Type: auditd.EventRegistryChanged, Cause: "header"}, 0, "header"},
		{"Snapshot", auditd.Event{Type: auditd.EventRegistrySnapshot, Snapshot: "run.start"}, 0, "run.start"},
		{"ExportHead", auditd.Event{Type: auditd.EventExport, Head: "12"}, 0, "12"},
		{"ItemAttempts", auditd.Event{Type: auditd.EventItemFinished, Attempts: 5, Reason: "cancelled"}, 5, "cancelled"},
		{"ResumedReason", auditd.Event{Type: auditd.EventRunResumed, Reason: "restart"}, 0, "restart"},
		{"UnknownTypeReason", auditd.Event{Type: "x.y", Reason: "z", Attempt: 3}, 3, "z"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			attempt, cause := tc.e.Shared()
			if attempt != tc.attempt || cause != tc.cause {
				t.Fatalf("Shared() = %d, %q; want %d, %q", attempt, cause, tc.attempt, tc.cause)
			}
			back := auditd.Event{Type: tc.e.Type}
			if err := back.SetShared(attempt, cause); err != nil || back != tc.e {
				t.Fatalf("SetShared(%d, %q) = %+v, %v; want %+v", attempt, cause, back, err, tc.e)
			}
			if err := tc.e.CheckShared(); err != nil {
				t.Fatalf("CheckShared: %v", err)
			}
		})
	}
	for _, e := range []auditd.Event{
		{Type: auditd.EventWait, Reason: "why"},
		{Type: auditd.EventItemFinished, Attempt: 2},
		{Type: auditd.EventResponse, Attempts: 2},
		{Type: auditd.EventResponse, Probe: true},
		{Type: auditd.EventShed, ErrorText: "x"},
		{Type: auditd.EventRegistrySnapshot, Cause: "429"},
		{Type: auditd.EventRegistryChanged, Snapshot: "run.end"},
		{Type: auditd.EventRunFinished, Head: "3"},
		{Type: auditd.EventItemFinished, Gate: "rate"},
	} {
		if err := e.CheckShared(); auditd.ErrorCode(err) != auditd.EINVALID {
			t.Errorf("CheckShared(%+v) = %v, want EINVALID", e, err)
		}
	}
	d := auditd.Event{Type: auditd.EventDispatch}
	if err := d.SetShared(1, "not a probe"); auditd.ErrorCode(err) != auditd.EINVALID {
		t.Errorf("a dispatch took the cause %q: %v", "not a probe", err)
	}
}
