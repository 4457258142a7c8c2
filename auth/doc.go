// Package auth owns API tokens: how they are minted, stored, checked and
// revoked, and which role each one carries.
//
// A token's secret is shown once, when it is created, and never stored: the
// bbolt buckets hold its SHA-256 (the secrets are 256 random bits, so a fast
// hash is enough), and Authenticate compares hashes in constant time. A
// revoked token stays in the store, marked with who revoked it and when, so
// the access log can still name it.
//
// Every change (create, revoke) is appended to the ledger as a token.changed
// event naming the principal who made it. The change and its event succeed
// or fail together: when the ledger refuses the event, the store change is
// undone and the caller gets the error.
//
// Roles are ordered: auditor (read and export) < operator (runs and
// acknowledgements) < admin (sources and tokens). A route names the least
// role it needs; a higher role may do everything a lower one may.
//
// The store never removes the last active admin token, so the service
// cannot lock its own administrators out.
package auth
