package api_test

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	fnote "github.com/transparency-dev/formats/note"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/witness"
)

// testLog serves api.Log from the env's real ledger, as cmd/auditd's
// adapter does.
type testLog struct {
	r  *ledger.Reader
	l  *ledger.Ledger
	st *witness.Store
}

func withLog(witnessKeys ...string) envOption {
	return func(e *env) {
		st, err := witness.Open(e.db, e.ledger.PublicKey(), witnessKeys, ledger.NewReader(e.db))
		if err != nil {
			e.t.Fatal(err)
		}
		e.srv.Log = testLog{ledger.NewReader(e.db), e.ledger, st}
	}
}

func enc(h tlog.Hash) string { return base64.StdEncoding.EncodeToString(h[:]) }

func encs(hs []tlog.Hash) []string {
	out := []string{}
	for _, h := range hs {
		out = append(out, enc(h))
	}
	return out
}

func badSize(err error, field string) error {
	if errors.Is(err, ledger.ErrBadSize) {
		return &auditd.Error{Code: auditd.EINVALID, Field: field, Message: err.Error()}
	}
	return err
}

func (l testLog) Consistency(_ context.Context, old, new uint64) (api.ConsistencyProof, error) {
	p, err := l.r.ConsistencyProof(old, new)
	if err != nil {
		return api.ConsistencyProof{}, badSize(err, "old")
	}
	a, _ := l.r.TreeHash(old)
	b, _ := l.r.TreeHash(new)
	return api.ConsistencyProof{OldSize: old, NewSize: new, OldRoot: enc(a), NewRoot: enc(b), Hashes: encs(p)}, nil
}

func (l testLog) Inclusion(_ context.Context, seq, size uint64) (api.Inclusion, error) {
	p, root, err := l.r.InclusionProof(seq, size)
	if err != nil {
		return api.Inclusion{}, badSize(err, "seq")
	}
	out := api.Inclusion{Seq: seq, LeafIndex: seq - 1, TreeSize: size, RootHash: enc(root), Hashes: encs(p)}
	l.r.ScanRecords(seq, seq, func(rec *ledger.Record) error { out.LeafHash = enc(tlog.RecordHash(rec.Canonical)); return nil })
	return out, nil
}

func (l testLog) Checkpoints(_ context.Context, after uint64, limit int) ([]api.CheckpointInfo, bool, error) {
	var out []api.CheckpointInfo
	more := false
	err := l.r.Checkpoints(after, func(size uint64, msg []byte) bool {
		if len(out) == limit {
			more = true
			return false
		}
		t, _ := ledger.OpenCheckpoint(msg, l.l.PublicKey())
		out = append(out, api.CheckpointInfo{Size: size, Root: enc(t.Root), Time: t.Time, Note: string(msg)})
		return true
	})
	return out, more, err
}

func (l testLog) CheckpointAt(_ context.Context, size uint64) ([]byte, error) {
	if cp, _ := l.st.Get(size); cp != nil {
		return cp, nil
	}
	cp, err := l.r.CheckpointAt(size)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "no checkpoint of size %d", size)
	}
	return cp, err
}

func (l testLog) Cosign(_ context.Context, msg []byte) (api.Cosigned, error) {
	size, names, err := l.st.Add(msg)
	if err != nil {
		return api.Cosigned{}, &auditd.Error{Code: auditd.EINVALID, Field: "body", Message: err.Error()}
	}
	return api.Cosigned{Size: size, Witnesses: names}, nil
}

func (l testLog) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	return l.l.Scan(from, to, fn)
}

