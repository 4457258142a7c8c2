package pack

import (
	"errors"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/auditd/auditd/reports"
)

// readManifestRows reads the Manifest sheet's rows as stored text (nil
// when the workbook has none).
func readManifestRows(b *book) ([][]string, error) {
	rr, ok, err := b.rows(reports.SheetManifest)
	if err != nil || !ok {
		return nil, err
	}
	defer rr.Close()
	var out [][]string
	for i := 0; i <= 100_000; i++ {
		cells, err := rr.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		} else if err != nil {
			return nil, err
		}
		out = append(out, texts(cells, 3))
	}
	return nil, errors.New("Manifest sheet: too many rows")
}

// checkFleetManifest holds the fleet workbook's Manifest to the pack: the
// fleet run and its nodes as fleet.json says, each node's checkpoint that
// of its part (which Verify and the fleet leaf hold), each node's key the
// one its part was verified with, fields the pack's workbook leaves empty
// empty, and each sheet's row count and SHA-256 those of the sheet: the
// hash over its rows as read, as the merge takes it (sheetHasher); the
// rows themselves are held cell by cell (checkFleetSheet). Keys are the
// keys the nodes were verified with, by node.
func checkFleetManifest(fp *FleetPack, fleet *sheetRows, keys map[string]string, r *FleetReport) {
	const wb = FileFleetWorkbook
	if fleet.manifest == nil {
		r.fail("%s: no Manifest sheet", wb)
		return
	}
	m := &fp.Manifest
	names := make([]string, len(m.Nodes))
	for i, n := range m.Nodes {
		names[i] = n.Name
	}
	want := map[string]string{
		"Label":                   reports.Label,
		"Export id":               "fleet run=" + strings.Join(m.Runs, " "),
		"Generated at (UTC)":      "",
		"Filters":                 "fleet run=" + strings.Join(m.Runs, " "),
		"Runs":                    strings.Join(m.Runs, " "),
		"Nodes":                   strings.Join(names, " "),
		"Reconciliation balanced": "",
		"How to verify":           reports.FleetHowToVerify,
		"Timestamps":              reports.FleetTimestamps,
	}
	for _, n := range m.Nodes {
		if p := fp.Nodes[n.Name]; p != nil {
			want["Node "+n.Name+": "+reports.ManifestFieldCheckpoint] = string(p.Checkpoint)
		}
		want["Node "+n.Name+": "+reports.ManifestFieldPublicKey] = keys[n.Name]
	}
	seen := map[string]bool{}
	listed := map[string]bool{}
	table := false
	for i, row := range fleet.manifest {
		at := i + 1
		switch {
		case i == 0:
			if row[0] != "Field" {
				r.fail("%s: sheet %s row %d is not the header row", wb, reports.SheetManifest, at)
			}
		case table:
			n, err := strconv.ParseInt(row[1], 10, 64)
			got, ok := fleet.counts[row[0]]
			switch {
			case !ok:
				r.fail("%s: sheet %s row %d lists sheet %q, which the workbook does not have", wb, reports.SheetManifest, at, row[0])
			case listed[row[0]]:
				r.fail("%s: sheet %s row %d lists sheet %q a second time", wb, reports.SheetManifest, at, row[0])
			case err != nil || n != got:
				r.fail("%s: sheet %s row %d says sheet %s has %q rows; it has %d", wb, reports.SheetManifest, at, row[0], row[1], got)
			case fleet.disorder[row[0]] > 0:
				r.fail("%s: sheet %s row %d: sheet %s row %d has its cells out of column order, which the merge does not write, so no SHA-256 of its rows", wb, reports.SheetManifest, at, row[0], fleet.disorder[row[0]])
			case row[2] != fleet.sums[row[0]]:
				r.fail("%s: sheet %s row %d: sheet %s's SHA-256 of rows is %q; its rows as read hash to %s", wb, reports.SheetManifest, at, row[0], row[2], fleet.sums[row[0]])
			}
			listed[row[0]] = true
		case row[0] == reports.ManifestFieldSheet:
			table = true
		default:
			v, ok := want[row[0]]
			switch {
			case !ok:
				r.fail("%s: sheet %s row %d: field %q is not one a fleet pack's Manifest has", wb, reports.SheetManifest, at, row[0])
			case seen[row[0]]:
				r.fail("%s: sheet %s row %d: field %q a second time", wb, reports.SheetManifest, at, row[0])
			case row[1] != v || row[2] != "":
				r.fail("%s: sheet %s row %d: %s is %q, not %q", wb, reports.SheetManifest, at, row[0], row[1], v)
			}
			seen[row[0]] = true
		}
	}
	for _, f := range slices.Sorted(maps.Keys(want)) {
		if !seen[f] {
			r.fail("%s: sheet %s lacks field %q", wb, reports.SheetManifest, f)
		}
	}
	for _, s := range slices.Sorted(maps.Keys(fleet.counts)) {
		if !listed[s] {
			r.fail("%s: sheet %s does not list sheet %s", wb, reports.SheetManifest, s)
		}
	}
}
