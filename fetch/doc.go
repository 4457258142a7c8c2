// Package fetch is auditd's outbound fetch loop: the only code that talks to
// upstream servers. It owns runs and items (stored in the shared bbolt file),
// the workers that carry them out, retries, payload staging and the fallback
// to the last good copy.
//
// For every request it asks the gates (limiter) for admission, appends a
// dispatch event to the ledger and waits until that is durable, and only
// then sends. Every response, throttle, wait, transport error, breaker
// transition and registry change is appended as it happens, in the order
// docs/EVENTS.md fixes, so reports can recount the run from the ledger alone.
//
// Invariants:
//   - A dispatch is durable before its request leaves the process.
//   - Each dispatch has exactly one outcome event (response, throttle,
//     transport.error, or dispatch.interrupted when found on resume).
//   - Every item ends with exactly one item.finished; every run reaches a
//     terminal status. One source being down never holds the others back.
//   - Secret request headers are added at send time and never recorded;
//     credential query parameters are redacted before anything is recorded.
package fetch
