// Package retention owns record retention under 2 CFR 200.334: a
// retention date per award (by default three years after the final
// financial report date the operator records), legal holds that an admin
// places and releases with a reason, and the purge of staged payloads
// that both allow.
//
// # Invariants
//
//   - Every decision is a ledger event before it takes effect
//     (retention.set, hold.placed, hold.released, payload.purged), and the
//     ledger is the only state: a Keeper rebuilds what it knows by reading
//     the retention events it has not seen yet, so nothing can disagree
//     with the record.
//   - Only staged payloads are ever purged. Ledger events and the Merkle
//     tree are never deleted, so verification and evidence packs stay
//     valid: the payload hashes the events recorded remain.
//   - A payload is purged only when every run that staged it or was
//     served it belongs to an award whose retention date has come (now at
//     or after it) and that has no active hold. A run with no award, or an
//     award with no retention date, keeps its payloads.
//   - A purge naming an award under hold, or before its date, is refused
//     with ErrHeld or ErrRetained and records nothing.
//   - A purge records what it purges (the award, the run and the payload
//     hashes, in events of at most PurgeChunk hashes) before deleting it:
//     a crash between the two leaves a record of a purge not yet done,
//     which the next purge completes, never a deletion without a record.
//
// Time comes from the Keeper's clock, so tests run the calendar on a fake.
package retention
