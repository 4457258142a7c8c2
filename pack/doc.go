// Package pack builds, opens and verifies evidence packs: one ZIP
// (Format, "auditd-evidence-pack/1") holding the evidence workbook of one
// or more runs, the ledger events behind it and the proofs that those
// events are leaves of a signed checkpoint's RFC 6962 tree, so that a third
// party can check the evidence offline, without auditd's data directory.
// docs/EVIDENCE-PACK.md specifies every entry; cmd/auditd's
// independent_verifier_test.go is a verifier written from that page alone,
// which holds this package to it.
//
// Builder.Build writes a pack from a ledger.Reader and a reports.Exporter
// (cmd/auditd's pack command, on a stopped server's data directory, and
// the API's pack routes, on the serving ledger at its latest checkpoint);
// Open
// and OpenFile read one; Verify checks everything it says (cmd/auditd's
// verify --pack).
//
// # Invariants
//
//   - A pack is proven against one checkpoint (the latest, or the one
//     Request.Checkpoint names). Build refuses a checkpoint that is not this
//     ledger's tree at its size, and a run that ends after it.
//   - events.bin holds every event of each of the manifest's ranges, in
//     order, whatever its run: the runs' ranges, and the retention and
//     access events the workbook shows, merged where they overlap or touch.
//     events.ndjson is the same events, one JSON line each, byte for byte
//     what encoding/json makes of them (TestLeafLineIsJSON).
//   - The workbook is exported, and every range and consistency proof made,
//     before the first byte reaches the writer. The workbook is stored, not
//     compressed, so that Verify reads it in place.
//   - Every entry carries one fixed modification time: the ZIP adds no
//     build time of its own.
//   - Open reads only the small entries into memory, each at most 1 MiB,
//     decoded strictly (an unknown JSON field, a duplicate entry or a
//     missing one is ErrBadPack), and checks that the manifest and proof
//     describe one set of ordered ranges a tree of the stated size can hold.
//     The leaves, their NDJSON and the workbook are streamed. Open checks no
//     signature or proof.
//   - Verify reports what does not hold as Report.Problems, each naming the
//     entry and the leaf or row; it returns an error only when a check could
//     not be done. It reads the leaves once: one goroutine checks the chain
//     hashes, the NDJSON lines and the root each range's proof rebuilds,
//     and hands the decoded events to the workbook's check, which compares
//     every row of the event sheets with them, cell by cell.
//
// # Caveats
//
//   - Without Options.Key, Verify trusts the pack's own public-key.txt and
//     says so (Report.KeyTrusted false): a pack rebuilt whole under another
//     key is consistent with itself. Only a key from a trusted source, or a
//     witness's cosignature (Options.Witnesses), catches it.
//   - A failure while the leaves are read (a corrupt ledger, a cancelled
//     context) leaves a partial ZIP in the writer: callers write to a
//     temporary file and rename it (cmd/auditd's writeFileAtomic).
//   - Build calls debug.FreeOSMemory once the workbook is exported, which
//     affects the whole process; it keeps a build's peak RSS at the
//     export's.
//   - Verify reads the workbook with a small scanner of the sheets' XML
//     (xlsx.go), not excelize, which is many seconds slower over a million
//     rows: it reads cell values (numbers, shared and inline strings) and
//     nothing else of a sheet, and caps a cell's text, a row's cells and the
//     shared strings.
package pack
