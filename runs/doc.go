// Package runs owns runs and their items in the shared bbolt file: the
// stored records and their encoding, the live state of the runs the fetch
// loop is working on, the views the API reads, idempotency keys, and
// acknowledgements.
//
// Reading order: store.go (Store, Create, End, Acknowledge), live.go (a
// run being worked on), view.go (what the API reads, idempotency),
// records.go (the chunked encoding of items and results).
//
// The ledger is the truth; what this package keeps is a view of it. A
// run's record is stored when it is submitted and again as it starts and
// ends; its counters (auditd.Counts) are counted by the fetch loop from the
// run's events once they are durable, and kept live (Live) until the end.
// Item results are kept with the live run and stored, all of them in one
// transaction with the run's terminal record, when it ends (Store.End). A
// crash before that leaves the run unfinished here, and the fetch loop
// rebuilds it from the ledger when it resumes it.
//
// Invariants:
//   - A run is stored whole or not at all: record, items and idempotency
//     key in one transaction.
//   - An idempotency key names one run; a second submit with the key and
//     the same contents gets that run, with other contents a conflict.
//   - Acknowledgements of a run are serialised, with each other and with
//     the store of its end: each counts once, in the live run or in the
//     stored record.
//   - The buckets keep the fetch.* names of the package that owned them
//     first, and runs stored in the encodings of earlier builds (one JSON
//     entry per item and result) are still read.
package runs
