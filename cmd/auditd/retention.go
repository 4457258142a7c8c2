package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/retention"
	"github.com/auditd/auditd/staging"
)

// runRetention is the admin's retention command, offline on a stopped
// server's data directory: record an award's final report date, place
// and release legal holds, show an award's status, purge what retention
// allows. Each change is a ledger event naming --by.
func runRetention(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintf(stderr, "auditd retention: %v\n", err)
		return 2
	}
	if len(args) == 0 {
		return fail(errors.New("give a subcommand: set, hold, release, status or purge"))
	}
	sub := args[0]
	fs := flag.NewFlagSet("retention "+sub, flag.ContinueOnError)
	fs.SetOutput(stderr)
	data := fs.String("data", "./data", "data `directory` of a stopped auditd")
	award := fs.String("award", "", "the award's `FAIN`")
	by := fs.String("by", "", "who is acting (recorded as the principal); default cli:$USER")
	var finalReport, retainUntil, reason, hold *string
	var dryRun *bool
	switch sub {
	case "set":
		finalReport = fs.String("final-report", "", "`date` (YYYY-MM-DD) of the award's final financial report")
		retainUntil = fs.String("retain-until", "", "retention `date` (YYYY-MM-DD); default three years after the final report")
	case "hold":
		reason = fs.String("reason", "", "why: the litigation, claim, audit or written notice")
	case "release":
		hold = fs.String("hold", "", "the hold's `id` (retention status lists them)")
		reason = fs.String("reason", "", "why the hold ends")
	case "status":
	case "purge":
		dryRun = fs.Bool("dry-run", false, "say what would be purged; record and delete nothing")
	default:
		return fail(fmt.Errorf("unknown subcommand %q: set, hold, release, status or purge", sub))
	}
	if err := fs.Parse(args[1:]); err != nil {
		return parseStatus(err)
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	if *award == "" && sub != "purge" {
		return fail(errors.New("--award is required"))
	}
	principal := *by
	if principal == "" {
		principal = "cli:" + os.Getenv("USER")
	}
	date := func(name, s string) (time.Time, error) {
		if s == "" {
			return time.Time{}, nil
		}
		t, err := time.Parse(time.DateOnly, s)
		if err != nil {
			return t, fmt.Errorf("--%s: want YYYY-MM-DD: %w", name, err)
		}
		return t, nil
	}

	if _, err := os.Stat(filepath.Join(*data, dbFile)); err != nil {
		return fail(err)
	}
	db, err := openDB(*data, false)
	if err != nil {
		return fail(err)
	}
	defer db.Close()
	led, err := ledger.Open(db, ledger.Options{KeyDir: *data})
	if err != nil {
		return fail(err)
	}
	defer led.Close(context.Background())
	stage, err := staging.Open(db, filepath.Join(*data, payloadsDir))
	if err != nil {
		return fail(err)
	}
	k := retention.New(led, stage)

	var out any
	switch sub {
	case "set":
		fr, err := date("final-report", *finalReport)
		if err != nil {
			return fail(err)
		}
		ru, err := date("retain-until", *retainUntil)
		if err != nil {
			return fail(err)
		}
		out, err = k.SetRetention(ctx, principal, *award, fr, ru)
		if err != nil {
			return fail(err)
		}
	case "hold":
		if out, err = k.PlaceHold(ctx, principal, *award, *reason); err != nil {
			return fail(err)
		}
	case "release":
		if out, err = k.ReleaseHold(ctx, principal, *award, *hold, *reason); err != nil {
			return fail(err)
		}
	case "status":
		if out, err = k.Status(*award); err != nil {
			return fail(err)
		}
	case "purge":
		rep, err := k.Purge(ctx, principal, *award, *dryRun)
		if errors.Is(err, retention.ErrHeld) || errors.Is(err, retention.ErrRetained) || errors.Is(err, retention.ErrNoRetention) {
			fmt.Fprintf(stderr, "auditd retention: purge refused: %v\n", err)
			return 1
		}
		if err != nil {
			return fail(err)
		}
		out = rep
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		return fail(err)
	}
	return 0
}

// readLedger is the ledger of a read-only file as the retention Keeper
// reads it (for the workbook's Retention sheet): it records nothing.
type readLedger struct{ *ledger.Reader }

func (readLedger) Append(context.Context, auditd.Event) (auditd.Event, error) {
	return auditd.Event{}, errors.New("read-only ledger")
}
