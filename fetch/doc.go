// Package fetch is auditd's outbound fetch loop: the only code that talks to
// upstream servers. It owns the workers that carry runs out, retries,
// payload staging and the fallback to the last good copy; the runs
// themselves, their items, counters and views are the runs package's, which
// the loop hands each run's durable events to.
//
// For every request it asks the gates (limiter) for admission, appends a
// dispatch event to the ledger and waits until that is durable, and only
// then sends. Every response, throttle, wait, transport error, breaker
// transition and registry change is appended as it happens, in the order
// docs/EVENTS.md fixes, so reports can recount the run from the ledger alone.
//
// It carries two kinds of run. A batch run's items are submitted up front
// and fetched by the loop's workers. A proxy-mode run's items are the
// requests a pipeline sends through the proxy route (Loop.Proxy): each
// passes the same gates and is recorded the same way, and its answer is
// streamed to the client while it is staged; a text answer has the
// source's own URLs rewritten to point at the proxy (rewrite.go). Both ask
// the gates through one step, gates.admit, which moves the breaker's clock
// alike for every caller and tells a request with a last good copy at once
// when its source is down.
//
// Both kinds share one lifecycle: admit (the gates), dispatch (durable
// first), send, settle (record the outcome, learn from it), then retry,
// end, or answer from the last good copy. What differs is a small policy,
// itemEnds (lifecycle.go): where a request's records go and what its final
// failure means. Both post the records of what the gates did, ahead of the
// dispatch. A batch item's (batchEnds) falls back on any copy that
// verifies; a proxied request's (proxied) posts its item.queued first and
// falls back only when its source serves stale copies.
//
// A batch item's page is tried up to its source's max_attempts, but a
// refusal that shows only a window or quota spent (registry.Decision.Spent:
// an episode's refusals after its first, a 429 with Remaining 0 and a
// Reset; or a Retry-After the gates honour) spends none of them: the page
// waits for the window as the gates say, each refusal recorded as a
// throttle like any other. Refusals of that kind that last RefusalBound
// end the page, with a reason naming them. On resume the throttles an
// earlier life recorded spend none either (the registry's episodes are not
// kept across a restart).
//
// The Loop keeps runs and their workers. Three parts of it are types of
// their own, embedded in it: recorder (recorder.go: the ledger's records
// and the send locks that order them), copies (copies.go: last good
// copies) and gates (sources.go: the limiter set from the registry).
//
// Reading order for a newcomer: loop.go (Config, Start, Close), submit.go,
// run.go (workers per source, finishing a run), item.go (one item: pages,
// attempts, settling), lifecycle.go, admit.go, recorder.go, copies.go,
// resume.go, then proxy.go, proxy_exchange.go and proxy_run.go (proxy
// mode), and the small files: paging, classify (status and body-level
// errors, redaction), rewrite, sources, client.
//
// The ledger is the truth: run records and item results in bbolt are views
// for the API. On resume the loop recounts a run from its events, records
// dispatches without an outcome as interrupted, and continues; an item the
// ledger does not show finished is fetched again. Before any worker starts,
// the gates are given every dispatch and throttle the ledger holds from the
// longest window back, whatever run made it: a restart never sends a
// window's quota a second time.
//
// Invariants:
//   - A dispatch is durable before its request leaves the process; one on
//     a fleet slot leaves only if that, and the transport's first write of
//     it (the wire gate, client.go), were within the fleet's lag of its
//     slot (limiter.Permit.SendBy), else it is closed as not sent and the
//     request takes a new slot.
//   - Each dispatch has exactly one outcome event (response, throttle,
//     transport.error, or dispatch.interrupted when found on resume or
//     when its request was not sent).
//   - Every item ends with exactly one item.finished; every run reaches a
//     terminal status. One source being down never holds the others back.
//   - Secret request headers are added at send time and never recorded.
//     Credential query parameters (package redact: the built-in names and
//     the source's secret_query) are redacted once, in Submit, before the
//     run is stored: Item.Path is the redacted path everything else sees,
//     Item.SendPath the path as sent, which the run store keeps sealed
//     until the run ends. Error texts are built from redacted URLs
//     (scrubError), and a redirect's Location is recorded redacted.
//   - Every request on the wire is its own dispatch: the client follows no
//     redirect (a 3xx is the outcome; the item fails), and the transport's
//     request bodies cannot be replayed on a stale connection.
//   - Connections go only to addresses the AddrPolicy allows, checked on
//     the dialled address (net.Dialer.Control), so DNS cannot rebind past
//     it; a refusal is a transport.error and is not retried.
package fetch
