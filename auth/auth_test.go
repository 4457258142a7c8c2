package auth_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	bolt "go.etcd.io/bbolt"
)

// recorder is an auditd.Appender that keeps events, or fails on demand.
type recorder struct {
	mu     sync.Mutex
	events []auditd.Event
	fail   error
}

func (r *recorder) Append(_ context.Context, e auditd.Event) (auditd.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.fail != nil {
		return auditd.Event{}, r.fail
	}
	e.Seq = uint64(len(r.events) + 1)
	r.events = append(r.events, e)
	return e, nil
}

func mustOpenStore(tb testing.TB) (*auth.Store, *recorder, string) {
	tb.Helper()
	dir := tb.TempDir()
	db, err := bolt.Open(filepath.Join(dir, "auditd.db"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { db.Close() })
	rec := &recorder{}
	s, err := auth.NewStore(db, rec)
	if err != nil {
		tb.Fatal(err)
	}
	return s, rec, dir
}

func TestRoleAllows(t *testing.T) {
	cases := []struct {
		have, need auth.Role
		want       bool
	}{
		{auth.RoleAdmin, auth.RoleAdmin, true},
		{auth.RoleAdmin, auth.RoleAuditor, true},
		{auth.RoleOperator, auth.RoleAdmin, false},
		{auth.RoleOperator, auth.RoleOperator, true},
		{auth.RoleAuditor, auth.RoleOperator, false},
		{auth.Role("root"), auth.RoleAuditor, false},
		{auth.Role(""), auth.RoleAuditor, false},
	}
	for _, c := range cases {
		if got := c.have.Allows(c.need); got != c.want {
			t.Errorf("%q.Allows(%q) = %v, want %v", c.have, c.need, got, c.want)
		}
	}
}

func TestCreateAuthenticateRevoke(t *testing.T) {
	s, rec, _ := mustOpenStore(t)
	ctx := context.Background()
	admin, _, err := s.Create(ctx, "root", auth.RoleAdmin, "setup")
	if err != nil {
		t.Fatal(err)
	}
	tok, secret, err := s.Create(ctx, "ci", auth.RoleOperator, admin.Principal())
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Authenticate(secret)
	if err != nil || got.ID != tok.ID || got.Role != auth.RoleOperator {
		t.Fatalf("authenticate: %+v %v", got, err)
	}
	for _, bad := range []string{"", secret + "x", strings.TrimPrefix(secret, auth.SecretPrefix)} {
		if _, err := s.Authenticate(bad); auditd.ErrorCode(err) != auditd.EUNAUTHORIZED {
			t.Errorf("authenticate(%q): %v, want unauthorized", bad, err)
		}
	}
	if _, changed, err := s.Revoke(ctx, tok.ID, admin.Principal()); err != nil || !changed {
		t.Fatalf("revoke: %v %v", changed, err)
	}
	if _, err := s.Authenticate(secret); auditd.ErrorCode(err) != auditd.EUNAUTHORIZED {
		t.Fatalf("revoked token authenticates: %v", err)
	}
	if _, changed, err := s.Revoke(ctx, tok.ID, admin.Principal()); err != nil || changed {
		t.Fatalf("second revoke: changed %v err %v", changed, err)
	}
	if _, _, err := s.Revoke(ctx, "tok_missing", "x"); auditd.ErrorCode(err) != auditd.ENOTFOUND {
		t.Fatalf("revoke unknown: %v", err)
	}
	if _, _, err := s.Revoke(ctx, admin.ID, "x"); auditd.ErrorCode(err) != auditd.ECONFLICT {
		t.Fatalf("revoke last admin: %v", err)
	}
	if len(rec.events) != 3 {
		t.Fatalf("%d events, want 3 (two creates, one revoke)", len(rec.events))
	}
	for _, e := range rec.events {
		if e.Type != auditd.EventTokenChanged || strings.Contains(e.Detail, secret) {
			t.Errorf("event %+v", e)
		}
	}
	toks, err := s.List()
	if err != nil || len(toks) != 2 || !toks[1].Revoked() {
		t.Fatalf("list: %+v %v", toks, err)
	}
}

// TestChangeUndoneWhenLedgerFails: a token change and its event succeed or
// fail together.
func TestChangeUndoneWhenLedgerFails(t *testing.T) {
	s, rec, _ := mustOpenStore(t)
	ctx := context.Background()
	if _, _, err := s.Create(ctx, "a1", auth.RoleAdmin, "setup"); err != nil {
		t.Fatal(err)
	}
	tok, secret, err := s.Create(ctx, "a2", auth.RoleAdmin, "setup")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(secret); err != nil { // known to Authenticate before the failed revoke
		t.Fatal(err)
	}
	rec.fail = errors.New("ledger down")
	if _, _, err := s.Create(ctx, "ghost", auth.RoleAuditor, "x"); err == nil {
		t.Fatal("create succeeded without its event")
	}
	if _, _, err := s.Revoke(ctx, tok.ID, "x"); err == nil {
		t.Fatal("revoke succeeded without its event")
	}
	toks, err := s.List()
	if err != nil || len(toks) != 2 {
		t.Fatalf("list after failed create: %d tokens, %v", len(toks), err)
	}
	if _, err := s.Authenticate(secret); err != nil {
		t.Fatalf("failed revoke left the token revoked: %v", err)
	}
}

// Authenticate keeps what it read of the tokens it was shown; a revoke
// retires it all: no check that starts after Revoke returns passes, while
// others check the same token all along.
func TestRevokeRefusesAKnownToken(t *testing.T) {
	s, _, _ := mustOpenStore(t)
	ctx := context.Background()
	admin, _, err := s.Create(ctx, "root", auth.RoleAdmin, "setup")
	if err != nil {
		t.Fatal(err)
	}
	tok, secret, err := s.Create(ctx, "fleet", auth.RoleOperator, admin.Principal())
	if err != nil {
		t.Fatal(err)
	}
	var revoked atomic.Bool
	var passedAfter, checks atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				after := revoked.Load()
				_, err := s.Authenticate(secret)
				checks.Add(1)
				if after && err == nil {
					passedAfter.Add(1)
				}
			}
		}()
	}
	for checks.Load() < 1000 {
		runtime.Gosched()
	}
	if _, changed, err := s.Revoke(ctx, tok.ID, admin.Principal()); err != nil || !changed {
		t.Fatalf("revoke: %v %v", changed, err)
	}
	revoked.Store(true)
	for at := checks.Load(); checks.Load() < at+1000; {
		runtime.Gosched()
	}
	close(stop)
	wg.Wait()
	if n := passedAfter.Load(); n > 0 {
		t.Fatalf("%d checks that started after Revoke returned passed", n)
	}
	if _, err := s.Authenticate(secret); auditd.ErrorCode(err) != auditd.EUNAUTHORIZED {
		t.Fatalf("revoked token authenticates: %v", err)
	}
}

