// Package hints reads what an upstream server says about its own limits from
// the headers of one response: Retry-After, the X-RateLimit-* family, and the
// IETF RateLimit-Policy / RateLimit fields (with the older RateLimit-Limit /
// -Remaining / -Reset draft form).
//
// Parse turns an http.Header and the response's receipt time into one Hint
// value. It owns no state and reads no clock: every relative quantity is
// measured against the response's own Date header when one is present (so a
// server whose clock is skewed against ours still gets its intended delay),
// and against the receipt time otherwise.
//
// Invariants:
//   - Parsing never panics and never invents a value: a header that is absent
//     or malformed leaves its Has... flag false (and, when present but
//     malformed, sets its bit in Hint.Invalid). Garbage is "no hint", never 0.
//   - Durations are floored at zero; an HTTP-date in the past means "now".
//   - Parse allocates nothing on the heap for the header shapes seen in the
//     wild, and takes well under a microsecond (see hints_bench_test.go).
//
// What a hint is allowed to do (only slow a source down, never raise it above
// its configured ceiling; clamp Retry-After to a per-source cap) is decided by
// the limiter and the registry, not here.
package hints
