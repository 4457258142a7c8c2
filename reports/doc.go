// Package reports recounts a run from its raw ledger events and turns the
// recount into the two things auditors and CI consume: the reconciliation
// (JSON for CI, CSV, a text table, XLSX) and the evidence workbook.
//
// # Reconciliation
//
// Reconciler.Reconcile reads a run's events afresh through an
// auditd.EventReader and checks the identities R1 to R10
// (docs/RECONCILIATION.md), per source and in total, as a recount of the
// rules in docs/EVENTS.md. It never trusts a counter kept while the run was
// running: those are an input to R7, compared against the recount. Every
// check reports expected, actual, their difference (actual - expected) and,
// when it fails, the sequence numbers of the first offending events. A
// check passes only when the difference is zero and no event offended, so
// two errors cannot cancel out. A check that cannot be applied (R7 without
// live counters, R10 without acknowledgements, R9 for a source with no
// recorded limit) is "n/a", never a silent pass. Report.Balanced is true
// only when no applicable check fails.
//
// Reconcile reads the ledger once, in sequence order, over the range from
// the run's first event to its last (both found with a few run-index
// probes): the run's events feed the recount, every event of the range feeds
// R8. The recount holds state per item and per open request, not per event,
// so memory grows with the items of a run, not its events.
//
// Report.Cached lists the items served from a last good copy, from their
// cache.served events: which run fetched each copy, when, and its age when
// served (unknown for a cache.served that predates them). They are not a
// check: the run is as balanced as its counts are; CI holds the ages to a
// bound of its own (auditd reconcile --max-stale), and the workbooks show
// them on a Served from cache sheet.
//
// # Evidence workbook
//
// Exporter writes the workbook's sheets (SheetManifest to SheetAccess) with
// excelize's StreamWriter, so rows go to disk as they are produced. The
// reconciliation reads the run's range in a goroutine of its own while a
// second read of the same range writes the event sheets; the sheets built
// from the reconciliation follow. A population past the row limit continues
// on a numbered sheet, created when reached and moved after its first sheet
// at the end. The Manifest is the first sheet but is written last, once
// every other sheet's row count and row hash is known.
//
// Output is deterministic: the same events and Request give byte-identical
// files. Document properties are fixed, nothing reads the clock (the
// generated-at time is part of the Request), and the ZIP container is written
// by a writer that orders its entries by name, because excelize emits
// streamed sheets in map order. That writer also deflates each entry in
// fixed-size chunks on every core (the chunks are cut at fixed offsets, so
// the bytes do not depend on scheduling).
//
// A sheet's row hash is the hex SHA-256 over its rows, header included, each
// rendered as its cells' text joined by a tab and ended by a newline: strings
// as stored (backslash, tab and newline escaped as \\, \t and \n), integers in
// decimal, timestamps as RFC 3339 UTC with milliseconds, booleans as
// TRUE/FALSE, as spreadsheets show them. A third party can recompute it
// from a CSV of the sheet (LibreOffice's, cells as shown, does).
//
// With a Retention source the workbook also has a Retention sheet: the
// retention events of the runs' awards (retention dates, legal holds,
// purges), whose holds and purges also end the Access log. EventRows
// recomputes every event population from events, as Export writes it, so
// that an evidence pack's verifier can hold a workbook to its leaves.
//
// Paths and error texts are checked for credentials again on the way out,
// under package redact's rule, the loop's: the values of credential query
// parameters (its built-in names, and with Exporter.SecretQuery a source's
// declared names) and userinfo become REDACTED, the names kept. The ledger
// holds them redacted already, so a path the loop recorded is exported as
// it is; this is the second guard.
//
// # Timelines
//
// Timelines adds up a run's or a source's events per time bucket for the
// UI's charts (auditd.Timeline): per source and bucket the dispatches, each
// counted again by how it ended (its outcome event is matched to its
// dispatch, so the classes add up as R2's do), the throttles, waits by
// gate, shed and cache served recorded in the bucket, and the limit in
// force; the breaker's open and half-open spans; the registry.changed
// history. A run's timeline reads the run's range once, like a
// reconciliation, and stops at its run.finished; a source's finds its
// range with SeqAt and reads every event in it. Buckets start at whole
// multiples of the bucket since the Unix epoch. What was in force before
// the first registry or breaker event of a range is read from that event
// (the old limit of a change, the state a transition left), since every
// change is recorded. Memory grows with buckets times sources and with the
// dispatches awaiting their outcome, not with events.
//
// Heavy exports go through an Admission: a bounded number run at once, each
// under a deadline; the rest get a *BusyError carrying an honest Retry-After.
//
// # Service
//
// Service is what a running auditd serves (the API's Reports): a run's
// reconciliation with the counters kept while it ran (auditd.Counts) for
// R7, a finished run's report kept until an event is added to it, and
// evidence workbooks of a run or of an award, admitted by an Admission.
package reports
