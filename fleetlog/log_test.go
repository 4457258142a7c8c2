package fleetlog_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/internal/etcdtest"
	"github.com/auditd/auditd/witness"
)

func TestConcurrentPostsFromThreeNodes(t *testing.T) {
	c := etcdtest.Start(t, 3)
	ctx := context.Background()
	const posts = 8
	nodes := []*node{newNode(t, "a"), newNode(t, "b"), newNode(t, "c")}
	logs := make([]*fleetlog.Log, 3)
	for i := range nodes {
		// Each node talks to its own member, so that posts race through
		// different members to one raft log.
		logs[i] = fleetlog.New(etcdtest.NewClient(t, c.Members[i].Client), fleetlog.Config{})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 3*posts)
	for i, n := range nodes {
		wg.Go(func() {
			for k := range posts {
				n.add(t, 1+k)
				if _, err := logs[i].Post(ctx, n.post(t, int64(k))); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("post: %v", err)
	}
	head, err := logs[0].Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if head.Size != 3*posts {
		t.Fatalf("fleet log holds %d leaves, want %d", head.Size, 3*posts)
	}
	// Every leaf is one node's post, each node's in the order it posted,
	// and each is included in the head by a proof transparency-dev/merkle
	// accepts.
	last := map[string]int64{}
	for i := range head.Size {
		b, err := logs[1].Leaf(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		l, err := fleetlog.ParseLeaf(b)
		if err != nil {
			t.Fatal(err)
		}
		if l.Revision != last[l.Node] {
			t.Fatalf("leaf %d: node %s revision %d, want %d (its posts out of order)", i, l.Node, l.Revision, last[l.Node])
		}
		last[l.Node]++
		p, err := logs[2].ProveLeaf(ctx, i, head.Size)
		if err != nil {
			t.Fatal(err)
		}
		if err := proof.VerifyInclusion(rfc6962.DefaultHasher, i, head.Size, rfc6962.DefaultHasher.HashLeaf(b), raw(p), head.Root[:]); err != nil {
			t.Fatalf("leaf %d: inclusion: %v", i, err)
		}
	}
	// Consistency from every earlier size to the head.
	for old := uint64(1); old < head.Size; old++ {
		p, err := logs[0].ProveTree(ctx, head.Size, old)
		if err != nil {
			t.Fatal(err)
		}
		oldRoot, err := tlog.TreeHash(int64(old), hashesOf(t, logs[0], ctx, old))
		if err != nil {
			t.Fatal(err)
		}
		if err := proof.VerifyConsistency(rfc6962.DefaultHasher, old, head.Size, raw(p), oldRoot[:], head.Root[:]); err != nil {
			t.Fatalf("consistency %d to %d: %v", old, head.Size, err)
		}
	}
}

// hashesOf rebuilds the stored hashes of the log's first size leaves from
// the leaves themselves, so that old roots come from outside the Log.
func hashesOf(t *testing.T, l *fleetlog.Log, ctx context.Context, size uint64) tlog.HashReader {
	t.Helper()
	var hs memHashes
	for i := range size {
		b, err := l.Leaf(ctx, i)
		if err != nil {
			t.Fatal(err)
		}
		s, err := tlog.StoredHashes(int64(i), b, hs)
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, s...)
	}
	return hs
}

type memHashes []tlog.Hash

func (m memHashes) ReadHashes(indexes []int64) ([]tlog.Hash, error) {
	out := make([]tlog.Hash, len(indexes))
	for i, x := range indexes {
		out[i] = m[x]
	}
	return out, nil
}

func raw[T ~[]tlog.Hash](p T) [][]byte {
	out := make([][]byte, len(p))
	for i := range p {
		out[i] = p[i][:]
	}
	return out
}

func TestFailoverContinuesTheLog(t *testing.T) {
	c := etcdtest.Start(t, 3)
	ctx := context.Background()
	a, b := newNode(t, "a"), newNode(t, "b")
	la := fleetlog.New(etcdtest.NewClient(t, c.Endpoints()...), fleetlog.Config{})
	for k := range 3 {
		a.add(t, 2)
		if _, err := la.Post(ctx, a.post(t, int64(k))); err != nil {
			t.Fatal(err)
		}
	}
	before, err := la.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lead := c.Leader()
	if lead < 0 {
		t.Fatal("no etcd leader")
	}
	c.Members[lead].Stop()
	var rest []string
	for i, m := range c.Members {
		if i != lead {
			rest = append(rest, m.Client)
		}
	}
	// Another node, on the members left, continues the same log.
	lb := fleetlog.New(etcdtest.NewClient(t, rest...), fleetlog.Config{})
	b.add(t, 5)
	e, err := lb.Post(ctx, b.post(t, 0))
	if err != nil {
		t.Fatalf("post after the leader stopped: %v", err)
	}
	if e.Index != before.Size || e.Tree.Size != before.Size+1 {
		t.Fatalf("post after failover landed at %d (tree %d), want %d (tree %d)", e.Index, e.Tree.Size, before.Size, before.Size+1)
	}
	// a's state survived too: its next checkpoint is held to its last.
	a.add(t, 1)
	if _, err := lb.Post(ctx, a.post(t, 3)); err != nil {
		t.Fatal(err)
	}
	after, err := lb.Head(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p, err := lb.ProveTree(ctx, after.Size, before.Size)
	if err != nil {
		t.Fatal(err)
	}
	if err := proof.VerifyConsistency(rfc6962.DefaultHasher, before.Size, after.Size, raw(p), before.Root[:], after.Root[:]); err != nil {
		t.Fatalf("the log after failover does not extend the one before: %v", err)
	}
}

func TestContradictingCheckpointsRejected(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	cli := etcdtest.NewClient(t, c.Endpoints()...)
	for _, tc := range []struct {
		name string
		post func(t *testing.T, n *node) fleetlog.Post
		want error
	}{
		{"Fork", func(t *testing.T, n *node) fleetlog.Post {
			p := n.post(t, 1)
			p.Checkpoint = n.sign(t, n.size, tlog.Hash{1})
			return p
		}, fleetlog.ErrFork},
		{"Rollback", func(t *testing.T, n *node) fleetlog.Post {
			p := n.post(t, 1)
			p.Checkpoint = n.sign(t, n.size-1, tlog.Hash{2})
			return p
		}, fleetlog.ErrRollback},
		{"NotConsistent", func(t *testing.T, n *node) fleetlog.Post {
			n.add(t, 3)
			p := n.post(t, 1)
			p.Checkpoint = n.sign(t, n.size, tlog.Hash{3})
			return p
		}, fleetlog.ErrInconsistent},
		{"NoProof", func(t *testing.T, n *node) fleetlog.Post {
			n.add(t, 3)
			p := n.post(t, 1)
			p.Prove = nil
			return p
		}, fleetlog.ErrInconsistent},
		{"OtherKey", func(t *testing.T, n *node) fleetlog.Post {
			other := newNode(t, n.name)
			other.add(t, 9)
			return other.post(t, 1)
		}, fleetlog.ErrKeyMismatch},
		{"NotSigned", func(t *testing.T, n *node) fleetlog.Post {
			p := n.post(t, 1)
			p.Key = newNode(t, n.name).vkey
			return p
		}, fleetlog.ErrBadCheckpoint},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := fleetlog.New(cli, fleetlog.Config{Prefix: "/t/" + tc.name + "/"})
			n := newNode(t, "node-"+strings.ToLower(tc.name))
			n.add(t, 4)
			if _, err := l.Post(ctx, n.post(t, 0)); err != nil {
				t.Fatal(err)
			}
			before, _ := l.Head(ctx)
			_, err := l.Post(ctx, tc.post(t, n))
			if !errors.Is(err, tc.want) {
				t.Fatalf("post: %v, want %v", err, tc.want)
			}
			if !strings.Contains(err.Error(), "node "+n.name) {
				t.Fatalf("error %q does not name the node %s", err, n.name)
			}
			after, _ := l.Head(ctx)
			if after != before {
				t.Fatalf("a rejected post changed the log: %d to %d leaves", before.Size, after.Size)
			}
			// The same checkpoint again is no new leaf.
			e, err := l.Post(ctx, n.post(t, 0))
			if tc.name != "NotConsistent" && tc.name != "NoProof" {
				if err != nil || e.Index != 0 || e.Tree.Size != 1 {
					t.Fatalf("reposting the accepted checkpoint: %+v, %v", e, err)
				}
			}
		})
	}
}

func TestCosignedCheckpoint(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	cli := etcdtest.NewClient(t, c.Endpoints()...)
	var vs []*witness.Verifier
	var cosigners []*witness.Cosigner
	l := fleetlog.New(cli, fleetlog.Config{})
	for _, name := range []string{"a", "b", "c"} {
		n := newNode(t, name)
		n.add(t, 3)
		if _, err := l.Post(ctx, n.post(t, 0)); err != nil {
			t.Fatal(err)
		}
		cs, err := witness.NewCosigner(n.skey)
		if err != nil {
			t.Fatal(err)
		}
		v, err := witness.NewVerifier(n.vkey)
		if err != nil {
			t.Fatal(err)
		}
		cosigners, vs = append(cosigners, cs), append(vs, v)
	}
	for _, cs := range cosigners {
		if _, err := fleetlog.New(cli, fleetlog.Config{}).Cosign(ctx, cs, 3); err != nil {
			t.Fatal(err)
		}
	}
	msg, names, err := l.Checkpoint(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(names) != 3 {
		t.Fatalf("cosigners %v, want three", names)
	}
	if _, err := witness.Cosigned(msg, vs...); err != nil {
		t.Fatalf("fleet checkpoint: %v\n%s", err, msg)
	}
	head, _ := l.Head(ctx)
	if !strings.HasPrefix(string(msg), head.Text()) {
		t.Fatalf("fleet checkpoint %q is not the head %q", msg, head.Text())
	}
	// An edited root carries no valid cosignature.
	bad := strings.Replace(string(msg), "\n3\n", "\n2\n", 1)
	if _, err := witness.Cosigned([]byte(bad), vs[0]); err == nil {
		t.Fatal("an edited fleet checkpoint verified")
	}
}

func TestLeafRoundTrip(t *testing.T) {
	l := fleetlog.Leaf{Node: "n1", Revision: 42, Checkpoint: []byte("auditd/x\n1\nAAAA\n\n\u2014 sig\n")}
	got, err := fleetlog.ParseLeaf(l.Marshal())
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(l) {
		t.Fatalf("round trip: %+v, want %+v", got, l)
	}
	for _, bad := range []string{"", "auditd-fleet-leaf/1\nnode a/b\nrevision 1\nx", "auditd-fleet-leaf/1\nnode a\nrevision 01\nx",
		"auditd-fleet-leaf/1\nnode a\nrevision 1\n", "auditd-fleet-leaf/2\nnode a\nrevision 1\nx"} {
		if _, err := fleetlog.ParseLeaf([]byte(bad)); !errors.Is(err, fleetlog.ErrBadLeaf) {
			t.Errorf("ParseLeaf(%q): %v, want ErrBadLeaf", bad, err)
		}
	}
}

func FuzzParseLeaf(f *testing.F) {
	f.Add(fleetlog.Leaf{Node: "a", Revision: 7, Checkpoint: []byte("x\n")}.Marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		l, err := fleetlog.ParseLeaf(b)
		if err != nil {
			return
		}
		if string(l.Marshal()) != string(b) {
			t.Fatalf("leaf %q marshals to %q", b, l.Marshal())
		}
	})
}

// TestCosignerOfAnyKey: a signer key's base64 may hold '+', the field
// separator; twenty keys are all but sure to include one.
func TestCosignerOfAnyKey(t *testing.T) {
	for range 20 {
		n := newNode(t, "k")
		c, err := witness.NewCosigner(n.skey)
		if err != nil {
			t.Fatalf("NewCosigner(%s...): %v", n.skey[:24], err)
		}
		if c.Name() != "auditd/k" {
			t.Fatalf("cosigner name %q", c.Name())
		}
	}
}

// TestCosignRefusesARewrittenHead: a node cosigns only a head whose root
// follows from the stored hashes, those it has seen before included.
func TestCosignRefusesARewrittenHead(t *testing.T) {
	c := etcdtest.Start(t, 1)
	ctx := context.Background()
	cli := etcdtest.NewClient(t, c.Endpoints()...)
	l := fleetlog.New(cli, fleetlog.Config{})
	n := newNode(t, "a")
	cs, err := witness.NewCosigner(n.skey)
	if err != nil {
		t.Fatal(err)
	}
	for k := range 3 {
		n.add(t, 1)
		if _, err := l.Post(ctx, n.post(t, int64(k))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Cosign(ctx, cs, 3); err != nil {
		t.Fatal(err)
	}
	// Someone with write access to etcd rewrites the first leaf's hash
	// and the head to match a log of other leaves.
	if _, err := cli.Put(ctx, fleetlog.DefaultPrefix+"hash/00000000000000000000", string(make([]byte, 32))); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, fleetlog.DefaultPrefix+"head", `{"size":3,"root":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}`); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Cosign(ctx, cs, 3); !errors.Is(err, fleetlog.ErrCorrupt) {
		t.Fatalf("cosign of a rewritten head: %v, want ErrCorrupt", err)
	}
}
