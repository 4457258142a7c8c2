package main

import (
	"archive/zip"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/auditd/auditd/pack"
)

// verifyPack checks an evidence pack offline, without the data directory:
// exit 0 when everything it says holds, 1 naming each thing that does
// not, 2 when it cannot be read.
func verifyPack(path, key, previous string, witnesses []string, stdout, stderr io.Writer) int {
	p, f, err := pack.OpenFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	defer f.Close()
	opts := pack.Options{Key: key, Witnesses: witnesses}
	if previous != "" {
		prev, pf, err := pack.OpenFile(previous)
		if err != nil {
			fmt.Fprintf(stderr, "auditd verify: --previous: %v\n", err)
			return 2
		}
		defer pf.Close()
		opts.Previous = prev
	}
	r, err := pack.Verify(p, opts)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	if !r.OK {
		return notVerified(stdout, "pack", r.Problems)
	}
	var rows []string
	for name, n := range r.Rows {
		rows = append(rows, fmt.Sprintf("%s %d", name, n))
	}
	sort.Strings(rows)
	fmt.Fprintf(stdout, "pack verified: %s proven against %s at size %d; rows tie to leaves: %s\n",
		leaves(r.Leaves), r.Origin, r.TreeSize, strings.Join(rows, ", "))
	fmt.Fprintf(stdout, "sheets checked: %s\n", strings.Join(r.Sheets, ", "))
	if !r.KeyTrusted {
		fmt.Fprintln(stdout, "note: checked with the pack's own public key; pass --key with the ledger's published key to rule out a pack re-signed whole")
	}
	if len(r.Witnessed) > 0 {
		fmt.Fprintf(stdout, "cosigned by: %s\n", strings.Join(r.Witnessed, ", "))
	}
	if r.Consistent != "" {
		fmt.Fprintf(stdout, "consistent: %s\n", r.Consistent)
	}
	return 0
}

// isFleetPack reports whether the pack at path is a fleet pack: a ZIP
// holding the fleet manifest (docs/EVIDENCE-PACK.md, "Fleet packs").
func isFleetPack(path string) (bool, error) {
	zr, err := zip.OpenReader(path)
	if err != nil {
		return false, fmt.Errorf("%s: %w", path, err)
	}
	defer zr.Close()
	for _, f := range zr.File {
		if f.Name == pack.FileFleetManifest {
			return true, nil
		}
	}
	return false, nil
}

// verifyFleetPack checks a fleet pack offline: every node's part, the
// fleet log's proof of each node's checkpoint, the nodes' cosignatures,
// and the slot reservations against the limits. Exit codes as verifyPack's.
func verifyFleetPack(path string, nodeKeys []string, stdout, stderr io.Writer) int {
	keys := map[string]string{}
	for _, nk := range nodeKeys {
		name, key, ok := strings.Cut(nk, "=")
		if !ok || name == "" || key == "" {
			fmt.Fprintf(stderr, "auditd verify: --node-key %q: want NAME=KEY\n", nk)
			return 2
		}
		keys[name] = key
	}
	fp, f, err := pack.OpenFleetFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	defer f.Close()
	r, err := pack.VerifyFleet(fp, pack.FleetOptions{Keys: keys})
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	if !r.OK {
		return notVerified(stdout, "fleet pack", r.Problems)
	}
	names := make([]string, 0, len(r.Nodes))
	for name := range r.Nodes {
		names = append(names, name)
	}
	sort.Strings(names)
	fmt.Fprintf(stdout, "fleet pack verified: %d nodes (%s), each part against its checkpoint, each checkpoint in %s at size %d\n",
		len(names), strings.Join(names, ", "), r.Origin, r.TreeSize)
	var ds []string
	for src, n := range r.Dispatches {
		ds = append(ds, fmt.Sprintf("%s %d", src, n))
	}
	sort.Strings(ds)
	if len(ds) > 0 {
		fmt.Fprintf(stdout, "dispatches over every node, within the limits and the slots reserved: %s\n", strings.Join(ds, ", "))
	}
	if r.WorkbookRows > 0 {
		fmt.Fprintf(stdout, "%s: %d rows, each the row of its Node's own workbook; its Manifest states the pack's runs, nodes, checkpoints, keys and sheets\n", pack.FileFleetWorkbook, r.WorkbookRows)
	}
	if !r.KeysTrusted {
		fmt.Fprintln(stdout, "note: checked with the nodes' keys the pack carries; pass --node-key NAME=KEY for each node to rule out a pack re-signed whole")
	}
	return 0
}

// notVerified lists the problems that failed a pack (what names it) and
// returns verify's exit code for that, 1.
func notVerified(stdout io.Writer, what string, problems []string) int {
	fmt.Fprintf(stdout, "%s NOT verified: %s\n", what, plural(int64(len(problems)), "problem"))
	for _, pr := range problems {
		fmt.Fprintf(stdout, "  - %s\n", pr)
	}
	return 1
}
