package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestStopperStopsLastStartedFirst: serve pushes each part as it starts it
// (the ledger, the demo upstreams, the fetch loop, the API), so whichever
// return it takes, the loop is drained before the ledger is closed; a part
// that fails to stop is logged and the rest are stopped still, under one
// deadline.
func TestStopperStopsLastStartedFirst(t *testing.T) {
	var logs bytes.Buffer
	s := &stopper{log: slog.New(slog.NewTextHandler(&logs, nil))}
	var order []string
	var deadlines []bool
	for _, what := range []string{"close ledger", "drain fetch loop", "shut down API"} {
		s.push(what, func(ctx context.Context) error {
			order = append(order, what)
			_, ok := ctx.Deadline()
			deadlines = append(deadlines, ok)
			if what == "drain fetch loop" {
				return errors.New("drain timed out")
			}
			return nil
		})
	}
	s.run()
	if want := []string{"shut down API", "drain fetch loop", "close ledger"}; !reflect.DeepEqual(order, want) {
		t.Errorf("stopped in the order %q, want %q", order, want)
	}
	if !reflect.DeepEqual(deadlines, []bool{true, true, true}) {
		t.Errorf("steps ran with deadlines %v", deadlines)
	}
	if !strings.Contains(logs.String(), "drain fetch loop") || !strings.Contains(logs.String(), "drain timed out") {
		t.Errorf("the failed step was not logged: %s", logs.String())
	}
}

// A configuration file serve refuses leaves nothing behind: no data
// directory, no key.
func TestServeRefusedConfigCreatesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	cfg := filepath.Join(t.TempDir(), "sources.yaml")
	if err := os.WriteFile(cfg, []byte("sources:\n  - id: a\n    base_url: not a url\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut := runCmd(t, "serve", "--data", dir, "--addr", "127.0.0.1:0", "--config", cfg)
	if code != 1 || !strings.Contains(errOut, "base_url") {
		t.Fatalf("exit %d, want 1 naming the field:\n%s", code, errOut)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the refused config left %s behind (%v)", dir, err)
	}
}

// Fleet options serve refuses leave nothing behind either, each named: a
// node name, a lag or an advertised URL with no etcd to join (in the flags
// or the file), a negative lag, a bad node name, and a listener no other
// node could reach.
func TestServeRefusedFleetOptionsCreateNothing(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(cfg, []byte("fleet:\n  node: east-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	const etcd = "http://10.255.255.1:2379" // never dialled: refused first
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--node", "east-1"}, "--node without --fleet-etcd"},
		{[]string{"--config", cfg}, "--node without --fleet-etcd"},
		{[]string{"--fleet-lag", "40ms", "--fleet-advertise", "http://east-1:8080"}, "--fleet-advertise, --fleet-lag without --fleet-etcd"},
		{[]string{"--fleet-etcd", etcd, "--node", "east-1", "--fleet-lag", "-1s"}, "want a duration of 0 or more"},
		{[]string{"--fleet-etcd", etcd, "--node", "east/1"}, "want 1 to 64 letters"},
		{[]string{"--fleet-etcd", etcd}, "--node is required"},
		{[]string{"--fleet-etcd", etcd, "--node", "east-1", "--addr", "0.0.0.0:0"}, "listens on every address"},
		{[]string{"--fleet-etcd", etcd, "--node", "east-1"}, "listens on loopback (127.0.0.1:"},
	} {
		dir := filepath.Join(t.TempDir(), "data")
		args := append([]string{"serve", "--data", dir, "--addr", "127.0.0.1:0"}, tc.args...)
		code, _, errOut := runCmd(t, args...)
		if code != 1 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, want 1 saying %q:\n%s", tc.args, code, tc.want, errOut)
		}
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%v left %s behind (%v)", tc.args, dir, err)
		}
	}
}

// serve refuses a damaged data file at start, before bbolt maps it, and
// says to run verify.
func TestServeRefusesDamagedFile(t *testing.T) {
	dir, _ := mustLedgerDir(t, 20)
	path := filepath.Join(dir, dbFile)
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	// Cut below the high-water mark: mapped, its missing pages would fault.
	if err := os.Truncate(path, 3*4096); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCmd(t, "serve", "--data", dir, "--addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(errOut, "damaged") || !strings.Contains(errOut, "auditd verify --data "+dir) {
		t.Fatalf("exit %d (file of %d bytes cut to %d), want 1 pointing to verify:\n%s%s", code, fi.Size(), 3*4096, out, errOut)
	}
	code, out, _ = runCmd(t, "verify", "--data", dir)
	if code != 1 || !strings.Contains(out, "truncated") {
		t.Fatalf("verify exit %d, want 1 saying the file is truncated:\n%s", code, out)
	}
}

