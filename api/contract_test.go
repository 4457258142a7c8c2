package api_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
)

// TestIdempotentReplayWithCredential: a retry of a run whose item path
// holds a credential parameter, with the same key and body, is answered
// with the first run (201, Idempotent-Replayed), not a conflict: the
// stored run holds the path redacted, the retry the path as sent.
func TestIdempotentReplayWithCredential(t *testing.T) {
	e := newEnv(t)
	body := runBody(`"key":"k1","source":"county","path":"/x?token=abc"`, "")
	req := request{method: "POST", path: "/v1/runs", secret: e.secret[auth.RoleOperator], body: body, header: map[string]string{"Idempotency-Key": "cred-1"}}
	first := e.do(req)
	if first.status != http.StatusCreated {
		t.Fatalf("first: %d %s", first.status, first.body)
	}
	var created, replay auditd.RunView
	first.decode(t, &created)
	again := e.do(req)
	if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: %d replayed %q, want 201 true; body %s", again.status, again.header.Get("Idempotent-Replayed"), again.body)
	}
	if again.decode(t, &replay); replay.ID != created.ID {
		t.Fatalf("retry answered run %s, want %s", replay.ID, created.ID)
	}
	req.body = runBody(`"key":"k1","source":"county","path":"/x?token=other"`, "")
	if r := e.do(req); r.status != http.StatusCreated || r.header.Get("Idempotent-Replayed") != "true" {
		// The credential's value is not kept, so it cannot tell two
		// requests apart: the same run, as for any other retry.
		t.Fatalf("retry with another credential value: %d %s", r.status, r.body)
	}
	req.body = runBody(`"key":"k1","source":"county","path":"/y?token=abc"`, "")
	if r := e.do(req); r.status != http.StatusConflict {
		t.Fatalf("another path under the key: %d, want 409; body %s", r.status, r.body)
	}
}

// TestLedgerEventsPastTheHead: from past the head is an empty page, as
// the contract says, for a client polling for new events.
func TestLedgerEventsPastTheHead(t *testing.T) {
	e := newEnv(t)
	r := e.do(request{path: fmt.Sprintf("/v1/ledger/events?from=%d", e.head()+1), secret: e.secret[auth.RoleAuditor]})
	var page struct {
		Events []auditd.EventJSON `json:"events"`
	}
	if r.status != http.StatusOK {
		t.Fatalf("%d, want 200; body %s", r.status, r.body)
	}
	if r.decode(t, &page); page.Events == nil || len(page.Events) != 0 {
		t.Fatalf("events %s, want an empty page", r.body)
	}
}

// TestProofOfTheOnlyEvent: the proof of a one-event ledger has no hashes,
// an empty array, not null.
func TestProofOfTheOnlyEvent(t *testing.T) {
	e := newEnv(t)
	e.srv.Integrity = noHashes{e.srv.Integrity}
	r := e.do(request{path: "/v1/ledger/proof/1", secret: e.secret[auth.RoleAuditor]})
	if r.status != http.StatusOK {
		t.Fatalf("%d; body %s", r.status, r.body)
	}
	var p map[string]any
	if r.decode(t, &p); p["hashes"] == nil {
		t.Fatalf("hashes null: %s", r.body)
	}
}

// noHashes proves as a tree of one leaf does: no hashes at all.
type noHashes struct{ api.Integrity }

func (n noHashes) Prove(ctx context.Context, seq uint64) (api.Proof, error) {
	p, err := n.Integrity.Prove(ctx, seq)
	p.Hashes = nil
	return p, err
}

// TestProxiedHeadItem: a proxy-mode run's item of a HEAD request is shown
// as the contract describes it.
func TestProxiedHeadItem(t *testing.T) {
	e := newEnv(t)
	id := e.runs.add(auditd.RunRunning, []auditd.ItemView{{Item: auditd.Item{Key: "h", SourceID: "county", Method: http.MethodHead, Path: "/layer"}}})
	for _, path := range []string{"/v1/runs/" + id + "/items", "/v1/runs/" + id + "/items/h"} {
		if r := e.do(request{path: path, secret: e.secret[auth.RoleAuditor]}); r.status != http.StatusOK {
			t.Fatalf("%s: %d %s", path, r.status, r.body)
		}
	}
}
