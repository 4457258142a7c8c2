// Package registry owns what auditd knows about each upstream source: the
// operator's configuration (auditd.Source), its secret request headers, and
// the limit and window learned from the source's responses. It persists all
// of it in the shared bbolt file, under the top-level bucket "registry"
// (nested buckets "sources", "secrets", "learned" and "groups"), and records
// every change in the ledger.
//
// The fetch loop uses it in three places: Limits when it builds a source's
// gates, Observe after every response (the returned Decision says whether to
// retune the limiter, and to what, or to pause), and StartRun/EndRun around
// each run, which append a registry.snapshot of every source the run uses.
//
// # Learning
//
// An unknown source starts conservative (Options.DefaultLimit per
// Options.DefaultWindow, 15 a minute) and learns from what it is told:
//
//   - A refusal (429, any 503, since nginx limit_req answers a plain 503)
//     multiplies the limit by Options.Decrease and remembers the limit that
//     was refused. Refusals of requests sent before that cut do not cut
//     again: they were paced at the old limit.
//   - A sustained run of successes (at least Options.ProbeAfter of them,
//     spanning a whole window, sent at Options.ProbeUtilization of the limit
//     or more) adds a step. Below the limit last refused the step is half the
//     distance to it, and just below it the limit holds for
//     Options.ProbeHold runs before trying it again; above it (or before any
//     refusal) the step starts at Options.ProbeStep and doubles while probes
//     stay clean, so an unknown source finds its ceiling in a handful of
//     windows instead of hundreds. A limit that was never used is never
//     raised.
//   - An advertised quota (X-RateLimit-Limit/-Window, RateLimit-Policy q/w)
//     sets the limit when the advertisement changes, and caps probing from
//     then on. An unchanged advertisement does not undo a refusal's cut.
//   - Remaining 0 with a reset asks the caller to pause (Decision.Pause): for
//     one interval of the advertised quota when there is one (a bucket or a
//     sliding window frees a request long before it is whole again), else
//     until the reset. It never changes the learned limit: it only slows.
//
// Sources configured in one gateway group share a group entry with its own
// learned limit. A refusal seen by a second member of the group within one
// group window of another member's is correlated and cuts the group's limit;
// an isolated one cuts the member's own. The limiter paces a group with one
// budget, so Limits.Pace gives it the lower of the group's limit and the sum
// of its members' own limits. Successes of every member probe the group.
//
// # Invariants
//
//   - A learned rate never exceeds the source's configured ceiling
//     (auditd.Source.Limit per Window, or Options.DefaultCeiling), nor, for a
//     group, the highest ceiling among its members.
//   - Every change to a learned limit or window is appended to the ledger as
//     registry.changed before it is persisted here; when the append fails the
//     change is undone, so the ledger never shows less than the registry.
//   - An Observe that changes nothing takes no bbolt transaction and does not
//     allocate.
//   - Secret request headers live in their own bucket. They never appear in an
//     event, in GetSource or ListSources; RequestHeaders is the only way out.
//   - Nothing learned from one source moves another outside its group.
//
// # Caveats
//
// The registry never calls the ledger inside one of its own bbolt
// transactions (bbolt allows one writer), so a crash between the append and
// the persist leaves the ledger one change ahead of the stored state; the
// next change persists the whole entry again. The in-memory probe counters
// (the current run of successes, the last refusal's time) are not persisted:
// after a restart a source must show a fresh sustained run before it probes.
// A 503 during an outage also cuts the limit; probing restores it once the
// source answers again.
package registry
