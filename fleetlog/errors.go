package fleetlog

import "errors"

var (
	// ErrFork means a node posted a checkpoint of the size of its last
	// accepted one with another root.
	ErrFork = errors.New("node checkpoint forks")
	// ErrRollback means a node posted a checkpoint smaller than its last
	// accepted one.
	ErrRollback = errors.New("node checkpoint rolls back")
	// ErrInconsistent means a node's larger checkpoint came with no
	// consistency proof from its last accepted one that holds.
	ErrInconsistent = errors.New("node checkpoint not consistent")
	// ErrBadCheckpoint means a posted checkpoint is not signed by the node's
	// key or does not parse.
	ErrBadCheckpoint = errors.New("bad node checkpoint")
	// ErrKeyMismatch means a node posted under another key than its first.
	ErrKeyMismatch = errors.New("node key changed")
	// ErrBadLeaf means a fleet leaf does not parse.
	ErrBadLeaf = errors.New("bad fleet leaf")
	// ErrCorrupt means the log's state in etcd does not hold together.
	ErrCorrupt = errors.New("fleet log state corrupt")
)
