package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/retention"
	"github.com/auditd/auditd/staging"
)

// retentionSubcommands are retention's subcommands, in the order help
// lists them.
var retentionSubcommands = []struct{ name, usage, summary string }{
	{"set", "retention set --award FAIN --final-report DATE [--retain-until DATE] [--json]", "record an award's final financial report date and how long its records are kept"},
	{"hold", "retention hold --award FAIN --reason TEXT [--json]", "place a legal hold: nothing of the award is purged until it is released"},
	{"release", "retention release --award FAIN --hold ID --reason TEXT [--json]", "release a legal hold (retention status lists them)"},
	{"status", "retention status --award FAIN [--json]", "show an award's retention date, its holds, and whether a purge is allowed now"},
	{"purge", "retention purge [--award FAIN] [--dry-run] [--json]", "delete the staged payloads whose retention has passed (every eligible award unless --award)"},
}

func retentionUsage(w io.Writer) {
	fmt.Fprintln(w, "usage: auditd retention <subcommand> --data DIR [flags]\n\nsubcommands:")
	for _, s := range retentionSubcommands {
		fmt.Fprintf(w, "  %-8s %s\n", s.name, s.summary)
	}
	fmt.Fprintln(w, "\nauditd retention <subcommand> -h lists its flags. Each prints what it recorded in sentences; --json prints it as JSON, for a program to read.")
}

// runRetention is the admin's retention command, offline on a stopped
// server's data directory: record an award's final report date, place
// and release legal holds, show an award's status, purge what retention
// allows. Each change is a ledger event naming --by.
func runRetention(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "auditd retention: give a subcommand: set, hold, release, status or purge")
		retentionUsage(stderr)
		return 2
	}
	sub := args[0]
	if isHelp(sub) || sub == "help" {
		retentionUsage(stdout)
		return 0
	}
	i := slices.IndexFunc(retentionSubcommands, func(s struct{ name, usage, summary string }) bool { return s.name == sub })
	if i < 0 {
		fmt.Fprintf(stderr, "auditd retention: there is no subcommand %q\n", sub)
		retentionUsage(stderr)
		return 2
	}
	c, code, ok := parseRetention(sub, retentionSubcommands[i].usage, args[1:], stdout, stderr)
	if !ok {
		return code
	}
	return c.run(ctx, stdout, stderr)
}

// retentionCall is one retention subcommand, its flags parsed and checked.
type retentionCall struct {
	sub, data, award, principal string
	reason, hold                string
	finalReport, retainUntil    time.Time // set
	dryRun, asJSON              bool
}

// parseRetention reads and checks sub's flags; ok is false, with the exit
// code, when they are wrong or asked for help.
func parseRetention(sub, usage string, args []string, stdout, stderr io.Writer) (c *retentionCall, code int, ok bool) {
	fs := newFlags("retention "+sub, usage, stdout, stderr)
	data := fs.String("data", "./data", "data `directory` of a stopped auditd")
	award := fs.String("award", "", "the award's `FAIN`")
	by := fs.String("by", "", "who is acting (recorded as the principal); default cli:$USER")
	asJSON := fs.Bool("json", false, "print the result as JSON, for a program to read")
	var finalReport, retainUntil, reason, hold *string
	dryRun := new(bool)
	switch sub {
	case "set":
		finalReport = fs.String("final-report", "", "`date` (YYYY-MM-DD) of the award's final financial report")
		retainUntil = fs.String("retain-until", "", "retention `date` (YYYY-MM-DD); default three years after the final report")
	case "hold":
		reason = fs.String("reason", "", "why: the litigation, claim, audit or written notice")
	case "release":
		hold = fs.String("hold", "", "the hold's `id` (retention status lists them)")
		reason = fs.String("reason", "", "why the hold ends")
	case "purge":
		dryRun = fs.Bool("dry-run", false, "say what would be purged; record and delete nothing")
	}
	if code, ok := fs.parse(args); !ok {
		return nil, code, false
	}
	switch {
	case *award == "" && sub != "purge":
		return nil, fs.fail("--award is required: the award's FAIN"), false
	case sub == "set" && *finalReport == "":
		return nil, fs.fail("--final-report is required: the date (YYYY-MM-DD) of the award's final financial report"), false
	case sub == "release" && *hold == "":
		return nil, fs.fail("--hold is required: the hold's id, as auditd retention status --award %s lists it", *award), false
	case reason != nil && strings.TrimSpace(*reason) == "":
		return nil, fs.fail("--reason is required: say why (the litigation, claim, audit or written notice); it is recorded in the ledger"), false
	}
	c = &retentionCall{sub: sub, data: *data, award: *award, principal: *by, dryRun: *dryRun, asJSON: *asJSON}
	if c.principal == "" {
		c.principal = "cli:" + os.Getenv("USER")
	}
	if reason != nil {
		c.reason = *reason
	}
	if hold != nil {
		c.hold = *hold
	}
	if sub == "set" {
		for _, d := range []struct {
			name, text string
			t          *time.Time
		}{{"final-report", *finalReport, &c.finalReport}, {"retain-until", *retainUntil, &c.retainUntil}} {
			if d.text == "" {
				continue
			}
			t, err := time.Parse(time.DateOnly, d.text)
			if err != nil {
				return nil, fs.fail("--%s %q: want a date as YYYY-MM-DD", d.name, d.text), false
			}
			*d.t = t
		}
	}
	return c, 0, true
}

