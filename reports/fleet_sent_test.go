package reports_test

import (
	"fmt"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// The fleet's limit checks leave out a dispatch closed as not sent, and
// only that one: not one closed by an outcome, nor one interrupted by a
// restart (which may have been sent), nor another attempt of its request.
func TestSentScanLeavesOutNotSent(t *testing.T) {
	d := func(item string, attempt uint32) auditd.Event {
		return auditd.Event{Type: auditd.EventDispatch, RunID: "r", SourceID: "s", ItemKey: item, Attempt: attempt}
	}
	closed := func(typ auditd.EventType, item string, attempt uint32, reason string) auditd.Event {
		return auditd.Event{Type: typ, RunID: "r", SourceID: "s", ItemKey: item, Attempt: attempt, Reason: reason}
	}
	events := []auditd.Event{
		d("a", 1), d("b", 1),
		closed(auditd.EventInterrupted, "a", 1, auditd.NotSentPrefix+": its fleet slot passed while its record committed"),
		d("a", 2), closed(auditd.EventResponse, "b", 1, ""), closed(auditd.EventResponse, "a", 2, ""),
		d("c", 1), closed(auditd.EventInterrupted, "c", 1, "no outcome recorded before the restart"),
		d("e", 1), closed(auditd.EventInterrupted, "e", 1, auditd.NotSentPrefix+": its record was durable only after the request's deadline"),
	}
	var s reports.SentScan
	var ds []string
	for i := range events {
		e := &events[i]
		s.See(e)
		if e.Type == auditd.EventDispatch {
			ds = append(ds, fmt.Sprintf("%s%d", e.ItemKey, e.Attempt))
		}
	}
	if got := fmt.Sprint(reports.Sent(ds, &s)); got != "[b1 a2 c1]" {
		t.Fatalf("sent %s, want [b1 a2 c1]", got)
	}
}
