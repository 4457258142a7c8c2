package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

func TestProveThenCheckOffline(t *testing.T) {
	dir, _ := mustLedgerDir(t, 9)
	var proof, stderr bytes.Buffer
	if code := run(context.Background(), []string{"prove", "--data", dir, "--seq", "6"}, &proof, &stderr); code != 0 {
		t.Fatalf("prove: exit %d: %s", code, stderr.String())
	}
	pub, err := os.ReadFile(filepath.Join(dir, "ledger.pub"))
	if err != nil {
		t.Fatal(err)
	}
	// Offline: only the proof file and the public key, no data directory.
	check := func(t *testing.T, text []byte) (int, string) {
		path := filepath.Join(t.TempDir(), "proof.txt")
		if err := os.WriteFile(path, text, 0o600); err != nil {
			t.Fatal(err)
		}
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"prove", "--check", path, "--key", strings.TrimSpace(string(pub)), "--data", t.TempDir()}, &stdout, &stderr)
		return code, stdout.String() + stderr.String()
	}
	for _, tc := range []struct {
		name     string
		text     []byte
		wantCode int
		wantOut  string
	}{
		{"Holds", proof.Bytes(), 0, "event 6 is in the ledger"},
		{"OtherSeq", bytes.Replace(proof.Bytes(), []byte("seq 6\n"), []byte("seq 5\n"), 1), 1, "does NOT hold"},
		{"Garbage", []byte("hello\n\n"), 1, "does NOT hold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out := check(t, tc.text)
			if code != tc.wantCode || !strings.Contains(out, tc.wantOut) {
				t.Fatalf("exit %d, want %d with %q:\n%s", code, tc.wantCode, tc.wantOut, out)
			}
		})
	}
	t.Run("Summary", func(t *testing.T) {
		_, out := check(t, proof.Bytes())
		// A field a line, as the API names them, times in RFC 3339; never
		// Go's own rendering of the struct, nor the chain hashes a proof
		// does not carry (they would read as zeros).
		for _, want := range []string{"\nseq ", "\ntype ", "\ntime ", "\nmethod ", "\npath "} {
			if !strings.Contains(out, want) {
				t.Errorf("summary lacks %q:\n%s", strings.TrimSpace(want), out)
			}
		}
		for _, bad := range []string{"PrevHash", "{", "[", "hash", "0000000000"} {
			if strings.Contains(out, bad) {
				t.Errorf("summary holds %q:\n%s", bad, out)
			}
		}
		if !regexp.MustCompile(`\nseq +6\n`).MatchString(out) || !regexp.MustCompile(`\ntime +\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\n`).MatchString(out) {
			t.Errorf("summary's seq or time is not as the API shows it:\n%s", out)
		}
	})
	t.Run("UnknownSeq", func(t *testing.T) {
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), []string{"prove", "--data", dir, "--seq", "10"}, &stdout, &stderr); code != 2 {
			t.Fatalf("exit %d for an event past the head, want 2", code)
		}
	})
}