// TestLogProofs: consistency and inclusion proofs at chosen sizes verify
// with tlog; bad sizes are 400 problems naming the parameter.
func TestLogProofs(t *testing.T) {
	e := newEnv(t, withLog())
	aud := e.secret[auth.RoleAuditor]
	head := e.head()
	root := func(size uint64) tlog.Hash {
		h, err := ledger.NewReader(e.db).TreeHash(size)
		if err != nil {
			t.Fatal(err)
		}
		return h
	}
	dec := func(ss []string) tlog.TreeProof {
		var out tlog.TreeProof
		for _, s := range ss {
			b, _ := base64.StdEncoding.DecodeString(s)
			out = append(out, tlog.Hash(b))
		}
		return out
	}
	var cp api.ConsistencyProof
	e.do(request{path: "/v1/ledger/consistency?old=3&new=" + strconv.FormatUint(head, 10), secret: aud}).decode(t, &cp)
	if err := tlog.CheckTree(dec(cp.Hashes), int64(head), root(head), 3, root(3)); err != nil || cp.OldRoot != enc(root(3)) {
		t.Errorf("consistency 3 to %d does not verify: %v", head, err)
	}
	var inc api.Inclusion
	e.do(request{path: "/v1/ledger/inclusion?seq=2&size=5", secret: aud}).decode(t, &inc)
	lh, _ := base64.StdEncoding.DecodeString(inc.LeafHash)
	if err := tlog.CheckRecord(tlog.RecordProof(dec(inc.Hashes)), 5, root(5), 1, tlog.Hash(lh)); err != nil || inc.LeafIndex != 1 {
		t.Errorf("inclusion of 2 at 5 does not verify: %v", err)
	}
	past := strconv.FormatUint(head+1, 10)
	for _, tc := range []struct{ path, field string }{
		{"/v1/ledger/consistency", "old"},
		{"/v1/ledger/consistency?old=0", "old"},
		{"/v1/ledger/consistency?old=x", "old"},
		{"/v1/ledger/consistency?old=5&new=4", "old"},
		{"/v1/ledger/consistency?old=1&new=" + past, "new"},
		{"/v1/ledger/inclusion?seq=6&size=5", "seq"},
		{"/v1/ledger/inclusion?seq=1&size=" + past, "size"},
		{"/v1/ledger/inclusion?size=3", "seq"},
		{"/v1/ledger/checkpoints/" + past, "size"},
		{"/v1/ledger/checkpoints/0", "size"},
		{"/v1/ledger/events?from=5&to=4", "to"},
		{"/v1/ledger/events?from=0", "from"},
		{"/v1/ledger/events?to=-1", "to"},
		{"/v1/ledger/events?limit=0", "limit"},
	} {
		r := e.do(request{path: tc.path, secret: aud})
		if p := r.problem(t); r.status != http.StatusBadRequest || p.Field != tc.field {
			t.Errorf("GET %s: %d field %q, want 400 naming %q", tc.path, r.status, p.Field, tc.field)
		}
	}
}

// TestLogHistoryAndEvents: the checkpoint history pages in increasing
// size ending with the latest; a kept size serves its note, another is
// 404; events page by sequence number across runs and service events.
func TestLogHistoryAndEvents(t *testing.T) {
	e := newEnv(t, withLog())
	aud := e.secret[auth.RoleAuditor]
	var sizes []uint64
	for path := "/v1/ledger/checkpoints?limit=1"; path != ""; {
		var page struct {
			Checkpoints []api.CheckpointInfo
			NextCursor  string `json:"next_cursor"`
		}
		e.do(request{path: path, secret: aud}).decode(t, &page)
		for _, c := range page.Checkpoints {
			if _, err := ledger.OpenCheckpoint([]byte(c.Note), e.ledger.PublicKey()); err != nil {
				t.Fatalf("checkpoint %d: %v", c.Size, err)
			}
			sizes = append(sizes, c.Size)
		}
		path = ""
		if page.NextCursor != "" {
			path = "/v1/ledger/checkpoints?limit=1&cursor=" + page.NextCursor
		}
	}
	if len(sizes) == 0 || sizes[len(sizes)-1] != e.head() || !slices.IsSorted(sizes) {
		t.Fatalf("history sizes %v, want the latest (%d) last", sizes, e.head())
	}
	r := e.do(request{path: "/v1/ledger/checkpoints/" + strconv.FormatUint(sizes[0], 10), secret: aud})
	if r.status != http.StatusOK || !strings.HasPrefix(string(r.body), "auditd/") {
		t.Errorf("kept checkpoint: %d %s", r.status, r.body)
	}
	if r := e.do(request{path: "/v1/ledger/checkpoints/" + strconv.FormatUint(e.head()-1, 10), secret: aud}); r.status != http.StatusNotFound {
		t.Errorf("a size the history does not keep: %d, want 404", r.status)
	}

	var all []auditd.EventJSON
	for path := "/v1/ledger/events?limit=4"; path != ""; {
		var page struct {
			Events     []auditd.EventJSON
			NextCursor string `json:"next_cursor"`
		}
		e.do(request{path: path, secret: aud}).decode(t, &page)
		all = append(all, page.Events...)
		path = ""
		if page.NextCursor != "" {
			path = "/v1/ledger/events?limit=4&cursor=" + page.NextCursor
		}
	}
	if uint64(len(all)) != e.head() || all[0].Type != auditd.EventTokenChanged {
		t.Fatalf("%d events paged, want all %d, starting with the token changes", len(all), e.head())
	}
	var mid struct{ Events []auditd.EventJSON }
	e.do(request{path: "/v1/ledger/events?from=3&to=5", secret: aud}).decode(t, &mid)
	if len(mid.Events) != 3 || mid.Events[0].Seq != 3 {
		t.Errorf("from=3&to=5: %d events", len(mid.Events))
	}
	var none struct{ Events []auditd.EventJSON }
	e.do(request{path: "/v1/ledger/events?from=" + strconv.FormatUint(e.head()+1, 10), secret: aud}).decode(t, &none)
	if len(none.Events) != 0 {
		t.Errorf("past the head: %d events, want none", len(none.Events))
	}
	r = e.do(request{path: "/v1/ledger/events?from=2&to=4", secret: aud, header: map[string]string{"Accept": api.MIMENDJSON}})
	if r.status != http.StatusOK || strings.Count(string(r.body), "\n") != 3 {
		t.Errorf("stream: %d %q", r.status, r.body)
	}
}

