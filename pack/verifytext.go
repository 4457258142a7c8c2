package pack

import (
	"fmt"
	"strings"
)

// verifyText is VERIFY.md: how to check the pack, with and without auditd.
func verifyText(m *Manifest) []byte {
	var runs []string
	for _, r := range m.Runs {
		runs = append(runs, fmt.Sprintf("- run %s: events %d to %d", r.ID, r.First, r.Last))
	}
	return fmt.Appendf(nil, `# Verifying this evidence pack

This pack (%s) holds the evidence workbook of %s and the ledger events
behind it, proven against a checkpoint signed by the ledger %s at tree
size %d. It can be checked offline, by anyone, without auditd's data
directory.

%s

## With auditd

    auditd verify --pack THIS.zip --key '<the ledger key, from a source you trust>'

It checks the checkpoint's signature, rebuilds the Merkle root from the
leaves and proof.json, recomputes each event's chain hash, and checks every
sheet of the workbook against the leaves: the event sheets (Dispatches
first) row by row, the Reconciliation and the other sheets derived from it
against each run reconciled again from the leaves, and the Manifest's
fields and hashes: nothing missing, nothing extra, every cell as the events
say. Add
--previous EARLIER.zip to check this pack's log is an extension of an
earlier pack's, and --require-witness KEY for each witness that must have
cosigned the checkpoint. Exit 0 verified, 1 naming what does not hold.

## Without auditd

docs/EVIDENCE-PACK.md (in auditd's repository) specifies every entry, so an
RFC 6962 library (transparency-dev/merkle, or golang.org/x/mod/sumdb/tlog)
and a signed-note library (golang.org/x/mod/sumdb/note) are enough:

1. public-key.txt is a note verifier key; compare it with the one the
   organisation publishes. checkpoint.txt is a signed note: its first three
   lines are the origin, the tree size and the base64 RFC 6962 root.
2. events.bin holds the leaves of pack.json's ranges in order, each a 4-byte
   big-endian length and the event's canonical encoding (the leaf data).
   events.ndjson is the same events as JSON, one a line.
3. For each range of proof.json, the compact range of "left", then the
   leaves' hashes SHA-256(0x00 || leaf), then the compact range of "right",
   merged, give the checkpoint's root.
4. Each event's chain hash is SHA-256(previous chain hash || leaf), starting
   from the range's prev_hash; it is the workbook's "Event hash", and the
   workbook's "Seq" is the leaf index plus one.
5. consistency.json, when present, is the RFC 6962 consistency proof from
   previous-checkpoint.txt's tree to this one.
`, Format, m.Filters, m.Origin, m.TreeSize, strings.Join(runs, "\n"))
}
