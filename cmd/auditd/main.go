// Command auditd is the system of record for pipelines that pull data from
// rate-limited public endpoints. See README.md.
//
// main is wiring only: each subcommand lives in a file of its own and returns
// an exit status.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// command is one subcommand: it parses its own flags from args and returns
// the process exit status.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands are the subcommands, in the order usage lists them.
var commands = []command{
	{"serve", "run the service (REST API, web UI, fetch loop)", runServe},
	{"verify", "verify the ledger's hash chain, Merkle tree and signed checkpoints", runVerify},
	{"prove", "print an inclusion proof for one event", runProve},
	{"pack", "write a run's evidence pack offline, for a third party to verify", runPack},
	{"retention", "record retention dates, place and release legal holds, purge payloads", runRetention},
	{"reconcile", "reconcile a run; exit 0 balanced, 1 not, 2 error", runReconcile},
	{"export", "write a run's evidence workbook offline", runExport},
	{"sim", "serve hostile upstream simulators from a scenario file", runSim},
	{"version", "print the build's version", runVersion},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 0:
		usage(stderr)
		return 2
	case args[0] == "-h" || args[0] == "--help" || args[0] == "help":
		usage(stdout) // asked for: not an error
		return 0
	}
	for _, c := range commands {
		if c.name == args[0] {
			return c.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "auditd: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: auditd <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nauditd <command> -h lists a command's flags.")
}

// parseStatus is the exit status of a command whose flags did not parse:
// 0 when -h asked for them (the flag package has printed them), 2 for a
// usage error.
func parseStatus(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}

// version is the build's version, stamped by the Makefile
// (-ldflags "-X main.version=..."); a build without it says what the Go
// toolchain knows (the module version or VCS revision), or "devel".
var version string

// codeVersion names the build: recorded with every run, in evidence, and
// printed by auditd version.
func codeVersion() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "devel"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	if v := bi.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	return "devel"
}

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		fmt.Fprintf(stderr, "auditd version: unexpected argument %q\n", args[0])
		return 2
	}
	fmt.Fprintf(stdout, "auditd %s\n", codeVersion())
	return 0
}
