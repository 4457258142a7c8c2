package ledger_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/auditd/auditd/ledger"
)

// crashDirEnv tells the test binary, started again as a child, to append
// until killed.
const crashDirEnv = "LEDGER_CRASH_CHILD_DIR"

// TestCrashChild is the child side of TestCrashMidAppend: it appends from
// several goroutines and prints "ack SEQ HASH" for each acknowledged event.
func TestCrashChild(t *testing.T) {
	dir := os.Getenv(crashDirEnv)
	if dir == "" {
		t.Skip("runs only as the child of TestCrashMidAppend")
	}
	l := MustOpen(t, MustOpenDBAt(t, filepath.Join(dir, "auditd.db")), ledger.Options{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				e, err := l.Append(context.Background(), sampleEvent(fmt.Sprint("run-", w), i))
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				fmt.Printf("ack %d %x\n", e.Seq, e.Hash)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
}

// TestCrashMidAppend kills a child with SIGKILL while it appends, then
// reopens its file: every event the child saw acknowledged is there with
// the same hash, and the ledger verifies.
func TestCrashMidAppend(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a child process")
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDirEnv+"="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := make(map[uint64]string)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 3 || f[0] != "ack" {
			continue
		}
		seq, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			t.Fatalf("child printed %q", sc.Text())
		}
		acked[seq] = f[2]
		if len(acked) == 300 {
			// Mid-append: four appenders are in flight right now.
			if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
		}
	}
	err = cmd.Wait()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child was not killed: %v", err)
	}
	if len(acked) < 300 {
		t.Fatalf("child acknowledged only %d events", len(acked))
	}

	db := MustOpenDBAt(t, filepath.Join(dir, "auditd.db"))
	l := MustOpen(t, db, ledger.Options{})
	r := mustVerify(t, db, l.PublicKey(), nil)
	for seq, hash := range acked {
		e, err := l.Event(seq)
		if err != nil {
			t.Fatalf("acknowledged event %d lost: %v", seq, err)
		}
		if hex.EncodeToString(e.Hash[:]) != hash {
			t.Fatalf("event %d hash changed across the crash", seq)
		}
	}
	t.Logf("%d acknowledged, %d on disk after SIGKILL", len(acked), r.Events)
}
