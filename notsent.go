package auditd

import "strings"

// NotSentPrefix begins the Reason of a dispatch.interrupted that closes a
// dispatch whose request was never sent: on record, but the upstream never
// saw it (docs/EVENTS.md).
const NotSentPrefix = "not sent"

// NotSent reports whether e is a dispatch.interrupted that closes a
// dispatch whose request was never sent.
func NotSent(e *Event) bool {
	return e.Type == EventInterrupted && strings.HasPrefix(e.Reason, NotSentPrefix)
}
