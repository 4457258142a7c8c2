// Command auditd is the system of record for pipelines that pull data from
// rate-limited public endpoints. See README.md.
//
// main is wiring only: each subcommand lives in a file of its own and returns
// an exit status.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// command is one subcommand: it parses its own flags from args and returns
// the process exit status.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

func commands() map[string]command {
	return map[string]command{
		"serve":     {"run the service (REST API, web UI, fetch loop)", runServe},
		"verify":    {"verify the ledger's hash chain, Merkle tree and signed checkpoints", runVerify},
		"prove":     {"print an inclusion proof for one event", runProve},
		"pack":      {"write a run's evidence pack offline, for a third party to verify", runPack},
		"retention": {"record retention dates, place and release legal holds, purge payloads", runRetention},
		"reconcile": {"reconcile a run; exit 0 balanced, 1 not, 2 error", runReconcile},
		"export":    {"write a run's evidence workbook offline", runExport},
		"sim":       {"serve hostile upstream simulators from a scenario file", runSim},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, cmds)
		return 2
	}
	c, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "auditd: unknown command %q\n", args[0])
		usage(stderr, cmds)
		return 2
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: auditd <command> [flags]\n\ncommands:")
	for _, name := range []string{"serve", "verify", "prove", "pack", "retention", "reconcile", "export", "sim"} {
		fmt.Fprintf(w, "  %-10s %s\n", name, cmds[name].summary)
	}
}
