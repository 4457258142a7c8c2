// Package staging keeps the payloads the fetch loop received, content
// addressed: a payload is stored once under the hex SHA-256 of its bytes, in
// a two-level directory tree below the staging directory, and never changed.
//
// Besides the payloads it keeps one index in the shared bbolt file: for every
// request (source, method, path, body) the hash of its last good payload, so a
// source whose breaker is open can be served from the last good copy instead
// of failing the run, and a replayed run can read instead of re-fetching.
//
// Invariants: a payload file exists only complete and fsynced (written to a
// temporary file, synced, then renamed); a file's name is the SHA-256 of its
// bytes, so Verify can tell whether it was altered.
package staging