func TestBootstrap(t *testing.T) {
	ctx := context.Background()
	t.Run("FromEnvironment", func(t *testing.T) {
		s, rec, dir := mustOpenStore(t)
		env := map[string]string{auth.BootstrapEnv: "operator-chosen-secret-0123456789"}
		secret, err := auth.Bootstrap(ctx, s, dir, func(k string) string { return env[k] })
		if err != nil || secret != "" {
			t.Fatalf("bootstrap: %q %v; want no secret to print", secret, err)
		}
		tok, err := s.Authenticate(env[auth.BootstrapEnv])
		if err != nil || tok.Role != auth.RoleAdmin {
			t.Fatalf("env token: %+v %v", tok, err)
		}
		if _, err := os.Stat(filepath.Join(dir, auth.BootstrapFile)); !os.IsNotExist(err) {
			t.Errorf("bootstrap file written although the secret came from the environment: %v", err)
		}
		if len(rec.events) != 1 || rec.events[0].Principal != auth.BootstrapPrincipal {
			t.Errorf("events %+v", rec.events)
		}
	})
	t.Run("Generated", func(t *testing.T) {
		s, _, dir := mustOpenStore(t)
		secret, err := auth.Bootstrap(ctx, s, dir, func(string) string { return "" })
		if err != nil || !strings.HasPrefix(secret, auth.SecretPrefix) {
			t.Fatalf("bootstrap: %q %v", secret, err)
		}
		path := filepath.Join(dir, auth.BootstrapFile)
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("bootstrap file: %v %v, want 0600", fi, err)
		}
		b, _ := os.ReadFile(path)
		if strings.TrimSpace(string(b)) != secret {
			t.Errorf("file holds %q", b)
		}
		if _, err := s.Authenticate(secret); err != nil {
			t.Fatal(err)
		}
		again, err := auth.Bootstrap(ctx, s, dir, func(string) string { return "" })
		if err != nil || again != "" {
			t.Fatalf("second bootstrap: %q %v; want nothing", again, err)
		}
	})
	t.Run("ShortEnvironmentSecret", func(t *testing.T) {
		s, _, dir := mustOpenStore(t)
		if _, err := auth.Bootstrap(ctx, s, dir, func(string) string { return "short" }); err == nil {
			t.Fatal("a short bootstrap secret was accepted")
		}
		if empty, _ := s.Empty(); !empty {
			t.Error("a refused bootstrap stored a token")
		}
	})
}

// TestListKeepsCreationOrderWithinAMillisecond: ids minted at the same
// instant still sort in the order the tokens were made, so List's "oldest
// first" holds on a fast machine too.
func TestListKeepsCreationOrderWithinAMillisecond(t *testing.T) {
	s, _, _ := mustOpenStore(t)
	at := time.Date(2026, 11, 30, 1, 30, 7, 954_000_000, time.UTC)
	s.Now = func() time.Time { return at }
	ctx := context.Background()
	var want []string
	for i := range 32 {
		tok, _, err := s.Create(ctx, fmt.Sprintf("t%02d", i), auth.RoleAdmin, "setup")
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, tok.Name)
	}
	toks, err := s.List()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tok := range toks {
		got = append(got, tok.Name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List order %v, want creation order %v", got, want)
	}
}

// BenchmarkAuthenticate is the token check every API request and every
// proxied request makes, for a known token among a few hundred.
func BenchmarkAuthenticate(b *testing.B) {
	s, _, _ := mustOpenStore(b)
	ctx := context.Background()
	var secret string
	for i := range 300 {
		_, sec, err := s.Create(ctx, fmt.Sprint("pipeline-", i), auth.RoleOperator, "setup")
		if err != nil {
			b.Fatal(err)
		}
		if i == 150 {
			secret = sec
		}
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Authenticate(secret); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
