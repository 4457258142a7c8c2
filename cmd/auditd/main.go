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
	"regexp"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"time"
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
	{"compact", "give the bbolt file's free pages back to the disk (auditd stopped)", runCompact},
	{"sim", "serve hostile upstream simulators from a scenario file", runSim},
	{"fleet-demo", "run three nodes sharing each source's budget through one embedded etcd (make run-fleet)", runFleetDemo},
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
	case args[0] == "help" && len(args) > 1:
		// auditd help COMMAND [SUBCOMMAND] is COMMAND [SUBCOMMAND] -h.
		return commandHelp(ctx, args[1:], stdout, stderr)
	case isHelp(args[0]) || args[0] == "help":
		usage(stdout) // asked for: not an error
		return 0
	case args[0] == "--version" || args[0] == "-version":
		return runVersion(ctx, nil, stdout, stderr)
	}
	if len(args) == 2 && isHelp(args[1]) {
		return commandHelp(ctx, args[:1], stdout, stderr)
	}
	if c := lookup(args[0]); c != nil {
		return c.run(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "auditd: unknown command %q\n", args[0])
	usage(stderr)
	return 2
}

func lookup(name string) *command {
	for i := range commands {
		if commands[i].name == name {
			return &commands[i]
		}
	}
	return nil
}

func isHelp(arg string) bool { return arg == "-h" || arg == "--help" || arg == "-help" }

// commandHelp prints what a command (args[0]) is for and its flags on
// stdout, the subcommand's when args names one: help is an answer, so it
// goes where answers go, with exit 0.
func commandHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c := lookup(args[0])
	if c == nil {
		fmt.Fprintf(stderr, "auditd help: unknown command %q\n", args[0])
		usage(stderr)
		return 2
	}
	fmt.Fprintf(stdout, "auditd %s: %s\n\n", c.name, c.summary)
	return c.run(ctx, append(slices.Clone(args[1:]), "-h"), stdout, stdout)
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: auditd <command> [flags]\n\ncommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nauditd help <command> (or auditd <command> -h) lists a command's flags; auditd --version prints the version.")
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

// flags is a command's flag set whose help and mistakes read plainly: -h
// prints the usage line and the flags to stdout (exit 0); a flag that does
// not parse is named with what it wants, on stderr (exit 2), without the
// whole flag list.
type flags struct {
	*flag.FlagSet
	name, usage string
	stdout      io.Writer
	stderr      io.Writer
}

// newFlags returns the flag set of "auditd name"; usage is the line after
// "usage: auditd " (the command and its required flags).
func newFlags(name, usage string, stdout, stderr io.Writer) *flags {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return &flags{FlagSet: fs, name: name, usage: usage, stdout: stdout, stderr: stderr}
}

// parse parses args. ok is false when the command should stop and exit
// with code: 0 after -h, 2 after a mistake.
func (f *flags) parse(args []string) (code int, ok bool) {
	err := f.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		f.printUsage(f.stdout)
		return 0, false
	case err != nil:
		fmt.Fprintf(f.stderr, "auditd %s: %s\nauditd %s -h lists its flags.\n", f.name, f.plain(err), f.name)
		return 2, false
	case f.NArg() > 0:
		fmt.Fprintf(f.stderr, "auditd %s: unexpected argument %q (flags are written --name value)\nauditd %s -h lists its flags.\n", f.name, f.Arg(0), f.name)
		return 2, false
	}
	return 0, true
}

func (f *flags) printUsage(w io.Writer) {
	fmt.Fprintf(w, "usage: auditd %s\n", f.usage)
	n := 0
	f.VisitAll(func(*flag.Flag) { n++ })
	if n == 0 {
		return
	}
	fmt.Fprintln(w, "\nflags:")
	var buf strings.Builder
	f.SetOutput(&buf)
	f.PrintDefaults()
	f.SetOutput(io.Discard)
	// Flags are written --name everywhere else; the flag package accepts both.
	io.WriteString(w, strings.ReplaceAll("\n"+buf.String(), "\n  -", "\n  --")[1:])
}

// fail reports a mistake in the command's flags, exit 2.
func (f *flags) fail(format string, args ...any) int {
	fmt.Fprintf(f.stderr, "auditd %s: %s\n", f.name, fmt.Sprintf(format, args...))
	return 2
}

// badValue matches the flag package's error for a value that does not parse.
var badValue = regexp.MustCompile(`^invalid (?:boolean )?value "(.*)" for (?:flag )?-([^:]+): (.*)$`)

// plain words the flag package's errors for a person: the flag as it is
// typed (--name) and what it wants.
func (f *flags) plain(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return fmt.Sprintf("there is no flag --%s", name)
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return fmt.Sprintf("--%s needs a value", name)
	}
	m := badValue.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	value, name, why := m[1], m[2], m[3]
	want := why
	if fl := f.Lookup(name); fl != nil {
		if g, ok := fl.Value.(flag.Getter); ok {
			switch g.Get().(type) {
			case time.Duration:
				want = "want a duration such as 90s, 5m or 24h"
			case bool:
				want = "want true or false"
			case int, int64, uint, uint64:
				want = "want a whole number"
			}
		}
	}
	return fmt.Sprintf("--%s %q: %s", name, value, want)
}

// plural is "1 run", "2 runs": n and the noun, with an s unless n is 1.
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
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
	fs := newFlags("version", "version", stdout, stderr)
	if code, ok := fs.parse(args); !ok {
		return code
	}
	fmt.Fprintf(stdout, "auditd %s\n", codeVersion())
	return 0
}
