package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd/reports/reportstest"
)

// TestEveryCommandHelps: -h, --help and auditd help COMMAND are questions,
// not mistakes: each answers on stdout with a usage and exits 0, for
// every command and every retention subcommand.
func TestEveryCommandHelps(t *testing.T) {
	var asks [][]string
	for _, c := range commands {
		asks = append(asks, []string{c.name, "-h"}, []string{c.name, "--help"}, []string{"help", c.name})
	}
	for _, s := range retentionSubcommands {
		asks = append(asks, []string{"retention", s.name, "-h"}, []string{"help", "retention", s.name})
	}
	asks = append(asks, []string{"-h"}, []string{"--help"}, []string{"help"}, []string{"retention", "help"})
	for _, args := range asks {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, out, errOut := runCmd(t, args...)
			if code != 0 || errOut != "" || !strings.Contains(strings.ToLower(out), "usage") {
				t.Fatalf("exit %d, want 0 with a usage on stdout\nstdout: %s\nstderr: %s", code, out, errOut)
			}
		})
	}
	t.Run("HelpNamesTheCommand", func(t *testing.T) {
		_, out, _ := runCmd(t, "help", "retention", "hold")
		for _, want := range []string{"record retention dates", "usage: auditd retention hold --award FAIN --reason TEXT", "-reason"} {
			if !strings.Contains(out, want) {
				t.Errorf("auditd help retention hold lacks %q:\n%s", want, out)
			}
		}
	})
}

func TestVersion(t *testing.T) {
	old := version
	version = "v1.2.3-test"
	defer func() { version = old }()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		if code, out, errOut := runCmd(t, args...); code != 0 || out != "auditd v1.2.3-test\n" {
			t.Errorf("auditd %s: exit %d, %q %s", strings.Join(args, " "), code, out, errOut)
		}
	}
	if code, out, _ := runCmd(t, "version", "-h"); code != 0 || !strings.Contains(out, "usage: auditd version") {
		t.Errorf("auditd version -h: exit %d, %q", code, out)
	}
}

