package pack

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"

	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/witness"
)

// FleetOptions configure VerifyFleet.
type FleetOptions struct {
	// Keys are the nodes' verifier keys, by node name, from a source the
	// verifier trusts: every one must have a part, under that key. Empty
	// trusts fleet.json's keys, and the report says so.
	Keys map[string]string
}

// FleetReport is the outcome of VerifyFleet.
type FleetReport struct {
	OK          bool
	Origin      string
	TreeSize    uint64
	KeysTrusted bool
	// Nodes are the node packs' reports, by name.
	Nodes map[string]*Report
	// Dispatches counts the runs' dispatches per source, over every node.
	Dispatches map[string]int64
	// WorkbookRows counts the fleet workbook's rows checked against the
	// node workbooks (0: the pack has none).
	WorkbookRows int64
	// Problems are what does not hold, each naming the node, and within
	// its part the entry, sheet, row or leaf.
	Problems []string
}

func (r *FleetReport) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// VerifyFleet checks everything fp says, offline: the fleet checkpoint's
// cosignatures, each node's leaf and its inclusion in the fleet tree, each
// node pack (Verify) against the checkpoint of its leaf, and the
// over-limit proof (verifyLimits). As Verify, failures are Problems and an
// error means a check could not be done.
func VerifyFleet(fp *FleetPack, opts FleetOptions) (*FleetReport, error) {
	m := &fp.Manifest
	r := &FleetReport{Origin: m.Origin, TreeSize: m.TreeSize, Nodes: map[string]*Report{}, Dispatches: map[string]int64{}}
	r.KeysTrusted = len(opts.Keys) > 0
	tree, text, err := openFleetCheckpoint(fp.Checkpoint)
	if err != nil {
		r.fail("%s: %v", FileFleetCheckpoint, err)
	} else if tree.Origin != m.Origin || tree.Size != m.TreeSize {
		r.fail("%s is of %s at size %d, %s says %s at %d", FileFleetCheckpoint, tree.Origin, tree.Size, FileFleetManifest, m.Origin, m.TreeSize)
	}
	for name := range opts.Keys {
		if !slices.ContainsFunc(m.Nodes, func(n FleetNode) bool { return n.Name == name }) {
			r.fail("node %s: the pack has no part of it", name)
		}
	}
	for _, name := range fp.unlisted {
		r.fail("%s: a node pack %s does not list", name, FileFleetManifest)
	}
	cosigners := map[string]bool{}
	// Each node is verified with the key the pack names for it; a trusted
	// key that differs is one problem, and the node's part is checked no
	// further: checked with a key not its own, everything the node signed
	// would fail again. Its cosignature and workbook rows are still taken
	// as the pack's key.
	used := map[string]string{} // the key each node is verified with
	for _, n := range m.Nodes {
		key := n.Key
		used[n.Name] = key
		trusted, given := opts.Keys[n.Name]
		mismatch := given && trusted != key
		switch {
		case mismatch:
			r.fail("node %s: %s names key %q for it, not the trusted key %q; the node's part is not checked further", n.Name, FileFleetManifest, key, trusted)
		case !given && r.KeysTrusted:
			r.fail("node %s: no trusted key given for it (give one for every node of the pack, or none)", n.Name)
		}
		v, err := witness.NewVerifier(key)
		switch {
		case err == nil:
			cosigners[v.Name()] = true
		case !mismatch:
			r.fail("node %s: key: %v", n.Name, err)
		}
		if mismatch {
			continue
		}
		if err == nil && text != "" {
			if _, err := witness.Cosigned(fp.Checkpoint, v); err != nil {
				r.fail("node %s: %s: %v", n.Name, FileFleetCheckpoint, err)
			}
		}
		nodeTree, ok := verifyFleetLeaf(n, key, tree, r)
		p := fp.Nodes[n.Name]
		if p == nil {
			r.fail("node %s: %s: %v", n.Name, FleetNodePack(n.Name), fp.Missing[n.Name])
			continue
		}
		if ok {
			checkNodeCheckpoint(n.Name, p, key, nodeTree, r)
		}
		for _, run := range m.Runs {
			if !slices.ContainsFunc(p.Manifest.Runs, func(pr Run) bool { return pr.ID == run }) {
				r.fail("node %s: %s does not cover run %s", n.Name, FleetNodePack(n.Name), run)
			}
		}
		nr, err := Verify(p, Options{Key: key})
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
		r.Nodes[n.Name] = nr
		for _, prob := range nr.Problems {
			r.fail("node %s: %s", n.Name, prob)
		}
	}
	for _, name := range signers(fp.Checkpoint) {
		if !cosigners[name] {
			r.fail("%s: cosigned by %s, a node the pack has no part of", FileFleetCheckpoint, name)
		}
	}
	if err := verifyLimits(fp, r); err != nil {
		return nil, err
	}
	verifyFleetWorkbook(fp, used, r)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// openFleetCheckpoint reads the fleet checkpoint's text, not its
// signatures (each node's cosignature is checked with its key).
func openFleetCheckpoint(msg []byte) (fleetlog.Tree, string, error) {
	text, _, ok := strings.Cut(string(msg), "\n\n")
	if !ok {
		return fleetlog.Tree{}, "", fmt.Errorf("not a signed note")
	}
	lines := strings.Split(text, "\n")
	if len(lines) != 3 {
		return fleetlog.Tree{}, "", fmt.Errorf("want origin, size and root")
	}
	t := fleetlog.Tree{Origin: lines[0]}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil || strconv.FormatUint(size, 10) != lines[1] {
		return fleetlog.Tree{}, "", fmt.Errorf("bad size %q", lines[1])
	}
	t.Size = size
	root, err := base64.StdEncoding.Strict().DecodeString(lines[2])
	if err != nil || len(root) != len(t.Root) {
		return fleetlog.Tree{}, "", fmt.Errorf("bad root %q", lines[2])
	}
	copy(t.Root[:], root)
	return t, text + "\n", nil
}

// signers returns the names of a note's signature lines.
func signers(msg []byte) []string {
	_, sigs, ok := bytes.Cut(msg, []byte("\n\n"))
	if !ok {
		return nil
	}
	var out []string
	for line := range strings.Lines(string(sigs)) {
		f := strings.Fields(strings.TrimPrefix(line, "\u2014 "))
		if len(f) == 2 {
			out = append(out, f[0])
		}
	}
	return out
}

// verifyFleetLeaf checks n's leaf: the node's, signed by key, included in
// tree, and at or after the revision of every block of the node. It returns the node checkpoint the leaf holds.
func verifyFleetLeaf(n FleetNode, key string, tree fleetlog.Tree, r *FleetReport) (ledger.SignedTree, bool) {
	raw, err := base64.StdEncoding.Strict().DecodeString(n.Leaf)
	if err != nil {
		r.fail("node %s: %s: leaf is not base64", n.Name, FileFleetManifest)
		return ledger.SignedTree{}, false
	}
	leaf, err := fleetlog.ParseLeaf(raw)
	if err != nil {
		r.fail("node %s: fleet leaf %d: %v", n.Name, n.LeafIndex, err)
		return ledger.SignedTree{}, false
	}
	ok := true
	if leaf.Node != n.Name {
		r.fail("node %s: fleet leaf %d is node %s's", n.Name, n.LeafIndex, leaf.Node)
		ok = false
	}
	hashes, err := unb64(n.Inclusion)
	if err != nil || len(hashes) > 64 {
		r.fail("node %s: %s: inclusion proof of fleet leaf %d: not base64 hashes", n.Name, FileFleetManifest, n.LeafIndex)
		ok = false
	} else if n.LeafIndex >= tree.Size || tlog.CheckRecord(tlog.RecordProof(hashes), int64(tree.Size), tree.Root, int64(n.LeafIndex), tlog.RecordHash(raw)) != nil {
		r.fail("node %s: fleet leaf %d is not in the fleet tree of %s (inclusion proof fails)", n.Name, n.LeafIndex, FileFleetCheckpoint)
		ok = false
	}
	for _, b := range n.Blocks {
		if b.Revision > leaf.Revision {
			r.fail("node %s: block of source %s at revision %d is after revision %d, the last grant the node's checkpoint (fleet leaf %d) covers",
				n.Name, b.Source, b.Revision, leaf.Revision, n.LeafIndex)
		}
	}
	st, err := ledger.OpenCheckpoint(leaf.Checkpoint, key)
	if err != nil {
		r.fail("node %s: fleet leaf %d: the node checkpoint is not signed by the node's key: %v", n.Name, n.LeafIndex, err)
		return ledger.SignedTree{}, false
	}
	return st, ok
}

// checkNodeCheckpoint holds the node pack to the checkpoint the fleet log
// holds for the node.
func checkNodeCheckpoint(name string, p *Pack, key string, fleetTree ledger.SignedTree, r *FleetReport) {
	if p.PublicKey != key {
		r.fail("node %s: %s is not the node's key: it names %q", name, FilePublicKey, p.PublicKey)
	}
	if _, err := note.NewVerifier(key); err != nil {
		return
	}
	st, err := ledger.OpenCheckpoint(p.Checkpoint, key)
	if err != nil {
		return // Verify names it
	}
	switch {
	case st.Size == fleetTree.Size && st.Root != fleetTree.Root:
		r.fail("node %s: %s (size %d, root %s) forks the node checkpoint the fleet log holds (root %s)", name, FileCheckpoint,
			st.Size, b64(([]tlog.Hash{st.Root}))[0], b64([]tlog.Hash{fleetTree.Root})[0])
	case st.Size != fleetTree.Size:
		r.fail("node %s: %s is of size %d, the node checkpoint the fleet log holds of size %d", name, FileCheckpoint, st.Size, fleetTree.Size)
	}
}
