// Package api is auditd's REST API: openapi.yaml (the contract, embedded and
// served at /openapi.yaml) and the echo server that implements it.
//
// Routes are registered in one function per resource (sources.go, runs.go,
// items.go, events.go, reports.go, ledger.go, tokens.go); handlers parse,
// call a dependency, and render. Dependencies are the small interfaces of
// deps.go, wired in cmd/auditd: runs.Store (with the fetch loop's Submit and
// Cancel) for Runs, reports.Service for Reports, and adapters in cmd/auditd
// for Sources, Integrity and Packs (package pack's builder on the serving
// ledger).
//
// Invariants:
//
//   - Every error reaches the client as application/problem+json (RFC 9457)
//     from one place, Server.handleError, which alone maps error codes to
//     statuses. Errors that are the server's fault are logged there, once,
//     and the client sees a generic message with the request id.
//   - Bad input of any kind (malformed JSON, unknown fields, wrong types,
//     nulls, empty query values, oversized bodies, bad cursors) is a 4xx,
//     and is refused before any dependency is called with it: a rejected
//     request writes nothing. Identifiers are printable ASCII without a
//     leading or trailing space (package validation, whose rules the
//     registry checks sources with too); a source's own rules, what the
//     limiter would refuse among them, are the registry's, checked in
//     Registry.Put before anything is stored or recorded.
//   - On the proxy route every answer says whose it is (Auditd-Answer):
//     auditd's own are problems, the upstream's pass through untouched
//     and may carry any status; an upstream's Auditd-* headers are dropped.
//   - Admission: every authenticated request is charged to its token's
//     Budget before it does work; a run costs one more unit per item, and a
//     retry with the same Idempotency-Key is answered from the first run
//     without a second charge (the same key with other contents is a 409). Over budget is a 429 whose Retry-After is the
//     time until the same request will be admitted. Failed authentications
//     are charged to the client address; an address out of budget is refused
//     before its token is even checked.
//   - Every export (reconciliation in any format, evidence workbooks and
//     packs) appends an export.downloaded event naming the token before
//     the first byte leaves; token and source changes are recorded by their owners
//     (auth.Store, the registry) as token.changed and source.changed.
//
// Caveats: MemoryBudget lives in memory, so a restart refills every budget,
// and client addresses are the TCP peer (X-Forwarded-For is not trusted); a
// proxy in front makes every client one address. Streamed responses (NDJSON,
// exports) that fail after their first byte cannot become a problem: the
// connection is cut and the error logged.
package api