// TestCommonMistakesSayWhatToDo: each common mistake (a missing flag, a
// value that does not parse, a mistyped flag or subcommand) exits 2 with a
// plain sentence naming the flag as it is typed, never a Go type, an error
// code or the whole flag list.
func TestCommonMistakesSayWhatToDo(t *testing.T) {
	data := reconcileDataDir(t, reportstest.Mutation{})
	run := reportstest.FixtureRun
	proof := filepath.Join(t.TempDir(), "proof.txt")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"ProveNothing", []string{"prove", "--data", data}, "give --seq N to make a proof of event N, or --check FILE"},
		{"ProveSeqZero", []string{"prove", "--data", data, "--seq", "0"}, "--seq 0: sequence numbers start at 1"},
		{"ProveSeqWord", []string{"prove", "--data", data, "--seq", "six"}, `--seq "six": want a whole number`},
		{"ProveBoth", []string{"prove", "--data", data, "--seq", "3", "--check", proof}, "not both"},
		{"ExportNoRun", []string{"export", "--data", data, "--out", t.TempDir()}, "--run is required"},
		{"ExportNoOut", []string{"export", "--data", data, "--run", run}, "--out is required"},
		{"ExportBadTime", []string{"export", "--data", data, "--run", run, "--out", t.TempDir(), "--generated-at", "yesterday"}, `--generated-at "yesterday": want an RFC 3339 time`},
		{"ExportMistypedFlag", []string{"export", "--data", data, "--run", run, "--outt", "x"}, "there is no flag --outt"},
		{"ExportStrayArgument", []string{"export", "--data", data, "--run", run, "book.xlsx"}, `unexpected argument "book.xlsx"`},
		{"ReconcileNoRun", []string{"reconcile", "--data", data}, "--run is required"},
		{"ReconcileNoWhere", []string{"reconcile", "--run", run}, "give exactly one of --server URL"},
		{"ReconcileFormat", []string{"reconcile", "--data", data, "--run", run, "--format", "xml"}, `--format "xml": want table, json or csv`},
		{"ReconcileStaleNoUnit", []string{"reconcile", "--data", data, "--run", run, "--max-stale", "5"}, `--max-stale "5": want a duration such as 90s`},
		{"ReconcileStaleNegative", []string{"reconcile", "--data", data, "--run", run, "--max-stale", "-1h"}, `--max-stale "-1h"`},
		{"ReconcileFlagNoValue", []string{"reconcile", "--data", data, "--run"}, "--run needs a value"},
		{"ReconcileBoolValue", []string{"reconcile", "--data", data, "--run", run, "--allow-partial=maybe"}, `--allow-partial "maybe": want true or false`},
		{"RetentionNoSubcommand", []string{"retention"}, "give a subcommand: set, hold, release, status or purge"},
		{"RetentionMistypedSubcommand", []string{"retention", "purg"}, `there is no subcommand "purg"`},
		{"RetentionNoAward", []string{"retention", "status", "--data", data}, "--award is required"},
		{"RetentionHoldNoReason", []string{"retention", "hold", "--data", data, "--award", "NA24OAR4310001"}, "--reason is required"},
		{"RetentionReleaseNoHold", []string{"retention", "release", "--data", data, "--award", "NA24OAR4310001", "--reason", "closed"}, "--hold is required"},
		{"RetentionSetNoDate", []string{"retention", "set", "--data", data, "--award", "NA24OAR4310001"}, "--final-report is required"},
		{"RetentionSetBadDate", []string{"retention", "set", "--data", data, "--award", "NA24OAR4310001", "--final-report", "30/06/2026"}, `--final-report "30/06/2026": want a date as YYYY-MM-DD`},
		{"RetentionSetBeforeReport", []string{"retention", "set", "--data", data, "--award", "NA24OAR4310001", "--final-report", "2026-06-30", "--retain-until", "2026-01-01"}, "--retain-until: retain_until must not be before final_report"},
		{"VersionArgument", []string{"version", "now"}, `unexpected argument "now"`},
		{"SimNoScenario", []string{"sim"}, "--scenario FILE"},
		{"VerifyPreviousAlone", []string{"verify", "--data", data, "--previous", proof}, "--previous goes with --pack"},
		{"PackNoRun", []string{"pack", "--data", data, "--out", proof}, "give --run (repeatable) or --award"},
		{"ServeLogLevel", []string{"serve", "--data", t.TempDir(), "--log-level", "loud"}, `--log-level "loud"`},
		{"UnknownCommand", []string{"reconcil"}, `unknown command "reconcil"`},
		{"HelpUnknownCommand", []string{"help", "reconcil"}, `unknown command "reconcil"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := runCmd(t, tt.args...)
			if code != 2 || !strings.Contains(errOut, tt.want) {
				t.Fatalf("exit %d, want 2 saying %q\nstdout: %s\nstderr: %s", code, tt.want, out, errOut)
			}
			for _, raw := range []string{"auditd error:", "code=", "field=", "flag provided but not defined", "Usage of", "parse error", "main."} {
				if strings.Contains(errOut, raw) {
					t.Errorf("stderr holds %q, not plain words:\n%s", raw, errOut)
				}
			}
		})
	}
}

// TestRetentionStatusReadsPlainly: status is sentences by default (dates
// as days, never Go's zero time) and JSON with --json; a FAIN no run,
// date or hold names is said to be probably mistyped.
func TestRetentionStatusReadsPlainly(t *testing.T) {
	data := reconcileDataDir(t, reportstest.Mutation{})
	const fain = "NA24OAR4310001"
	code, out, errOut := runCmd(t, "retention", "status", "--data", data, "--award", fain)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, errOut)
	}
	for _, want := range []string{"award NA24OAR4310001 (1 run in the ledger)", "retention: no date recorded", "legal holds: none", "purge: not allowed: no retention date is recorded"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for _, raw := range []string{"0001-01-01", "{", "T00:00:00Z"} {
		if strings.Contains(out, raw) {
			t.Errorf("status holds %q:\n%s", raw, out)
		}
	}

	code, out, errOut = runCmd(t, "retention", "status", "--data", data, "--award", "NA24OAR431OOO1")
	if code != 1 || out != "" || !strings.Contains(errOut, `no run, retention date or legal hold names award "NA24OAR431OOO1": is the FAIN mistyped?`) {
		t.Errorf("mistyped FAIN: exit %d, want 1 saying so\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	// set and hold say what they recorded in sentences, not JSON.
	if code, out, errOut := runCmd(t, "retention", "hold", "--data", data, "--award", fain, "--reason", "single audit FY2024", "--by", "admin:test"); code != 0 ||
		!strings.Contains(out, "award "+fain+": legal hold h") || !strings.Contains(out, `placed by admin:test: "single audit FY2024"`) || strings.Contains(out, "{") {
		t.Fatalf("hold: exit %d, want 0 saying what it placed\n%s%s", code, out, errOut)
	}
	if code, out, errOut := runCmd(t, "retention", "set", "--data", data, "--award", fain, "--final-report", "2024-09-30", "--by", "admin:test"); code != 0 ||
		!strings.Contains(out, "award "+fain+": records kept until 2027-09-30 (final financial report 2024-09-30); recorded in event") {
		t.Fatalf("set: exit %d, want 0 saying what it recorded\n%s%s", code, out, errOut)
	}
	_, out, _ = runCmd(t, "retention", "status", "--data", data, "--award", fain)
	for _, want := range []string{"records kept until 2027-09-30 (final financial report 2024-09-30", "legal holds: 1 active, 0 released",
		`active since ` + time.Now().UTC().Format(time.DateOnly) + `, placed by admin:test: "single audit FY2024"`, "purge: not allowed while 1 legal hold stands"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	_, out, _ = runCmd(t, "retention", "status", "--data", data, "--award", fain, "--json")
	if !strings.Contains(out, `"retain_until": "2027-09-30T00:00:00Z"`) || !strings.Contains(out, `"purgeable": false`) {
		t.Errorf("--json is not the status as JSON:\n%s", out)
	}
}

// TestExportIntoDirectory: --out naming a directory (with or without a
// trailing slash, existing or not yet) writes evidence-RUN.xlsx into it.
func TestExportIntoDirectory(t *testing.T) {
	data := reconcileDataDir(t, reportstest.Mutation{})
	run := reportstest.FixtureRun
	existing := t.TempDir()
	for _, out := range []string{existing, existing + "/", filepath.Join(t.TempDir(), "new") + "/"} {
		code, stdout, stderr := runCmd(t, "export", "--data", data, "--run", run, "--out", out, "--generated-at", "none")
		want := filepath.Join(out, "evidence-"+run+".xlsx")
		if code != 0 {
			t.Fatalf("--out %s: exit %d\n%s%s", out, code, stdout, stderr)
		}
		if fi, err := os.Stat(want); err != nil || fi.Size() == 0 {
			t.Errorf("--out %s: %s not written: %v", out, want, err)
		}
		if !strings.Contains(stdout, "wrote "+want+": 11 sheets, ") || !strings.Contains(stdout, "balanced=true") {
			t.Errorf("--out %s: stdout %q", out, stdout)
		}
	}
}

// TestReconcileSaysWhy: the table names what each identity holds to, ages
// as a person says them, the items served from cache summed up by source
// (each listed with --list-cached), and why the exit status is 1 on
// stdout as well as stderr.
func TestReconcileSaysWhy(t *testing.T) {
	data := reconcileDataDir(t, reportstest.Mutation{})
	run := reportstest.FixtureRun
	code, out, errOut := runCmd(t, "reconcile", "--data", data, "--run", run, "--max-stale", "1h")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		"BALANCED: every identity holds",
		"every request was within the limit in force",
		"served from cache: 1 item\n",
		"grants  1      1d ",
		"(--list-cached lists every item)",
		"\nexit 1:\n",
		"run " + run + " is partial, not succeeded (--allow-partial accepts it)",
		"1 item was served from copies older than --max-stale 1h; the oldest, item",
		"was 1d old, fetched by run ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(errOut, "older than --max-stale 1h") {
		t.Errorf("stderr lacks the reason:\n%s", errOut)
	}
	if strings.Contains(out, "SEQ  SOURCE  ITEM") {
		t.Errorf("items listed one by one without --list-cached:\n%s", out)
	}
	_, out, _ = runCmd(t, "reconcile", "--data", data, "--run", run, "--allow-partial", "--list-cached")
	if !strings.Contains(out, "SEQ  SOURCE  ITEM") || !strings.Contains(out, "  1d  ") {
		t.Errorf("--list-cached does not list the item with its age:\n%s", out)
	}
	for _, m := range reportstest.Mutations() {
		if m.Name != "R9/OverLimit" {
			continue
		}
		code, out, _ := runCmd(t, "reconcile", "--data", reconcileDataDir(t, m), "--run", run, "--allow-partial")
		if code != 1 || !strings.Contains(out, "exit 1:\n  the reconciliation does not balance: R9 failed") {
			t.Errorf("unbalanced: exit %d, want 1 saying why on stdout\n%s", code, out)
		}
	}
}

func TestHumanDuration(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{400 * time.Microsecond, "under 1ms"},
		{250 * time.Millisecond, "250ms"},
		{999700 * time.Microsecond, "1s"},
		{1500 * time.Millisecond, "1.5s"},
		{21006751691, "21s"},
		{59600 * time.Millisecond, "1m"},
		{90 * time.Second, "1m 30s"},
		{2 * time.Minute, "2m"},
		{time.Hour, "1h"},
		{3*time.Hour + 5*time.Minute, "3h 5m"},
		{24 * time.Hour, "1d"},
		{52 * time.Hour, "2d 4h"},
	} {
		if got := humanDuration(tt.d); got != tt.want {
			t.Errorf("humanDuration(%v) = %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestPlural(t *testing.T) {
	if got := plural(1, "run") + ", " + plural(2, "run") + ", " + plural(0, "problem"); got != "1 run, 2 runs, 0 problems" {
		t.Errorf("plural: %q", got)
	}
}
