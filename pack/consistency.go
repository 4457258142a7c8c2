package pack

import (
	"fmt"

	"github.com/auditd/auditd/ledger"
	"golang.org/x/mod/sumdb/tlog"
)

// verifyConsistency checks consistency.json when the pack has one, and,
// given an earlier pack, that both checkpoints are of one history: the
// same tree at the same size, or this pack's proof from exactly the
// earlier checkpoint. Two checkpoints signed by the same key that are of
// different trees at one size are a fork, and are reported as one.
func (p *Pack) verifyConsistency(key string, tree ledger.SignedTree, prev *Pack, r *Report) {
	var own *ledger.SignedTree
	if p.Consistency != nil {
		if old, ok := checkConsistency(p, key, tree, r); ok {
			own = &old
			r.Consistent = fmt.Sprintf("the log at size %d extends its checkpoint of size %d", tree.Size, old.Size)
		}
	}
	if prev == nil || tree.Size == 0 {
		return
	}
	pt, err := ledger.OpenCheckpoint(prev.Checkpoint, key)
	if err != nil {
		r.fail("the previous pack's %s: %v", FileCheckpoint, err)
		return
	}
	switch {
	case pt.Size == tree.Size:
		if pt.Root != tree.Root {
			r.fail("fork: the previous pack's checkpoint and this one are both of size %d but of different trees", pt.Size)
			return
		}
		r.Consistent = fmt.Sprintf("the same tree of %d events as the previous pack", pt.Size)
	case pt.Size < tree.Size:
		if own == nil || own.Size != pt.Size {
			r.fail("no consistency proof from the previous pack's checkpoint (size %d): build this pack with --previous", pt.Size)
			return
		}
		if own.Root != pt.Root {
			r.fail("fork: the previous pack's checkpoint of size %d is of another tree than the one this pack's log extends", pt.Size)
			return
		}
		r.Consistent = fmt.Sprintf("the log at size %d extends the previous pack's checkpoint of size %d", tree.Size, pt.Size)
	default:
		if prev.Consistency == nil {
			r.fail("the previous pack (size %d) is newer than this one (%d) and carries no consistency proof from it", pt.Size, tree.Size)
			return
		}
		var sub Report
		old, ok := checkConsistency(prev, key, pt, &sub)
		switch {
		case !ok:
			r.fail("the previous pack's consistency proof does not hold: %v", sub.Problems)
		case old.Size != tree.Size:
			r.fail("the previous pack (size %d) proves consistency from size %d, not this pack's %d", pt.Size, old.Size, tree.Size)
		case old.Root != tree.Root:
			r.fail("fork: the previous pack's log at size %d is another tree than this pack's", tree.Size)
		default:
			r.Consistent = fmt.Sprintf("the previous pack's log at size %d extends this one", pt.Size)
		}
	}
}

// checkConsistency checks p's consistency.json against its own
// checkpoint (tree) and returns the earlier tree it proves.
func checkConsistency(p *Pack, key string, tree ledger.SignedTree, r *Report) (ledger.SignedTree, bool) {
	old, err := ledger.OpenCheckpoint(p.Previous, key)
	if err != nil {
		r.fail("%s: %v", FilePreviousCheckpoint, err)
		return old, false
	}
	c := p.Consistency
	if c.OldSize != old.Size || c.NewSize != tree.Size || old.Size > tree.Size {
		r.fail("%s is from size %d to %d; the checkpoints are of %d and %d", FileConsistency, c.OldSize, c.NewSize, old.Size, tree.Size)
		return old, false
	}
	hs, err := unb64(c.Hashes)
	if err != nil {
		r.fail("%s: %v", FileConsistency, err)
		return old, false
	}
	if err := tlog.CheckTree(tlog.TreeProof(hs), int64(tree.Size), tree.Root, int64(old.Size), old.Root); err != nil {
		r.fail("%s: the tree of %d does not extend %s's tree of %d: %v", FileConsistency, tree.Size, FilePreviousCheckpoint, old.Size, err)
		return old, false
	}
	return old, true
}
