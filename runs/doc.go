// Package runs owns runs and their items in the shared bbolt file: the
// stored records and their encoding, the live state of the runs the fetch
// loop is working on, the views the API reads, idempotency keys, and
// acknowledgements.
//
// Reading order: store.go (Store, Create, AddItems, End, Acknowledge),
// live.go (a run being worked on), pages.go (how a run's items and results
// are stored as they come), view.go (what the API reads, idempotency),
// records.go (the binary encoding, and the chunked layout of earlier
// builds).
//
// The ledger is the truth; what this package keeps is a view of it. A
// run's record is stored when it is submitted and again as it starts and
// ends; its counters (auditd.Counts) are counted by the fetch loop from the
// run's events once they are durable, and kept live (Live) until the end.
// A run's items are stored as they come: a batch run's with its submit,
// or a page at a time while it is open (AddItems), a proxy-mode run's each
// in the ledger's commit of its item.queued (Live.QueuedPuts). Each item's
// result is stored in the ledger's commit of its item.finished
// (ResultPut). So a run's size costs disk, not memory: the fetch loop
// reads a run's items back a chunk at a time (Todo), and every view pages
// by cursor at the same cost anywhere in the run. A crash before a run's
// end is stored leaves the run unfinished here, and the fetch loop
// recounts it from the ledger when it resumes it.
//
// Invariants:
//   - A run is stored whole or not at all: record, items (its first page,
//     for an open run) and idempotency key in one transaction; each later
//     page whole or not at all.
//   - An item is in a run once: a page repeating a key the run has is
//     refused whole.
//   - An item's result is stored exactly when its item.finished is.
//   - An idempotency key names one run; a second submit with the key and
//     the same contents gets that run, with other contents a conflict.
//   - Acknowledgements of a run are serialised, with each other and with
//     the store of its end: each counts once, in the live run or in the
//     stored record.
//   - The buckets keep the fetch.* names of the package that owned them
//     first, and runs stored in the layouts of earlier builds (fixed
//     chunks written at the end, or one JSON entry per item and result)
//     are still read, and resumed.
package runs
