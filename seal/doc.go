// Package seal keeps the credentials auditd must hold on to (a source's
// request headers, the credentials in the paths of a run's items until the
// run ends) sealed at rest: AES-256-GCM under a key of the data directory,
// never in the clear in the bbolt file. The ledger never holds them, sealed
// or not: what it records is redacted (package redact).
//
// The key is a file of its own (KeyFile, mode 0600) beside the signing
// key, made on first use. Removing it makes every sealed value unreadable:
// sources need their headers again, and unfinished runs whose items carry
// credentials fail those items when they resume.
package seal