// run opens the data directory and carries the call out.
func (c *retentionCall) run(ctx context.Context, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd retention %s: %s\n", c.sub, plainError(err))
		return 2
	}
	if _, err := os.Stat(filepath.Join(c.data, dbFile)); err != nil {
		return fail(fmt.Errorf("--data %s holds no auditd database: %w", c.data, err))
	}
	db, err := openDB(c.data, false)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	led, err := ledger.Open(db, ledger.Options{KeyDir: c.data})
	if err != nil {
		return fail(err)
	}
	defer led.Close(context.Background())
	stage, err := staging.Open(db, filepath.Join(c.data, payloadsDir))
	if err != nil {
		return fail(err)
	}
	k := retention.New(led, stage)

	var out any
	switch c.sub {
	case "set":
		out, err = k.SetRetention(ctx, c.principal, c.award, c.finalReport, c.retainUntil)
	case "hold":
		out, err = k.PlaceHold(ctx, c.principal, c.award, c.reason)
	case "release":
		out, err = k.ReleaseHold(ctx, c.principal, c.award, c.hold, c.reason)
	case "status":
		if !c.asJSON {
			return c.status(k, led, stdout, stderr, fail)
		}
		out, err = k.Status(c.award)
	case "purge":
		out, err = k.Purge(ctx, c.principal, c.award, c.dryRun)
		if errors.Is(err, retention.ErrHeld) || errors.Is(err, retention.ErrRetained) || errors.Is(err, retention.ErrNoRetention) {
			fmt.Fprintf(stderr, "auditd retention: purge refused: %v\n", err)
			return 1
		}
	}
	if err != nil {
		return fail(err)
	}
	if !c.asJSON {
		writeRetentionResult(stdout, out)
		return 0
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fail(err)
	}
	return 0
}

// status prints an award's retention in sentences, or says plainly that
// nothing in the ledger names the award.
func (c *retentionCall) status(k *retention.Keeper, led *ledger.Ledger, stdout, stderr io.Writer, fail func(error) int) int {
	st, err := k.Status(c.award)
	if err != nil {
		return fail(err)
	}
	runs, err := awardRunCount(led, c.award)
	if err != nil {
		return fail(err)
	}
	if !st.Set && len(st.Holds) == 0 && runs == 0 {
		fmt.Fprintf(stderr, "auditd retention status: no run, retention date or legal hold names award %q: is the FAIN mistyped?\n", c.award)
		return 1
	}
	writeRetentionStatus(stdout, st, runs, time.Now())
	return 0
}

// writeRetentionResult says in sentences what set, hold, release or purge
// recorded (or, for a dry run, would delete).
func writeRetentionResult(w io.Writer, out any) {
	day := func(t time.Time) string { return t.UTC().Format(time.DateOnly) }
	switch r := out.(type) {
	case retention.Award:
		fmt.Fprintf(w, "award %s: records kept until %s (final financial report %s); recorded in event %d\n",
			r.FAIN, day(r.RetainUntil), day(r.FinalReport), r.Seq)
	case retention.Hold:
		if r.Active() {
			fmt.Fprintf(w, "award %s: legal hold %s placed by %s: %q\nnothing of the award is purged until it is released (auditd retention release --award %s --hold %s --reason TEXT)\n",
				r.Award, r.ID, r.PlacedBy, r.Reason, r.Award, r.ID)
		} else {
			fmt.Fprintf(w, "award %s: legal hold %s released by %s: %q\n", r.Award, r.ID, r.ReleasedBy, r.ReleaseReason)
		}
	case *retention.PurgeReport:
		verb := "purged"
		if r.DryRun {
			verb = "would purge (dry run: nothing recorded or deleted)"
		}
		fmt.Fprintf(w, "%s %s (%s) of %s\n", verb, plural(int64(r.Payloads), "payload"), humanBytes(r.Bytes), plural(int64(len(r.Runs)), "run"))
		for _, run := range r.Runs {
			fmt.Fprintf(w, "  award %s run %s: %s (%s)\n", run.Award, run.Run, plural(int64(run.Payloads), "payload"), humanBytes(run.Bytes))
		}
		if r.Shared > 0 {
			fmt.Fprintf(w, "kept %s that a run of a kept award uses too\n", plural(int64(r.Shared), "payload"))
		}
		if r.Already > 0 {
			fmt.Fprintf(w, "%s already purged before\n", plural(int64(r.Already), "payload"))
		}
		for _, k := range r.Kept {
			fmt.Fprintf(w, "kept: %s\n", k)
		}
	}
}

