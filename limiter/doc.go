// Package limiter owns the gates every outbound request passes before it
// leaves auditd: a source's own retry backoff, its circuit breaker, its
// concurrency slots, and the pause and rate gates of its Budget, which the
// members of a gateway group share. It is pure logic on an injectable
// clock.Clock (timers included): no HTTP, no bbolt.
//
// Per request the fetch loop calls Acquire (blocking, with a deadline),
// records the dispatch, calls Permit.Sent with the record's time, sends the
// request, and calls Permit.Observe with the result. Both return
// everything they decided (gate, planned and actual waits, shed, probe,
// Retry-After as sent and as parsed, clamp, backoff, breaker transitions) so
// that the ledger records decisions verbatim instead of re-deriving them.
//
// Invariants:
//   - Strict ceiling: a Budget never admits more than Limit cost units in any
//     window of length Window (a sliding log, not fixed buckets), whatever
//     the burst, the pacing or a retune. A request counts from its
//     admission until Permit.Sent moves it to its dispatch record's time,
//     so no window of recorded dispatches holds more either, as long as
//     each record lags its admission by less than Window. A longer lag (a
//     disk that refuses writes for a window, with more requests in flight
//     than the limit) can put more records into one window: the request
//     counted at its admission has left the window by then, and its slot
//     was given again.
//   - Pacing: admissions also pass a token bucket (capacity Burst, refill
//     Rate, by default Limit/Window), kept in GCRA form so reads refill it.
//     The window, the bucket's rate and its capacity are independent: the
//     strictest holds at every instant, and Burst may exceed Limit.
//   - Costs: a request spends Cost units of every gate (the records it
//     carries). A learned limit counts requests or cost units, as the
//     budget is configured (CountRequests), and paces with a bucket of
//     its own in the same units. Permit.Refund takes an admission's cost
//     back out of the ceiling and the buckets when the upstream refused
//     it (counted none of its records) and a retry is charged instead: the
//     ceiling then holds over the records the upstream may have taken,
//     while the refused request's dispatch stays on record and counted
//     wherever requests are counted.
//   - No request is admitted before its slot, and Budget.Allow's RetryAfter
//     is exact: with no other traffic the cost is admitted at now+RetryAfter
//     and not a nanosecond earlier.
//   - A cost above the window's Limit or the bucket's Burst is a
//     *CostError naming that bound, at once, never a hang. A cost above a
//     learned limit (which a cut can bring under a cost already accepted)
//     is admitted alone in the learned window, at the learned pace.
//   - Learned limits (SetLimit) and server Remaining/Reset only slow a
//     budget; the configured ceiling stays in force beside them.
//   - Pauses only lengthen (Pause takes the later deadline).
//   - A budget with a Shared attached (Share: a fleet's slots) admits only
//     when the Shared also hands the request a slot, at the head of the
//     budget's queue (GateFleet), and sets the permit's SendBy from the
//     Shared's Lag; without one it admits as before.
//   - Configure again keeps a source's admissions, owed tokens and pause:
//     the same budget when its limits are unchanged, carried into the new
//     one when they change.
//   - Only 5xx and transport failures move a breaker; a 429, or a plain 503
//     the caller knows to be a refusal (Outcome.Refused), pauses instead.
//     Failures reset only on a success; transitions are closed→open,
//     open→half_open, half_open→closed and half_open→open, each reported.
//     Each failed probe doubles the cooldown, up to BreakerBackoff times
//     the first: the end of an outage is seen within one cooldown of it,
//     and a long one costs a probe a cooldown. Request.DownFor bounds an
//     outage by its length from the breaker's first opening, not by the
//     number of probes that failed, so that short cooldowns do not end
//     requests sooner. The count of probes in flight
//     lives across transitions: a probe still in flight from an earlier
//     half-open counts against BreakerProbes.
//   - The breaker's clock moves whoever asks: every Acquire moves an open
//     breaker whose cooldown has passed to half-open, a request with a
//     Fallback included, so a source is probed again however its callers
//     answer while it is down.
//   - A permit's concurrency slot is returned exactly once, by Observe or
//     Release; Acquire returns none on shed, error or cancellation.
//   - Waiters are admitted in arrival order at every gate: a source's
//     concurrency slots go to the request that reached the gate first,
//     and a budget's queue (pause and rate, shared by a group's members)
//     keeps the same order, a request keeping its place when it has to go
//     back through the gates. So a request is shed at its deadline only
//     when those ahead of it could not be admitted either.
//
// Caveats: time arithmetic uses differences of Clock.Now, which carry the
// monotonic reading on the real clock; Permit.Sent's time, a ledger stamp
// in wall time, is read as its lag after the admission, taken as no less
// than zero and no later than now. A Budget's sliding log holds one entry
// per distinct instant an admission is counted at inside the window (some
// of cost zero, left by Permit.Sent), so its memory grows with Limit (24
// bytes an entry: the instant, the cost and the requests).
package limiter
