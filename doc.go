// Package auditd holds the domain types that auditd's packages share: events,
// runs, items, sources and outcomes, the small interfaces between packages,
// and the one error type the API maps to HTTP statuses.
//
// It imports neither echo nor bbolt. Adapters live in packages named for what
// they provide: ledger (the append-only store), registry (learned limits),
// limiter (the gates), fetch (the outbound loop), reports, api and web.
package auditd
