// Package auditd holds the domain types that auditd's packages share:
// events (event.go), runs, items and their results, the views of them the
// API reads (run.go), a run's counters (counts.go), sources and outcomes,
// the small interfaces between packages (Appender, EventReader, Future),
// and the one error type the API maps to HTTP statuses.
//
// Each type is defined once, here, and passed: the fetch loop counts a
// run's events into a Counts, the runs store keeps it, the API renders it,
// and reports compares it with a recount of its own (R7).
//
// It imports neither echo nor bbolt. Adapters live in packages named for what
// they provide: ledger (the append-only store), runs (runs and items),
// registry (learned limits), limiter (the gates), fetch (the outbound loop),
// staging (payloads), reports, api and web.
package auditd
