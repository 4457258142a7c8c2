// Package telemetry owns what the service tells its operators while it
// runs: Prometheus metrics of the fetch loop, the gates and the ledger, and
// structured lifecycle logs.
//
// Both are read off the ledger's commits (ledger.Options.Observer): every
// dispatch, response, throttle, wait, breaker change, registry change, shed
// and item end is an event before it takes effect, so counting the events
// as they become durable counts exactly what the ledger holds, with no
// hook in the fetch loop. What is a state rather than an event (a breaker's
// state, the pace in force, a pause's remaining time, requests in flight)
// is read from the registry and the limiter when Prometheus scrapes.
//
// Label sets are bounded: source and group ids (configured), status
// classes, gates, outcomes; never item keys, paths or run ids. Metric names
// follow Prometheus conventions (auditd_ prefix, _total counters, base
// units: seconds, requests per second).
//
// Logs: a run's start and end (with its counts and whether it reconciles),
// breaker transitions, refusals with the wait honoured, learned-limit
// changes and sheds, at Info (sheds and breaker openings at Warn). Nothing
// per dispatch. Events hold no secrets (they are redacted before they are
// recorded), and the logs carry only ids, statuses and durations from them.
//
// The Observer runs on the ledger's writer goroutine: it only counts and
// hands lines to the logger, and the one slow thing (a finished run's
// reconciliation) happens on a goroutine of its own.
package telemetry