// -h is a question, not a mistake: exit 0, for the command and for each
// subcommand; auditd version prints the build's version.
func TestHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"help"}, {"serve", "-h"}, {"verify", "-h"}, {"reconcile", "-h"}, {"export", "-h"}, {"retention", "set", "-h"}} {
		if code, _, errOut := runCmd(t, args...); code != 0 {
			t.Errorf("auditd %s: exit %d, want 0\n%s", strings.Join(args, " "), code, errOut)
		}
	}
	if code, _, _ := runCmd(t); code != 2 {
		t.Errorf("auditd with no command: exit %d, want 2", code)
	}
	old := version
	version = "v1.2.3-test"
	defer func() { version = old }()
	if code, out, _ := runCmd(t, "version"); code != 0 || out != "auditd v1.2.3-test\n" {
		t.Errorf("auditd version: exit %d, %q", code, out)
	}
}

// serve binds its address before it creates or changes anything in the
// data directory: on a port in use it fails creating no directory, no
// admin token and no ledger event, and an existing data directory is left
// as it was.
func TestServeTakenPortCreatesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := filepath.Join(t.TempDir(), "data")
	code, _, errOut := runCmd(t, "serve", "--data", dir, "--addr", ln.Addr().String())
	if code != 1 || !strings.Contains(errOut, "listen") {
		t.Fatalf("exit %d, want 1 saying it cannot listen:\n%s", code, errOut)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("serve on a taken port left %s behind (%v)", dir, err)
	}

	existing, _ := mustLedgerDir(t, 5)
	before := dirState(t, existing)
	if code, _, errOut := runCmd(t, "serve", "--data", existing, "--addr", ln.Addr().String()); code != 1 {
		t.Fatalf("exit %d, want 1:\n%s", code, errOut)
	}
	if after := dirState(t, existing); !reflect.DeepEqual(after, before) {
		t.Errorf("serve on a taken port changed the data directory:\nbefore %v\nafter  %v", before, after)
	}
}

// dirState is each file of dir (relative path) with its size and
// modification time.
func dirState(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%d %s", fi.Size(), fi.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// serve that fails after the fetch loop has started (here: a witness key
// that does not parse, read when the API is wired) stops what it started,
// in order, before it returns: the bbolt file is closed (verify opens it
// at once) and the ledger intact.
func TestServeClosesWhatItStartedOnError(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	t.Setenv("AUDITD_BOOTSTRAP_TOKEN", "serve-error-admin-token-01234567")
	code, _, errOut := runCmd(t, "serve", "--data", dir, "--addr", "127.0.0.1:0", "--witness", "not-a-witness-key")
	if code != 1 || !strings.Contains(errOut, "witness") {
		t.Fatalf("exit %d, want 1 refusing the witness key:\n%s", code, errOut)
	}
	if !strings.Contains(errOut, "stopped") {
		t.Errorf("serve did not stop what it started:\n%s", errOut)
	}
	code, out, errOut := runCmd(t, "verify", "--data", dir)
	if code != 0 || !strings.Contains(out, "intact") {
		t.Fatalf("verify after the failed start: exit %d\n%s%s", code, out, errOut)
	}
}

// serve refuses a node name that cannot be part of the fleet's etcd keys
// and values, before it dials etcd, and stops what it started.
func TestServeRefusesABadNodeName(t *testing.T) {
	t.Setenv("AUDITD_BOOTSTRAP_TOKEN", "serve-error-admin-token-01234567")
	for _, name := range []string{"node 1", "node/1", strings.Repeat("n", 65), "nœud"} {
		dir := filepath.Join(t.TempDir(), "data")
		code, _, errOut := runCmd(t, "serve", "--data", dir, "--addr", "127.0.0.1:0", "--fleet-etcd", "127.0.0.1:1", "--node", name)
		if code != 1 || !strings.Contains(errOut, "--node") || strings.Contains(errOut, "does not answer") {
			t.Errorf("--node %q: exit %d, want 1 refusing the name before etcd is dialled:\n%s", name, code, errOut)
		}
	}
	for _, name := range []string{"node1", "a", "n-1.east_2", strings.Repeat("n", 64)} {
		if !validNodeName(name) {
			t.Errorf("validNodeName(%q) = false, want true", name)
		}
	}
}
