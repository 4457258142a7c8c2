// Package fleet owns what several auditd nodes share through etcd so that
// together they send an upstream no more than one node may: per key (a
// source, or a gateway group) the budget, as time slots reserved in blocks,
// the pause, and the learned limit.
//
// Store is the etcd side. Per key it keeps two values under its prefix,
// budget/<key>/tat (the GCRA theoretical arrival time: where the next grant
// starts) and budget/<key>/pause (pause-until), each a decimal count of Unix
// nanoseconds; the arrival time is followed by the nodes sharing the key
// (encodeTat), a breaker's pause by its node. Reserve grants a block of
// slots by advancing the arrival time with a compare-and-swap on the key's
// ModRevision; Pause writes pause-until and pushes the arrival time past it
// in one transaction; Watch follows the pause.
//
// Slots is the node side of one key: it hands out the slots of the blocks
// it holds, with no etcd call on the way (Earliest, Take), while one
// goroutine reserves the next block before the held ones run out (once
// half the last is used) and another follows the key's pause. Notify
// reports every grant, pause, cut-off and rejoin the node acts on, with the
// etcd revision of grants and pauses, for the node's ledger.
//
// The learned limit of a key is the Store's too, under learn/<key>/:
// limit (the rate the slots are reserved at, the rate a refusal last cut it
// from, and who wrote it and why: a Cause*), spent (the last time a window
// was seen spent, Spent), obs/<node> (each node's cumulative outcomes,
// Report) and leader. Any node lowers the limit (Cut, by compare-and-swap;
// the rules at a refusal are the caller's: WindowRate, CutTo, TrimTo);
// only the key's Learner, elected among the nodes (concurrency.Election,
// on one session a node whatever its number of keys), raises it (Raise).
// A term that ends resigns, so that another node is elected at once; when Resign
// fails, the leader key is deleted all the same, guarded by its create
// revision and retried, since the node's session, which outlives the term,
// would otherwise keep it and no node could win the key. A node that stops
// calls Release, so that its keys' learning moves at once.
// docs/FLEET.md, "One learner per key", says what each rule is for.
//
// Invariants:
//   - A slot is granted once. Every grant is a compare-and-swap on the
//     key's revision, retried on conflict, so the fleet's blocks are
//     disjoint, each carries its own revision, and any two slots are at
//     least an interval apart. Nothing is given back: the unused slots of a
//     node that dies, is cut off or closes are wasted, never re-issued.
//   - No lease, TTL or election is involved in a grant: staying under the
//     limit does not depend on them (the learner's election only decides
//     who raises the limit).
//   - Grants need an etcd quorum (a linearizable transaction). Without one,
//     Reserve fails and grants nothing; a reservation whose answer was lost
//     may have been granted, and is then wasted.
//   - A node hands out only slots it holds. Cut off from etcd, it hands out
//     what it holds and then nothing (it never guesses), reports
//     EventCutOff, and reports EventRejoined at its first grant afterwards.
//   - The guard. A slot at t is handed out only while the node's clock
//     reads in [t, t+Grace); later it is wasted. Slots are spaced
//     Interval = (Window + Grace + MaxSkew) / Limit, rounded up. If no two
//     nodes' wall clocks differ by more than MaxSkew, the slots handed out
//     in any real-time window of length Window have times within an open
//     span of Window + Grace + MaxSkew = Limit intervals, so there are at
//     most Limit of them. The guard costs (Grace+MaxSkew)/(Window+Grace+
//     MaxSkew) of the rate: 3% of a one-second window with the defaults.
//     A rate set by SetRate (a learned one, often counted over a longer
//     window than the ceiling's, which spreads the guard thinner) is never
//     spaced closer than the ceiling's own Interval, nor than that of the
//     quota the upstream advertises when SetRate is given one: the told
//     ceiling and the advertised quota each hold in every window of its
//     length.
//   - Pauses only lengthen. A pause written pushes the arrival time to its
//     end in the same transaction, so no later grant holds a slot inside
//     it; a node that learns a pause drops its held slots before its end.
//     Slots.Pause adds MaxSkew to the end, so that a node whose clock runs
//     behind does not end it early.
//
// The time base: slot times are Unix nanoseconds of wall time. A grant
// starts at the stored arrival time or at the time the reserving node asks
// from, whichever is later; Slots asks from its now (clock.Clock.Now) plus
// its last reservation's round trip (at most Lead) less half the grace, so
// that a grant arrives with its first slot due and not past its grace.
// Every node compares slots with its own wall clock. MaxSkew is an
// assumption the operator states (the nodes keep NTP time), not something
// the package measures.
//
// Caveats:
//   - Pacing on wall time, unlike limiter's monotonic pacing: a node's wall
//     clock stepped by more than MaxSkew breaks the guard for its slots
//     until the step is undone.
//   - The guard holds for hand-out times. The lag from Take to the request
//     on the wire is the caller's, as in limiter.
//   - A node learns a pause by watch, tens of milliseconds after it is
//     written; until then, and for as long as it is cut off, it may hand out
//     held slots inside the pause: at most what it holds.
//   - Nodes must agree on a key's Rate: a block's interval is the
//     reserver's. A changed rate takes effect from each node's next block.
//     The quota an upstream advertises is each node's own (SetRate's
//     quota, what its answers carried): a node that has not seen it
//     spaces by the learned rate and the ceiling alone.
//   - No burst: slots are evenly spaced and idle time is not saved up.
//   - Block sizes follow demand: a node's first block is one slot; the next
//     is twice the last while the node uses at least half of what it asked
//     for, up to Block's worth of the rate; after a run that wasted slots it
//     is a quarter more than the run used, and at least half the last. At
//     full pace each busy node reserves about once per Block (etcd writes
//     per second per key: the busy nodes over Block), and a node whose
//     demand stops wastes at most what it holds plus one block.
//   - Busy nodes split a key evenly. A node counts as sharing a key until
//     ShareSpan after its last grant ends; while others share it, a grant
//     holds at most what their last grants left of Block's worth
//     (Ask.Full), and never less than Block's worth over the nodes
//     sharing, counted on the state the grant commits on. A node alone
//     keeps full blocks. A node whose last grant started after other
//     nodes' slots (later than it asked from, than its own last block's
//     end and than the pause), found busy (Slots.busy) by busyStreak
//     reservations in a row, asks for a full block where it would have
//     doubled; once a run of its spell of demand wasted slots it only
//     doubles. A node that joins a busy key waits for what the others hold
//     (up to about one and a half Blocks) and then grows to its share
//     within a few grants.
//   - When the next block is reserved: once the node has used two slots
//     since its last grant and half its last block's span (at least Lead)
//     is left before its last held slot, or when a taker finds too few. A
//     reservation late by less than that half leaves no gap between the
//     node's blocks. A sparse node (one slot used per grant, its takers
//     further apart than the grace) reserves only when asked, and a node
//     asked more than a grace and two intervals after its last slot starts
//     again from one slot: one etcd write, one slot and one round trip of
//     waiting per request, nothing held ahead to waste. A node asking at the
//     rate's own pace (at a low rate, further apart than the grace) is busy,
//     not sparse: its blocks grow.
//   - A cost of n slots needs n held slots within Grace of each other
//     (Slots.Check): (n-1) intervals less than Grace.
//   - Store keeps the last state it saw of each key, so that a node's next
//     grant is one round trip; a stale one costs a retry, never a double
//     grant.
package fleet
