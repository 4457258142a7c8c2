package pack

import (
	"encoding/json"
	"time"

	"github.com/auditd/auditd"
)

// reservedDetail is the Detail of a fleet.reserved ledger event
// (docs/EVENTS.md).
type reservedDetail struct {
	Revision int64      `json:"revision"`
	First    *time.Time `json:"first"`
	Interval string     `json:"interval"`
	Count    int64      `json:"count"`
}

// ReservedBlock reads a fleet.reserved ledger event as the block of slots
// it records, keyed by its gateway group or else its source; ok is false
// for any other event, or one that does not parse.
func ReservedBlock(e *auditd.Event) (b FleetBlock, ok bool) {
	if e.Type != auditd.EventFleetReserved {
		return FleetBlock{}, false
	}
	var d reservedDetail
	if err := json.Unmarshal([]byte(e.Detail), &d); err != nil || d.First == nil {
		return FleetBlock{}, false
	}
	iv, err := time.ParseDuration(d.Interval)
	if err != nil {
		return FleetBlock{}, false
	}
	key := e.Group
	if key == "" {
		key = e.SourceID
	}
	return FleetBlock{Source: key, First: d.First.UnixNano(), Interval: int64(iv), Count: d.Count, Revision: d.Revision}, true
}
