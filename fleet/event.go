package fleet

import "time"

// EventKind names what a node acted on.
type EventKind string

// Event kinds.
const (
	// EventReserved: a block was granted to this node (Block).
	EventReserved EventKind = "reserved"
	// EventPaused: a pause, this node's or learned from another's,
	// lengthened the pause this node keeps (Pause).
	EventPaused EventKind = "paused"
	// EventCutOff: a reservation failed; the node hands out what it holds,
	// then nothing (Err).
	EventCutOff EventKind = "cut_off"
	// EventRejoined: a reservation succeeded again after a cut-off.
	EventRejoined EventKind = "rejoined"
	// EventLearned: the key's learned limit changed, and this node's next
	// blocks are reserved at it (Limit).
	EventLearned EventKind = "learned"
)

// Event is one thing a node's Slots acted on, for the node's ledger: each
// grant and pause carries the etcd revision it was written at, so the
// fleet's grants can be shown disjoint afterwards.
type Event struct {
	Kind EventKind
	Key  string
	At   time.Time // the node's clock when it acted
	// Block is the grant of EventReserved.
	Block Block
	// Pause is the pause of EventPaused.
	Pause Pause
	// Limit is the learned limit of EventLearned.
	Limit Limit
	// Err is why etcd did not answer (EventCutOff).
	Err error
}
