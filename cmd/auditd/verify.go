package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

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
	var witnesses listFlag
	fs.Var(&witnesses, "require-witness", "with --pack: a witness's cosignature verifier `key` that must have cosigned the checkpoint (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "auditd verify: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *packFile != "" {
		return verifyPack(*packFile, *key, *previous, witnesses, stdout, stderr)
	}
	if *previous != "" || len(witnesses) > 0 {
		fmt.Fprintln(stderr, "auditd verify: --previous and --require-witness go with --pack")
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
	db, err := openDB(*data, true)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	defer db.Close()

	r, err := ledger.Verify(ctx, db, opts)
	if err != nil {
		fmt.Fprintf(stderr, "auditd verify: %v\n", err)
		return 2
	}
	if !r.OK {
		fmt.Fprintf(stdout, "ledger NOT intact: first bad sequence %d: %s\n", r.FirstBad, r.Problem)
		return 1
	}
	fmt.Fprintf(stdout, "ledger intact: %d events, %d signed checkpoints match\n", r.Events, r.Checkpoints)
	return 0
}
