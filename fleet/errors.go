package fleet

import "errors"

var (
	// ErrInvalidBlock is a reservation of no slots or of a non-positive
	// interval.
	ErrInvalidBlock = errors.New("invalid block")
	// ErrCorrupt is a fleet key whose value is not a time: another writer
	// than auditd touched the prefix.
	ErrCorrupt = errors.New("corrupt fleet key")
	// ErrInvalidRate is a rate whose limit or window is not positive, or
	// whose window is longer than MaxWindow.
	ErrInvalidRate = errors.New("invalid rate")
	// ErrCostExceedsGrace is a cost whose slots span more than the grace a
	// slot is good for after its time, so it could never be taken at once.
	ErrCostExceedsGrace = errors.New("cost exceeds the slots' grace")
)
