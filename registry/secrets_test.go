package registry_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/seal"
)

// TestPutCreatesOnce: of concurrent puts of one new id, exactly one says
// it created the source.
func TestPutCreatesOnce(t *testing.T) {
	h := newHarness(t, registry.Options{})
	var created atomic.Int32
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			c, err := h.reg.Put(context.Background(), "ops", auditd.Source{ID: "racer", BaseURL: "https://racer.example"})
			if err != nil {
				t.Error(err)
			}
			if c {
				created.Add(1)
			}
		})
	}
	wg.Wait()
	if n := created.Load(); n != 1 {
		t.Fatalf("%d puts created the source, want 1", n)
	}
}

// TestHeadersSealedAtRest: a source's header values are never in the
// bbolt file's bytes when a sealing key is set, read back after a reopen
// under the same key, and refused (never sent without them) under another.
func TestHeadersSealedAtRest(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "auditd.db")
	box, err := seal.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	const secret = "Bearer HEADERSECRET-31337"
	db := mustOpenDBAt(t, path)
	led := &memLedger{}
	reg, err := registry.Open(db, registry.Options{Ledger: led, Seal: box})
	if err != nil {
		t.Fatal(err)
	}
	if err := reg.PutSource(context.Background(), "ops", auditd.Source{ID: "s", BaseURL: "https://s.example", Headers: map[string]string{"Authorization": secret, "X-Api-Key": "k2"}}); err != nil {
		t.Fatal(err)
	}
	if names, err := reg.HeaderNames("s"); err != nil || len(names) != 2 || names[0] != "Authorization" {
		t.Fatalf("HeaderNames = %v, %v", names, err)
	}
	db.Close()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("HEADERSECRET")) {
		t.Fatal("the bbolt file holds a header value in the clear")
	}
	for _, tc := range []struct {
		name string
		box  *seal.Box
		ok   bool
	}{{"SameKey", box, true}, {"OtherKey", seal.Ephemeral(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			db := mustOpenDBAt(t, path)
			defer db.Close()
			reg, err := registry.Open(db, registry.Options{Ledger: led, Seal: tc.box})
			if err != nil {
				t.Fatal(err)
			}
			h, err := reg.RequestHeaders("s")
			if tc.ok && (err != nil || h["Authorization"] != secret) {
				t.Fatalf("RequestHeaders = %v, %v", h, err)
			}
			if !tc.ok && err == nil {
				t.Fatalf("headers sealed under another key opened: %v", h)
			}
		})
	}
}

func TestCheckSourceRefusesCredentialsAndBadURLs(t *testing.T) {
	for _, u := range []string{"http://user:PW@x.example", "https://tok@x.example/", "https://x.example/?api_key=1",
		"https://x.example/?f=json", "httpx://x.example", "http:foo", "http:///p", "ftp://x.example", "http://0x7f000001",
		"http://2130706433", "http://127.1", "https://x.example/#f"} {
		err := registry.CheckSource(auditd.Source{ID: "s", BaseURL: u})
		if auditd.ErrorCode(err) != auditd.EINVALID {
			t.Errorf("CheckSource(%q) = %v, want invalid", u, err)
			continue
		}
		var e *auditd.Error
		if ok := asError(err, &e); !ok || e.Field != "base_url" {
			t.Errorf("CheckSource(%q): field %+v, want base_url", u, e)
		}
	}
	for _, u := range []string{"https://x.example", "http://127.0.0.1:8080/arcgis", "http://[::1]:80/", "https://gis.example.gov/arcgis/rest"} {
		if err := registry.CheckSource(auditd.Source{ID: "s", BaseURL: u}); err != nil {
			t.Errorf("CheckSource(%q) = %v", u, err)
		}
	}
}

func asError(err error, target **auditd.Error) bool { return errors.As(err, target) }

// TestSecretQueriesOffline: a stopped service's file gives each source's
// declared names (auditd export reads them for its second guard).
func TestSecretQueriesOffline(t *testing.T) {
	h := newHarness(t, registry.Options{})
	h.put(t, auditd.Source{ID: "a", SecretQuery: []string{"sq", "sig2"}})
	h.put(t, auditd.Source{ID: "b"})
	got, err := registry.SecretQueries(h.db)
	if err != nil || len(got) != 1 || len(got["a"]) != 2 || got["a"][0] != "sq" {
		t.Fatalf("SecretQueries = %v, %v", got, err)
	}
	empty, err := registry.SecretQueries(MustOpenDB(t))
	if err != nil || len(empty) != 0 {
		t.Fatalf("a file without a registry: %v, %v", empty, err)
	}
}
