package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/auditd/auditd/ledger"
)

// runVerify checks the ledger of a data directory offline: exit 0 when it
// is intact, 1 naming the first bad sequence number, 2 when it cannot check.
func runVerify(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("verify", flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data", "data `directory` holding auditd.db and the ledger key")
	trusted := fs.String("trusted-checkpoint", "", "a signed checkpoint `file` kept apart from the data directory (catches truncation)")
	key := fs.String("key", "", "note verifier `key` to check checkpoints with (default: ledger.pub in the data directory, or the pack's)")
	packFile := fs.String("pack", "", "verify the evidence pack `file` instead, offline, without the data directory")
	previous := fs.String("previous", "", "with --pack: an earlier pack `file` of the same ledger, checked to be consistent with it")
	var witnesses, nodeKeys listFlag
	fs.Var(&witnesses, "require-witness", "with --pack: a witness's cosignature verifier `key` that must have cosigned the checkpoint (repeatable)")
	fs.Var(&nodeKeys, "node-key", "with a fleet pack: a node's note verifier key as `NAME=KEY`, from a source you trust; every node named must have a part (repeatable)")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "auditd verify: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *packFile != "" {
		if fleet, err := isFleetPack(*packFile); err != nil {
			fmt.Fprintf(stderr, "auditd verify: %v\n", err)
			return 2
		} else if fleet {
			// Refused, never ignored: a pass that checked none of what was
			// asked is a false pass.
			var nodeOnly []string
			for name, given := range map[string]bool{"--key": *key != "", "--previous": *previous != "", "--require-witness": len(witnesses) > 0} {
				if given {
					nodeOnly = append(nodeOnly, name)
				}
			}
			if len(nodeOnly) > 0 {
				sort.Strings(nodeOnly)
				fmt.Fprintf(stderr, "auditd verify: %s: this pack is a fleet's; pass --node-key NAME=KEY for each node instead (--key, --previous and --require-witness check one node's pack)\n", strings.Join(nodeOnly, ", "))
				return 2
			}
			return verifyFleetPack(*packFile, nodeKeys, stdout, stderr)
		}
		if len(nodeKeys) > 0 {
			fmt.Fprintln(stderr, "auditd verify: --node-key goes with a fleet pack; this pack is one node's")
			return 2
		}
		return verifyPack(*packFile, *key, *previous, witnesses, stdout, stderr)
	}
	var packOnly []string
	for name, given := range map[string]bool{"--previous": *previous != "", "--require-witness": len(witnesses) > 0, "--node-key": len(nodeKeys) > 0} {
		if given {
			packOnly = append(packOnly, name)
		}
	}
	if len(packOnly) > 0 {
		sort.Strings(packOnly)
		verb := "goes"
		if len(packOnly) > 1 {
			verb = "go"
		}
		fmt.Fprintf(stderr, "auditd verify: %s %s with --pack\n", strings.Join(packOnly, " and "), verb)
		return 2
	}
	opts := ledger.VerifyOptions{VerifierKey: *key, KeyDir: *data}
	if *trusted != "" {
		b, err := os.ReadFile(*trusted)
		if err != nil {
			fmt.Fprintf(stderr, "auditd verify: %v\n", err)
			return 2
		}
		opts.Trusted = b
	}
	// bbolt maps the file and trusts it: a damaged one is named before it
	// is opened, not met as a crash.
	path := filepath.Join(*data, dbFile)
	if err := checkFile(path); errors.Is(err, ledger.ErrDamaged) {
		fmt.Fprintf(stdout, "ledger NOT intact: %s: %v\n", path, err)
		return 1
	} else if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	db, err := openDB(*data, true)
	if errors.Is(err, errHeld) || errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	} else if err != nil {
		// The file's pages passed CheckFile, yet bbolt refuses it.
		fmt.Fprintf(stdout, "ledger NOT intact: bbolt cannot open it: %v\n", err)
		return 1
	}
	defer db.Close()

	r, err := ledger.Verify(ctx, db, opts)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	if !r.OK {
		fmt.Fprintln(stdout, "ledger NOT intact:")
		for _, f := range r.Findings() {
			fmt.Fprintf(stdout, "  %s\n", f)
		}
		return 1
	}
	fmt.Fprintf(stdout, "ledger intact: %d events, %d signed checkpoints match, bbolt's page check and the run and idempotency indexes agree\n", r.Events, r.Checkpoints)
	return 0
}
