package auditd

import "errors"

// Retention events (2 CFR 200.334): an award's retention date, legal holds
// on it, and the staged payloads purged once both allow. They carry no
// RunID: they belong to an award, which Detail names. docs/EVENTS.md says
// what each carries.
const (
	EventRetentionSet  EventType = "retention.set"  // Principal, Detail: {"award","final_report","retain_until"}
	EventHoldPlaced    EventType = "hold.placed"    // Principal, Cause (the reason), Detail: {"award","hold"}
	EventHoldReleased  EventType = "hold.released"  // Principal, Cause (the reason), Detail: {"award","hold"}
	EventPayloadPurged EventType = "payload.purged" // Principal, Bytes, Detail: {"award","run","payloads":[hashes]}
)

// ErrPurged means a staged payload was purged under retention: its bytes
// are gone, and the hash the ledger recorded for them stands.
var ErrPurged = errors.New("payload purged under retention")
