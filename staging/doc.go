// Package staging keeps the payloads the fetch loop received, content
// addressed: a payload is stored once under the hex SHA-256 of its bytes and
// never changed. A small one (up to InlineMax, 64 KiB by default) lives in
// the shared bbolt file, written in the same batched commit as the item that
// refers to it; a larger one is a file in a two-level directory tree below
// the staging directory.
//
// Besides the payloads it keeps one index in the bbolt file: for every
// request (source, method, path, body) its last good payload (Copy: hash,
// when it was fetched, the run that fetched it), so a source whose breaker
// is open can be served from the last good copy instead of failing the run,
// and a replayed run can read instead of re-fetching. The fetch loop has
// the ledger store a copy's record in the commit that records its payload
// staged (LastGoodRecord, an append): the copy serves every run, this one
// and any other still running, from that moment, and Compact moves the
// records into the index in key order (lastgood.go).
//
// Invariants: a payload file exists only complete and fsynced (written to a
// temporary file, synced, then renamed); a small payload is durable once its
// commit is; a payload's name is the SHA-256 of its bytes, so VerifyPayload
// can tell whether it was altered. OpenReadOnly reads a stopped server's
// payloads from a read-only file, for auditd reconcile and export offline.
package staging
