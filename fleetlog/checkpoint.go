package fleetlog

import (
	"encoding/base64"
	"fmt"
	"sort"
	"strings"

	"golang.org/x/mod/sumdb/tlog"
)

// Tree is a fleet checkpoint's body: the fleet log held Size leaves whose
// RFC 6962 tree hash is Root. Text is its C2SP form:
//
//	<origin>
//	<size>
//	<base64 root>
type Tree struct {
	Origin string
	Size   uint64
	Root   tlog.Hash
}

// Text returns the checkpoint body that cosignatures sign.
func (t Tree) Text() string {
	return fmt.Sprintf("%s\n%d\n%s\n", t.Origin, t.Size, base64.StdEncoding.EncodeToString(t.Root[:]))
}

// assemble returns the note of text and its signature lines, in name
// order, so that every node assembles the same bytes.
func assemble(text string, lines []string) []byte {
	sort.Strings(lines)
	return []byte(text + "\n" + strings.Join(lines, ""))
}
