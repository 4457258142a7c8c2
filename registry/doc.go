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
// Options.DefaultWindow, 15 a minute) and learns the pace the server
// tolerates from what it answers, fast enough that a refresh finishes inside
// its window:
//
//   - Slow start: each clean round (Options.StartRound successes, or as many
//     as the pace sends in a second if more, sent at
//     Options.ProbeUtilization of the pace or more) multiplies the pace by
//     Options.Growth, until the first refusal or a Remaining of 0. At a
//     second or more a request, the success before a round's first opens
//     it (sent at the pace before, it still shows whether the pace was
//     used), so a doubling takes one interval rather than StartRound: from
//     15 a minute it reaches 16 a second in about 10 seconds. A round of at least
//     a second keeps a gateway's burst from hiding a pace many times its
//     rate before the first refusal.
//   - A refusal (a 429, a 503 with Retry-After, a plain 503 taken for one;
//     see below) ends slow start at the pace of the last clean round. After
//     that it cuts to Options.Decrease times what the server was found to
//     admit: the lower of the pace the refused request was sent at and, when
//     the server admitted less than the pace in force since the last cut
//     (refusing or making the source wait), the rate of its successes since
//     then, less the waits it asked for (auditd's own drain pause, and the
//     first second or two intervals of a Retry-After, stay in: from one
//     refusal to the next a bucket goes from full to full, so what it
//     admitted in between, two seconds or more of it, is its rate). Within
//     ten seconds of the cut, the pace in force it is held against leaves
//     auditd's own drain pauses out: a second of nothing sent in a short
//     spell does not by itself show the server behind (a window loses
//     what a pause leaves unused, and a cut under the pace it admits
//     holds the source there until probes find it).
//     Recovery heads a step past what was admitted only when that was
//     measured over ten seconds or more since the last cut: over less, a
//     window still full of a faster pace (a limit that just dropped)
//     blurs it, and recovery heads back toward the pace refused, the next
//     cut measuring again. A refusal of a request sent before
//     the last cut, or within a second (two intervals of the pace) after it,
//     does not cut again. Drops: a refusal after a cut, with refusals
//     since it (and no waits the server asked for), measures what the
//     server admitted since the refusal before it (a window that still held
//     the faster pace at the cut has drained since); so does one before a
//     round proved the pace of the last cut, since the cut. When the server
//     admitted less than nine tenths of the pace, the cut goes to
//     1-ProbeGain times that, and recovery heads no further than 1.3 times
//     it (what a window held of the old pace blurs a short spell low);
//     without enough successes to measure, a refusal before a round proved
//     the pace halves it. After the cut that ends slow start, or a refused
//     probe, a refusal before a round proved the pace is no drop when the
//     server admitted more than 1/Growth of the pace meanwhile: slow
//     start's overshoot or the probe still fills the server's window (and
//     the drain pause, a second of nothing sent, blurs a short spell low),
//     so the pace, proven clean before, is at the limit (in real time, a
//     request that met the server early), and the cut is Decrease times
//     it. For a minute after such a cut, the rate refused
//     that a later cut takes from ten seconds or more of successes is never
//     below the pace a round proved since its cut (auditd's own pauses blur
//     what was admitted low), and a refusal of a recovery step above that
//     proven pace goes back to the proven one with the step's pace for the
//     rate refused, as a refused probe's would (what was admitted meanwhile
//     is the proven pace's, and says nothing of the limit), though as a
//     cut: recovery climbs back toward it. Refusals with no success between them are
//     one episode (a spent window refuses whatever the pace): only its
//     first cuts, lowers the rate last refused or doubles the probe hold. A
//     refusal that says nothing of when to come back (no Retry-After) also
//     pauses the source (Decision.Pause) for a second, or two intervals of
//     the new pace up to five seconds, while the server's bucket drains
//     (after a refused probe, half a second or two intervals: the probe
//     went a step past the server's rate, its window is a request or two
//     over, and at 8 a second a second's pause is eight requests lost);
//     each further refusal of the episode doubles that pause, up to four
//     times it or, longer, an eighth of the time the episode has lasted,
//     and a minute.
//   - Fixed windows: an episode of three refusals or more that ends in a
//     success refused whatever the pace until a boundary: a spent window.
//     From then on the source's refusals cut nothing; each episode's end
//     sets the pace to what the server admitted from the last boundary seen
//     to this one (boundaries taken at the middle of the last pause), the
//     window's quota spread evenly over its length (cause window_spent);
//     over several windows, the pace that spent the last one, spread over
//     the window. Boundaries are known only to within a pause: a window's
//     length within a fifth of a common one (1s, 1m, 10m...) is that one,
//     and one window spent then sets the pace to its successes over that
//     length. The first refusal of a later episode pauses until the next
//     boundary the last window's length and end predict, unless one was
//     due within half the last pause; a probe past the pace must hold a
//     whole window to count.
//   - Recovery and probing: each clean round of Options.ProbeAfter successes
//     (or as many as the pace sends in ten seconds, if fewer; and two
//     seconds of them at least, which a window that has just drained does
//     not hide in a burst) halves the
//     distance back toward the rate last refused (or a step above what was
//     admitted since the cut before, if lower), up to Options.ProbeGain below it, and a further
//     ProbeGain below for each refusal met on the way back up; there
//     the pace holds for Options.ProbeHold rounds, then probes
//     Options.ProbeGain past it. A probe must hold as long, and ten seconds,
//     to count (a gateway's burst hides a slightly fast pace for seconds).
//     A refused probe costs that one refusal: the pace goes back to the one
//     held clean before the probe (cause throttle, the probe's pace the rate
//     refused), holds there with no recovery past it, and the next probe
//     goes no further than the pace refused; the hold doubles, up to
//     Options.MaxHold rounds. Only a refusal of the pace held clean after
//     that cuts (by Decrease, unless it was a drop; above). A probe the ceiling blocks is none: a
//     refusal after it doubles nothing. Whatever the hold in rounds, a pace
//     holds no longer than 15 seconds (or 52 of its intervals, or two
//     windows of a spent window) before it probes, nor must a probe hold
//     longer to count: a probe refused every 52 requests at most is 1.9%
//     refused, under 2% for a source held at its limit by refused probes
//     with a request to spare where a count's span cuts a cycle. Once every probe for five minutes has been refused, the
//     limit is stable and that bound doubles.
//   - Rising limits: after two probes in a row have held, or one at the
//     pace the probe before it was refused at (a pace the server refused
//     now passes), with nothing
//     refused for as long as a hold may last, the limit has risen: slow
//     start resumes from the last clean pace, within the ceiling. Its first
//     refusal cuts back to the pace of its last clean round (the pace
//     before the round refused, when the ceiling made that round less than
//     a doubling), and takes the limit for a step above that pace rather
//     than near the one refused.
//   - An advertised quota (RateLimit-Policy q and w, X-RateLimit-Limit and
//     -Window) sets the pace and caps it. A limit advertised without a window
//     learns its window from the longest Reset seen, rounded up to a common
//     window length. When the Reset counts down (two readings two seconds or
//     more apart that differ by the time between them), it is a window's,
//     and its quota spread evenly over it caps the pace as an advertised one
//     does: a window never resets later than its length, so that is never
//     more than the server allows. When Remaining has gone above the limit
//     (a bucket whose Reset is its time to refill whole), or the Reset does
//     not count down (a constant, a bucket's refill time), the quota only
//     seeds slow start; with no Reset at all, a minute
//     (Options.AssumedWindow) is assumed. The event says which
//     (window_from: advertised, reset, bucket, static, assumed).
//   - Remaining 0 with a reset asks the caller to pause (Decision.Pause): on
//     a success, for one interval of the advertised quota when there is
//     one, else until the reset; on a refusal without Retry-After, until the
//     reset, the first-class hint then. In slow start it also ends slow
//     start, as a refusal would. Under a quota that caps the pace, such a
//     refusal cuts nothing: the window is spent, the pace was not refused.
//     After slow start, a success that leaves nothing of a quota that does
//     not cap the pace (a bucket's), at a pace well above the source's
//     successes of the last ten seconds, brings the pace down to that rate
//     (cause header): the pauses Remaining 0 asks for hold the source
//     there anyway, and the pace shown is the pace sent.
//
// # Concurrency
//
// A source's requests in flight are learned too, from
// Observation.InFlight (the requests admitted and not yet answered when
// this one was, itself included; limiter.Permit.InFlight): a server that refuses beyond N in flight answers every
// request sent with N or fewer and refuses the others, whatever the pace.
// A refusal sent with two or more in flight, more than any success sent
// in the last minute (and there was one: an outage's 503s refuse at any
// number), is such a refusal: it cuts the slots to the lower of
// one below the number refused and 0.9 times the slots (AIMD, as
// Netflix's concurrency-limits backs off), and teaches the pace nothing;
// one sent under more slots than there are now cuts nothing more. A
// refusal with no more in flight than a success is the pace's. A round of
// successes with every slot in use (as many as there are slots) adds one
// slot, up to the number refused; that one is probed after 30 seconds
// (doubling with each refused probe, up to 8 minutes), and a success with
// that many in flight forgets the refusal. A refusal sent with the probe's
// slot in use is the probe's, whatever a success before it showed: the
// count in flight is the client's, which still holds answers the server
// has counted out, so a success may come with one more than it takes. A source starts with the
// concurrency the operator configured, which is a ceiling never exceeded,
// else with the limiter's default, a start that grows up to
// MaxConcurrency. Each move is a registry.changed of cause concurrency
// (Detail old_concurrency and concurrency; the limit and window stay);
// Decision.ConcurrencyChanged asks the caller to set the limiter's slots
// (limiter.SetConcurrency), State.Concurrency shows them, and a
// registry.snapshot names them when learning moved them from the start.
//
// Slots bind a source's sends at what they let through: the slots over the
// mean latency of its successes. A pace at 90% of that or more is not what
// holds the source back, and its rounds grow it no further (a probe of one
// slot more lets it grow into the probe). When the slots can grow no
// further (the ceiling, or one below a number refused) and a round of
// successes used every one, a pace more than 15% past what they let
// through comes down to 10% past it (so that neither its rounding nor a
// cut of 10% makes it bind much in their place): a registry.changed of cause
// slots, the slots left alone. So the pace shown (State, Limits, a snapshot) is the one the
// source is sent at, not slow start's last step past it.
//
// Learned paces are expressed over short windows (about 20 requests each,
// the advertised window when the server gave one), and the limiter counts a
// slower pace's window from the cut: so a cut never stalls a source for a
// minute behind the requests it sent at the faster pace.
//
// # Outage is not a limit
//
// A 5xx without Retry-After, a transport error and a plain 503 are the
// breaker's business and teach the pace nothing, with two exceptions for a
// plain 503, which nginx limit_req answers for a refusal: Refusal takes one
// for a refusal when the request left within 30 seconds of a rise in the
// pace with the source answering successes just before; and a plain 503
// between successes (at most two in a row) is a refusal once the next
// success shows the server up. Failures for ten seconds in a row, and at
// least the source's breaker threshold of them, make the source down:
// plain 503s are then never refusals until it answers a success, and any
// cut a plain 503 made at the start of the outage is undone (cause
// "outage"), so the source resumes at the pace it had learned before, and
// probes as soon as it did before (the 503s do not count as refused probes).
// What it admits is measured again from its first success after the
// outage: the backlog that meets a source as it comes back is refused in a
// burst, and a rate averaged across the outage would cut its pace to a
// fraction of what it takes.
//
// A state stored before learning had phases has none: it starts over in slow
// start from the limit it has, forgetting the limit last refused, so a
// source an outage cut to a crawl under the old rules recovers on its own.
//
// # Groups
//
// Sources configured in one gateway group share a group entry with its own
// learned pace, and the limiter paces them with one budget, in whatever
// order their requests come: a refusal of any member acts on the group.
// Successes of every member count toward the group's rounds. Limits.Pace
// gives the lower of the group's limit and the sum of its members' own
// limits, which move only with what their own headers advertise, an
// operator's SetLimit, and slow start.
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
//   - Secret request headers live in their own bucket, sealed under
//     Options.Seal (package seal). They never appear in an event, in
//     GetSource or ListSources; RequestHeaders is the only way out, and
//     HeaderNames shows their names alone. Headers that do not open under
//     the key fail RequestHeaders until the source is put again.
//   - A base URL is http or https with a host and nothing secret in it
//     (checkBaseURL); of concurrent Puts of one new id, one creates it.
//   - Nothing learned from one source moves another outside its group.
//
// # Caveats
//
// The registry never calls the ledger inside one of its own bbolt
// transactions (bbolt allows one writer), so a crash between the append and
// the persist leaves the ledger one change ahead of the stored state; the
// next change persists the whole entry again. What learning keeps in memory
// (the current round, the recent successes, the time of the last cut and
// rise, the hold) is not persisted: after a restart a source must show a
// fresh round before its pace moves, and its first refusal is judged with
// no history to estimate from.
package registry