// humanBytes is a byte count in the largest unit that keeps it at least 1.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return plural(n, "byte")
	}
	f, units := float64(n), []string{"KiB", "MiB", "GiB", "TiB"}
	i := -1
	for f >= unit && i < len(units)-1 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", f, units[i])
}

// plainError words a domain error for a person at a terminal: its message,
// and the flag at fault when it names a field ("--final-report: ..."),
// not the code=... form meant for logs.
func plainError(err error) string {
	var e *auditd.Error
	if !errors.As(err, &e) {
		return err.Error()
	}
	if e.Field == "" {
		return e.Message
	}
	return "--" + strings.ReplaceAll(e.Field, "_", "-") + ": " + e.Message
}

// awardRunCount counts the runs of an award (FAIN) from their run.started
// events.
func awardRunCount(l retention.Ledger, fain string) (int64, error) {
	var n int64
	err := l.Scan(1, 0, func(e *auditd.Event) error {
		if e.Type != auditd.EventRunStarted {
			return nil
		}
		var d struct {
			Award auditd.Award `json:"award"`
		}
		if json.Unmarshal([]byte(e.Detail), &d) == nil && d.Award.FAIN == fain {
			n++
		}
		return nil
	})
	return n, err
}

// writeRetentionStatus writes an award's retention as sentences: dates as
// days, holds one a line, and why a purge is or is not allowed now.
func writeRetentionStatus(w io.Writer, st retention.Status, runs int64, now time.Time) {
	day := func(t time.Time) string { return t.UTC().Format(time.DateOnly) }
	fmt.Fprintf(w, "award %s (%s in the ledger)\n", st.Award.FAIN, plural(runs, "run"))
	if st.Set {
		fmt.Fprintf(w, "retention: records kept until %s (final financial report %s; recorded in event %d)\n",
			day(st.Award.RetainUntil), day(st.Award.FinalReport), st.Award.Seq)
	} else {
		fmt.Fprintf(w, "retention: no date recorded, so its records are kept (auditd retention set --award %s --final-report DATE records one)\n", st.Award.FAIN)
	}
	active := 0
	for _, h := range st.Holds {
		if h.Active() {
			active++
		}
	}
	if len(st.Holds) == 0 {
		fmt.Fprintln(w, "legal holds: none")
	} else {
		fmt.Fprintf(w, "legal holds: %d active, %d released\n", active, len(st.Holds)-active)
		for _, h := range st.Holds {
			if h.Active() {
				fmt.Fprintf(w, "  %s  active since %s, placed by %s: %q\n", h.ID, day(h.PlacedAt), h.PlacedBy, h.Reason)
			} else {
				fmt.Fprintf(w, "  %s  released %s by %s (%q); placed %s by %s: %q\n", h.ID, day(h.ReleasedAt), h.ReleasedBy, h.ReleaseReason, day(h.PlacedAt), h.PlacedBy, h.Reason)
			}
		}
	}
	switch {
	case st.Purgeable:
		fmt.Fprintln(w, "purge: allowed now (auditd retention purge --award "+st.Award.FAIN+" --dry-run shows what it would delete)")
	case !st.Set:
		fmt.Fprintln(w, "purge: not allowed: no retention date is recorded")
	case active > 0:
		fmt.Fprintf(w, "purge: not allowed while %s stands\n", plural(int64(active), "legal hold"))
	case now.Before(st.Award.RetainUntil):
		fmt.Fprintf(w, "purge: not allowed before %s\n", day(st.Award.RetainUntil))
	default:
		fmt.Fprintln(w, "purge: not allowed")
	}
}

// readLedger is the ledger of a read-only file as the retention Keeper
// reads it (for the workbook's Retention sheet): it records nothing.
type readLedger struct{ *ledger.Reader }

func (readLedger) Append(context.Context, auditd.Event) (auditd.Event, error) {
	return auditd.Event{}, errors.New("read-only ledger")
}
