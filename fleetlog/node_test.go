package fleetlog_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"testing"
	"time"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd/fleetlog"
)

// node is a stand-in for one node's ledger: an RFC 6962 tree of leaves in
// memory and the ledger's checkpoint form, signed with its key.
type node struct {
	name   string
	skey   string
	vkey   string
	signer note.Signer
	hashes []tlog.Hash // tlog stored hashes
	size   int64
}

func newNode(tb testing.TB, name string) *node {
	tb.Helper()
	skey, vkey, err := note.GenerateKey(rand.Reader, "auditd/"+name)
	if err != nil {
		tb.Fatal(err)
	}
	signer, err := note.NewSigner(skey)
	if err != nil {
		tb.Fatal(err)
	}
	return &node{name: name, skey: skey, vkey: vkey, signer: signer}
}

func (n *node) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		out[i] = n.hashes[x]
	}
	return out, nil
}

// add appends k leaves.
func (n *node) add(tb testing.TB, k int) {
	tb.Helper()
	for range k {
		hs, err := tlog.StoredHashes(n.size, fmt.Appendf(nil, "%s event %d", n.name, n.size+1), n)
		if err != nil {
			tb.Fatal(err)
		}
		n.hashes = append(n.hashes, hs...)
		n.size++
	}
}

func (n *node) root(tb testing.TB) tlog.Hash {
	tb.Helper()
	h, err := tlog.TreeHash(n.size, n)
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// sign returns a ledger checkpoint of size and root, signed by n.
func (n *node) sign(tb testing.TB, size int64, root tlog.Hash) []byte {
	tb.Helper()
	chain := sha256.Sum256(root[:])
	text := fmt.Sprintf("auditd/%s\n%d\n%s\ntime %s\nchain %s\n", n.name, size,
		base64.StdEncoding.EncodeToString(root[:]), time.Unix(1700000000+size, 0).UTC().Format(time.RFC3339Nano),
		base64.StdEncoding.EncodeToString(chain[:]))
	msg, err := note.Sign(&note.Note{Text: text}, n.signer)
	if err != nil {
		tb.Fatal(err)
	}
	return msg
}

// post is n's post of its current checkpoint.
func (n *node) post(tb testing.TB, rev int64) fleetlog.Post {
	return fleetlog.Post{Node: n.name, Key: n.vkey, Checkpoint: n.sign(tb, n.size, n.root(tb)), Revision: rev,
		Prove: func(old uint64) (tlog.TreeProof, error) { return tlog.ProveTree(n.size, int64(old), n) }}
}
