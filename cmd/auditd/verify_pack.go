package main

import (
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
		fmt.Fprintf(stdout, "pack NOT verified: %s\n", plural(int64(len(r.Problems)), "problem"))
		for _, pr := range r.Problems {
			fmt.Fprintf(stdout, "  - %s\n", pr)
		}
		return 1
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