// TestPublicLog: with PublicLog a witness reads the checkpoint, key,
// history and consistency proofs and posts a cosignature without a token;
// without it, or for the other routes, a token is still required.
func TestPublicLog(t *testing.T) {
	skey, vkey, err := note.GenerateKey(rand.Reader, "witness.example/w1")
	if err != nil {
		t.Fatal(err)
	}
	signer, _ := fnote.NewSignerForCosignatureV1(skey)
	wkey, _ := fnote.VKeyToCosignatureV1(vkey)

	closed := newEnv(t, withLog(wkey))
	for _, path := range []string{"/v1/ledger/checkpoint", "/v1/ledger/public-key", "/v1/ledger/consistency?old=1", "/v1/ledger/checkpoints"} {
		if r := closed.do(request{path: path}); r.status != http.StatusUnauthorized {
			t.Errorf("GET %s without a token, not public: %d, want 401", path, r.status)
		}
	}

	e := newEnv(t, withLog(wkey), func(e *env) { e.srv.PublicLog = true })
	for _, path := range []string{"/v1/ledger/checkpoint", "/v1/ledger/public-key", "/v1/ledger/consistency?old=1", "/v1/ledger/checkpoints"} {
		if r := e.do(request{path: path}); r.status != http.StatusOK {
			t.Errorf("GET %s without a token, public: %d, want 200", path, r.status)
		}
	}
	for _, path := range []string{"/v1/ledger/inclusion?seq=1", "/v1/ledger/events", "/v1/ledger/verify", "/v1/runs"} {
		if r := e.do(request{path: path}); r.status != http.StatusUnauthorized {
			t.Errorf("GET %s without a token: %d, want 401", path, r.status)
		}
	}
	cp := e.do(request{path: "/v1/ledger/checkpoint"}).body
	v, _ := note.NewVerifier(e.ledger.PublicKey())
	n, err := note.Open(cp, note.VerifierList(v))
	if err != nil {
		t.Fatal(err)
	}
	cosigned, err := note.Sign(n, signer)
	if err != nil {
		t.Fatal(err)
	}
	var got api.Cosigned
	r := e.do(request{method: "POST", path: "/v1/ledger/cosignatures", body: string(cosigned), ctype: "text/plain"})
	r.decode(t, &got)
	if r.status != http.StatusOK || got.Size != e.head() || len(got.Witnesses) != 1 || got.Witnesses[0] != "witness.example/w1" {
		t.Fatalf("cosign: %d %+v", r.status, got)
	}
	kept := e.do(request{path: "/v1/ledger/checkpoints/" + strconv.FormatUint(got.Size, 10)}).body
	wv, _ := witness.NewVerifier(wkey)
	if _, err := witness.Cosigned(kept, wv); err != nil {
		t.Errorf("the kept checkpoint lacks the cosignature: %v", err)
	}
	r = e.do(request{method: "POST", path: "/v1/ledger/cosignatures", body: string(cp), ctype: "text/plain"})
	if p := r.problem(t); r.status != http.StatusBadRequest || p.Field != "body" {
		t.Errorf("a checkpoint without a cosignature: %d %+v", r.status, p)
	}
}
