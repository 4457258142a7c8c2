// Package ledger is auditd's append-only, write-ahead, verifiable event
// store, kept in buckets of the one bbolt file that main opens. It owns the
// buckets named ledger.*; nothing else writes to them, and nothing in this
// package updates or deletes a stored event.
//
// # Invariants
//
//   - Sequence numbers are global, contiguous and start at 1.
//   - A commit group the disk refuses (full, say) is not lost: its appends
//     stay queued, in order, and are written again after a backoff (a
//     stall: Options.OnStall, Stalled); appenders wait meanwhile.
//   - Events are durable when Append or AppendBatch returns, or when the
//     Future of an Add says so: once the bbolt transaction holding them has
//     committed with fsync. One writer goroutine takes every waiting append
//     into one transaction (group commit), so concurrent appenders share
//     fsyncs. The writer encodes and hashes the appends that arrive while a
//     group commits, outside any transaction, and commits them as the next
//     group as soon as that one is durable; under load it lets a group grow
//     for up to 1.5 times the last commit's time first, and never longer than
//     Options.GroupDelay (writer.go).
//   - What is added or appended after Add returns is stored after what it
//     added, so a caller can order its records under a lock of its own and
//     wait for them outside it.
//   - Every event is hash-chained: Hash = SHA-256(PrevHash || canonical),
//     where PrevHash is the Hash of the event before (zero for event 1).
//   - Every event is also leaf Seq-1 of an RFC 6962 Merkle tree
//     (golang.org/x/mod/sumdb/tlog), leaf data = its canonical encoding.
//   - Each commit group ends with a checkpoint, signed with the ledger's
//     ed25519 key as a golang.org/x/mod/sumdb/note in C2SP checkpoint form
//     (see SignedTree), written in the same transaction as the events: the
//     latest checkpoint always covers exactly the acknowledged events.
//   - An idempotency key is stored once; appending it again returns the
//     first event and writes nothing.
//
// # Canonical encoding (stable: hashes depend on it)
//
// One version byte (1), then each non-zero field as a one-byte tag followed
// by its value, in increasing tag order: tag 1 Seq, 2 Type, 3 RunID,
// 4 SourceID, 5 ItemKey, 6 Page, 7 Attempt, 8 Time, 9 Mono,
// 10 IdempotencyKey, 11 Method, 12 Path, 13 Status, 14 Bytes, 15 Latency,
// 16 Wait, 17 Actual, 18 RetryAfterRaw, 19 RetryAfter, 20 Clamped,
// 21 Backoff, 22 From, 23 To, 24 Failures, 25 Threshold, 26 Cooldown,
// 27 OldLimit, 28 NewLimit, 29 OldWindow, 30 NewWindow, 31 Group,
// 32 Outcome, 33 BodyError, 34 PayloadHash, 35 Cause, 36 Principal,
// 37 Detail. Strings are a uvarint length and the bytes; Seq, Page and
// Attempt are uvarints; Time is a zigzag varint of Unix nanoseconds (UTC),
// present whenever the time is set; durations (nanoseconds) and the other
// integers are zigzag varints; Clamped is the bare tag when true. Varints
// are minimal. A field added later takes a new tag, so the bytes, and the
// hashes, of events written before do not change; a tag is never reused.
//
// Two tags hold a different field by event type, as they did before those
// fields had names of their own (auditd.Event.Shared): tag 7 holds
// Attempts on item.finished and Attempt on every other type; tag 35, the
// cause, holds Gate (wait, shed), "probe" for Probe (dispatch), ErrorText
// (transport.error), Cause (registry.changed), Snapshot
// (registry.snapshot), Head (export.downloaded) and Reason (any other
// type). testdata/v1 is a ledger written before the split, which every
// build must read, verify and write again byte for byte.
//
// # Buckets
//
//	ledger.events       8-byte big-endian seq -> PrevHash | canonical | Hash (a record)
//	                    first seq | last seq -> a block: the records first to last,
//	                                  each a uvarint length and the record
//	ledger.tree         seq -> the tlog stored hashes of leaves up to seq-1 (see below)
//	ledger.checkpoints  tree size -> signed checkpoint (at least CheckpointEvery apart)
//	ledger.meta         "checkpoint" -> the latest signed checkpoint
//	ledger.runs         uvarint(len run) | run | seq -> the run's earlier seqs (the run index)
//	ledger.idempotency  key -> seq
//
// A tree entry holds, leaf after leaf, the hashes that each leaf of a run of
// consecutive leaves completed, in tlog.StoredHashes order, keyed by the Seq
// of the last one; entries never span two commit groups and hold at most 8
// leaves. So the entry under n holding k hashes is tlog stored hash indexes
// StoredHashCount(n)-k up to StoredHashCount(n). (An entry of one leaf, as
// ledgers written before entries were shared have throughout, is the same
// format.)
//
// A commit group's records are packed into blocks of at most 2,000 bytes of
// consecutive events, keyed by the first and last seq (16 bytes); a record
// stored alone (a group of one, one left over where a group's blocks split,
// or one larger than a block) keeps the 8-byte key, which is all that ledgers written before
// blocks hold, and is read the same way. Blocks cut the puts per event, and
// bbolt's cost is per put. A block never spans two commit groups, and is
// never rewritten.
//
// A run index entry covers the run's events in one commit group: its key
// ends with the Seq of the last one, its value lists the earlier ones, in
// order, as uvarint distances back from it; an empty value is one event.
//
// The append-only buckets (events, tree, checkpoints) are written with
// FillPercent 1.0, since their keys only grow.
//
// # Verification and its limits
//
// Verify re-reads everything and reports the first sequence number the
// ledger cannot vouch for. An edited, truncated-in-the-middle, deleted or
// padded record is named exactly, by its own hash or a gap; so is one
// inside a block, and a deleted, cut or padded block is named by its first
// event, the first event it lacks, or the last it holds. A rewrite whose
// chain and tree were re-hashed to match (possible without the key) shows
// only as a signed checkpoint that no longer matches; Verify then names the
// first event after the last checkpoint that still matches, so the history
// density (Options.CheckpointEvery) is the resolution. Cutting the tail
// together with its later checkpoints leaves a shorter ledger that is
// consistent with itself; only a checkpoint kept elsewhere (VerifyOptions.
// Trusted) catches that, or a run index still listing what was cut.
// Inclusion proofs (Prove, Proof.Verify) let a third party check one event
// against a checkpoint and the public key alone.
//
// The run index and the idempotency index are held to the events as they
// are read: every event of a run listed under it once, nothing listed
// that is not the run's (an entry removed, added or moved is named), every
// key pointing at its event.
//
// Verify also runs bbolt's own consistency check of the file's pages
// (tx.Check), and reads the buckets so that a panic of bbolt's on a page
// it cannot read is reported as damage. bbolt maps the file and trusts
// it: a file cut below its high-water mark, or a page pointing outside
// it, faults the process that reads it, which no recover catches.
// CheckFile reads the file's page tree with plain reads before anything
// maps it (auditd verify and serve run it first), so that what bbolt
// then follows lies inside the file.
//
// The tree only grows, so every hash a proof at an older size needs is
// still stored: Reader proves consistency between two sizes, inclusion at
// a chosen size and a range of leaves (ProveRange: the compact ranges
// either side, for evidence packs), and ScanRecords hands out the leaf
// bytes exactly as they were hashed (proofs.go, records.go).
package ledger
