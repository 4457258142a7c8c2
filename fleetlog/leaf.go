package fleetlog

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// LeafFormat is the first line of every leaf.
const LeafFormat = "auditd-fleet-leaf/1"

// Leaf is one leaf of the fleet log: a node's signed ledger checkpoint and
// the etcd revision of the last fleet grant that ledger records. Its bytes
// (Marshal) are
//
//	auditd-fleet-leaf/1
//	node <name>
//	revision <decimal>
//	<the checkpoint note, byte for byte>
type Leaf struct {
	Node       string
	Revision   int64
	Checkpoint []byte
}

// Marshal returns the leaf's bytes, which the fleet tree hashes.
func (l Leaf) Marshal() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\nnode %s\nrevision %d\n", LeafFormat, l.Node, l.Revision)
	b.Write(l.Checkpoint)
	return b.Bytes()
}

// ParseLeaf reads a leaf's bytes. It checks the form only, not the
// checkpoint's signature.
func ParseLeaf(b []byte) (Leaf, error) {
	parts := strings.SplitN(string(b), "\n", 4)
	if len(parts) != 4 || parts[0] != LeafFormat {
		return Leaf{}, fmt.Errorf("%w: not an %s leaf", ErrBadLeaf, LeafFormat)
	}
	node, ok := strings.CutPrefix(parts[1], "node ")
	if !ok || !validName(node) {
		return Leaf{}, fmt.Errorf("%w: bad node line %q", ErrBadLeaf, parts[1])
	}
	rs, ok := strings.CutPrefix(parts[2], "revision ")
	rev, err := strconv.ParseInt(rs, 10, 64)
	if !ok || err != nil || rev < 0 || strconv.FormatInt(rev, 10) != rs {
		return Leaf{}, fmt.Errorf("%w: bad revision line %q", ErrBadLeaf, parts[2])
	}
	if parts[3] == "" {
		return Leaf{}, fmt.Errorf("%w: no checkpoint", ErrBadLeaf)
	}
	return Leaf{Node: node, Revision: rev, Checkpoint: []byte(parts[3])}, nil
}

// validName reports whether s may name a node: it goes into etcd keys and
// note lines, so no slash, space or control character.
func validName(s string) bool {
	if s == "" || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if c <= ' ' || c == '/' || c == 0x7f || c == '+' {
			return false
		}
	}
	return true
}
