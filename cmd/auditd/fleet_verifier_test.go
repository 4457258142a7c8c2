package main

// A fleet evidence pack verifier written from docs/EVIDENCE-PACK.md
// ("Fleet packs") alone, beside the single-node one in
// independent_verifier_test.go, whose outsideVerify it runs on each node's
// part: only the standard library, transparency-dev/merkle and
// golang.org/x/mod/sumdb/note (TestFleetVerifierImports holds it to that).

import (
	"archive/zip"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/transparency-dev/merkle/proof"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

// outsideCosigner checks cosignature/v1 signatures of one Ed25519 key.
type outsideCosigner struct {
	name string
	hash uint32
	pub  ed25519.PublicKey
}

func newOutsideCosigner(vkey string) (*outsideCosigner, error) {
	f := strings.SplitN(vkey, "+", 3)
	if len(f) != 3 {
		return nil, errors.New("not a verifier key")
	}
	raw, err := base64.StdEncoding.DecodeString(f[2])
	if err != nil || len(raw) != 1+ed25519.PublicKeySize {
		return nil, errors.New("not an Ed25519 key")
	}
	h := sha256.Sum256(append([]byte(f[0]+"\n\x04"), raw[1:]...))
	return &outsideCosigner{name: f[0], hash: binary.BigEndian.Uint32(h[:4]), pub: raw[1:]}, nil
}

func (c *outsideCosigner) Name() string    { return c.name }
func (c *outsideCosigner) KeyHash() uint32 { return c.hash }
func (c *outsideCosigner) Verify(msg, sig []byte) bool {
	if len(sig) != 8+ed25519.SignatureSize {
		return false
	}
	m := append(fmt.Appendf(nil, "cosignature/v1\ntime %d\n", binary.BigEndian.Uint64(sig)), msg...)
	return ed25519.Verify(c.pub, m, sig[8:])
}

// outsideVerifyFleet checks the fleet pack b against keys, the nodes'
// published verifier keys by node name.
func outsideVerifyFleet(b []byte, keys map[string]string) error {
	zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b)))
	if err != nil {
		return err
	}
	read := func(name string) ([]byte, error) { return readZipEntry(zr, name) }
	var m struct {
		TreeSize uint64   `json:"tree_size"`
		Runs     []string `json:"runs"`
		Nodes    []struct {
			Name      string   `json:"name"`
			Key       string   `json:"key"`
			LeafIndex uint64   `json:"leaf_index"`
			Leaf      string   `json:"leaf"`
			Inclusion []string `json:"inclusion"`
			Blocks    []struct {
				Source   string `json:"source"`
				First    int64  `json:"first_unix_nano"`
				Interval int64  `json:"interval_nanos"`
				Count    int64  `json:"count"`
				Revision int64  `json:"revision"`
			} `json:"blocks"`
		} `json:"nodes"`
		Limits []struct {
			Source string `json:"source"`
			Limit  int64  `json:"limit"`
			Window int64  `json:"window_nanos"`
		} `json:"limits"`
		SlotSlack int64 `json:"slot_slack_nanos"`
	}
	mb, err := read("fleet.json")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(mb, &m); err != nil {
		return fmt.Errorf("fleet.json: %v", err)
	}
	cp, err := read("fleet-checkpoint.txt")
	if err != nil {
		return err
	}
	text, sigs, _ := strings.Cut(string(cp), "\n\n")
	lines := strings.Split(text, "\n")
	if len(lines) != 3 {
		return errors.New("fleet-checkpoint.txt: not origin, size and root")
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	root, err2 := base64.StdEncoding.DecodeString(lines[2])
	if err != nil || err2 != nil || size != m.TreeSize {
		return errors.New("fleet-checkpoint.txt: bad size or root")
	}
	// Every published node has a part, and every cosigner is a node of
	// the pack.
	names := map[string]bool{}
	for _, n := range m.Nodes {
		names[n.Name] = true
	}
	for name := range keys {
		if !names[name] {
			return fmt.Errorf("node %s: no part", name)
		}
	}
	origins := map[string]bool{}
	type stamp struct {
		at   int64
		node string
	}
	dispatches := map[string][]stamp{}
	books := map[string]map[string][][]string{} // node: its workbook's populations
	cps := map[string]string{}                  // node: its part's checkpoint
	for _, n := range m.Nodes {
		if keys[n.Name] != n.Key {
			return fmt.Errorf("node %s: fleet.json key is not the published key", n.Name)
		}
		c, err := newOutsideCosigner(n.Key)
		if err != nil {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		origins[c.name] = true
		if _, err := note.Open(cp, note.VerifierList(c)); err != nil {
			return fmt.Errorf("node %s: fleet-checkpoint.txt not cosigned: %v", n.Name, err)
		}
		// The leaf: the node's, its checkpoint signed by its key, in the tree.
		leaf, err := base64.StdEncoding.DecodeString(n.Leaf)
		if err != nil {
			return fmt.Errorf("node %s: leaf: %v", n.Name, err)
		}
		parts := strings.SplitN(string(leaf), "\n", 4)
		if len(parts) != 4 || parts[0] != "auditd-fleet-leaf/1" || parts[1] != "node "+n.Name {
			return fmt.Errorf("node %s: fleet leaf %d is not the node's", n.Name, n.LeafIndex)
		}
		v, err := note.NewVerifier(n.Key)
		if err != nil {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		if _, err := note.Open([]byte(parts[3]), note.VerifierList(v)); err != nil {
			return fmt.Errorf("node %s: fleet leaf %d: checkpoint not signed by the node: %v", n.Name, n.LeafIndex, err)
		}
		var path [][]byte
		for _, s := range n.Inclusion {
			h, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return fmt.Errorf("node %s: inclusion: %v", n.Name, err)
			}
			path = append(path, h)
		}
		if err := proof.VerifyInclusion(rfc6962.DefaultHasher, n.LeafIndex, size, rfc6962.DefaultHasher.HashLeaf(leaf), path, root); err != nil {
			return fmt.Errorf("node %s: fleet leaf %d not in the fleet tree: %v", n.Name, n.LeafIndex, err)
		}
		// The node's pack: proven against that very checkpoint.
		part, err := read("nodes/" + n.Name + ".zip")
		if err != nil {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		pcp, err := zipEntry(part, "checkpoint.txt")
		if err != nil || string(pcp) != parts[3] {
			return fmt.Errorf("node %s: checkpoint.txt is not the checkpoint of its fleet leaf", n.Name)
		}
		cps[n.Name] = string(pcp)
		if err := outsideVerify(part, n.Key); err != nil {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		wb, err := zipEntry(part, "evidence.xlsx")
		if err == nil {
			books[n.Name], err = outsidePopulations(wb)
		}
		if err != nil {
			return fmt.Errorf("node %s: evidence.xlsx: %v", n.Name, err)
		}
		bin, err := zipEntry(part, "events.bin")
		if err != nil {
			return fmt.Errorf("node %s: %v", n.Name, err)
		}
		// A dispatch a "not sent" dispatch.interrupted closes never
		// reached the upstream: the limits leave it out.
		type keyed struct {
			key, source string
			stamp
		}
		var mine []keyed
		notSent := map[string]bool{}
		for len(bin) >= 4 {
			l := binary.BigEndian.Uint32(bin)
			if uint64(l) > uint64(len(bin)-4) {
				break
			}
			e, err := decodeOutside(bin[4 : 4+l])
			bin = bin[4+l:]
			if err != nil || !contains(m.Runs, e.run) {
				continue
			}
			key := fmt.Sprintf("%s|%s|%d|%d", e.run, e.item, e.page, e.attempt)
			switch {
			case e.typ == "dispatch":
				mine = append(mine, keyed{key, e.source, stamp{e.time.UnixNano(), n.Name}})
			case e.typ == "dispatch.interrupted" && strings.HasPrefix(e.cause, "not sent"):
				notSent[key] = true
			}
		}
		for _, d := range mine {
			if !notSent[d.key] {
				dispatches[d.source] = append(dispatches[d.source], d.stamp)
			}
		}
	}
	for line := range strings.Lines(sigs) {
		if f := strings.Fields(strings.TrimPrefix(line, "\u2014 ")); len(f) == 2 && !origins[f[0]] {
			return fmt.Errorf("fleet-checkpoint.txt: cosigned by %s, a node with no part", f[0])
		}
	}
	// The fleet workbook, when there is one: behind its Node column, each
	// node's rows of each sheet are its own verified workbook's, in order.
	if fleetBook, err := read("evidence.xlsx"); err == nil {
		if err := outsideCheckFleetBook(fleetBook, books); err != nil {
			return err
		}
		var names []string
		keys := map[string]string{}
		for _, n := range m.Nodes {
			names, keys[n.Name] = append(names, n.Name), n.Key
		}
		if err := outsideCheckFleetManifest(fleetBook, m.Runs, names, keys, cps); err != nil {
			return err
		}
	}
	// The over-limit proof: blocks disjoint per source, and no window of
	// a source's dispatches over its limit.
	type span struct{ from, to, rev int64 }
	spans := map[string][]span{}
	for _, n := range m.Nodes {
		for _, b := range n.Blocks {
			spans[b.Source] = append(spans[b.Source], span{b.First, b.First + b.Count*b.Interval, b.Revision})
		}
	}
	for src, ss := range spans {
		sort.Slice(ss, func(i, j int) bool { return ss[i].from < ss[j].from })
		for i := 1; i < len(ss); i++ {
			if ss[i-1].to > ss[i].from {
				return fmt.Errorf("source %s: blocks at revisions %d and %d overlap", src, ss[i-1].rev, ss[i].rev)
			}
		}
	}
	for _, l := range m.Limits {
		ds := dispatches[l.Source]
		sort.Slice(ds, func(i, j int) bool { return ds[i].at < ds[j].at })
		// With a slot slack, each dispatch is in a block of its node's:
		// from the block's first slot to its last plus the slack, and no
		// block holds more dispatches than slots.
		used := map[[2]int]int64{} // node, block: dispatches it held
		for _, d := range ds {
			if m.SlotSlack <= 0 {
				break
			}
			held := false
			for ni, n := range m.Nodes {
				for bi, b := range n.Blocks {
					k := [2]int{ni, bi}
					if !held && n.Name == d.node && b.Source == l.Source && d.at >= b.First && d.at <= b.First+(b.Count-1)*b.Interval+m.SlotSlack && used[k] < b.Count {
						used[k]++
						held = true
					}
				}
			}
			if !held {
				return fmt.Errorf("source %s: node %s's dispatch at %d is in none of its reserved blocks", l.Source, d.node, d.at)
			}
		}
		for i, j := 0, 0; j < len(ds); j++ {
			for ds[j].at-ds[i].at >= l.Window {
				i++
			}
			if int64(j-i+1) > l.Limit {
				return fmt.Errorf("source %s: %d dispatches in a window, over %d (the last node %s's)", l.Source, j-i+1, l.Limit, ds[j].node)
			}
		}
	}
	return nil
}

func zipEntry(z []byte, name string) ([]byte, error) {
	zr, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		return nil, err
	}
	return readZipEntry(zr, name)
}

// readZipEntry reads the entry called name of zr.
func readZipEntry(zr *zip.Reader, name string) ([]byte, error) {
	for _, f := range zr.File {
		if f.Name == name {
			rc, err := f.Open()
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			return io.ReadAll(rc)
		}
	}
	return nil, fmt.Errorf("no %s", name)
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// outsidePopulations reads an XLSX's sheets (outsideSheets), each
// continuation ("Dispatches (2)") after its first sheet without its
// header, and drops every row's trailing empty cells.
func outsidePopulations(book []byte) (map[string][][]string, error) {
	sheets, err := outsideSheets(book)
	if err != nil {
		return nil, err
	}
	out := map[string][][]string{}
	for name := range sheets {
		if i := strings.LastIndex(name, " ("); i > 0 && strings.HasSuffix(name, ")") {
			continue
		}
		for n := 1; ; n++ {
			part := name
			if n > 1 {
				part = fmt.Sprintf("%s (%d)", name, n)
			}
			rs, ok := sheets[part]
			if !ok {
				break
			}
			if n > 1 {
				rs = rs[min(1, len(rs)):]
			}
			for _, r := range rs {
				for len(r) > 0 && r[len(r)-1] == "" {
					r = r[:len(r)-1]
				}
				out[name] = append(out[name], r)
			}
		}
	}
	return out, nil
}

// outsideSameRow compares two rows cell by cell: the same text, or the
// same number however written ("1.5", "1.50000000000000").
func outsideSameRow(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, errX := strconv.ParseFloat(a[i], 64)
		y, errY := strconv.ParseFloat(b[i], 64)
		if a[i] != b[i] && (errX != nil || errY != nil || x != y) {
			return false
		}
	}
	return true
}

// outsideCheckFleetBook holds the fleet workbook to the node workbooks
// (books, by node): each node's rows of each sheet, behind the Node
// column, are its own rows in order.
func outsideCheckFleetBook(fleetBook []byte, books map[string]map[string][][]string) error {
	pops, err := outsidePopulations(fleetBook)
	if err != nil {
		return fmt.Errorf("evidence.xlsx: %v", err)
	}
	for node, b := range books {
		for sheet := range b {
			if _, ok := pops[sheet]; !ok && sheet != "Manifest" {
				return fmt.Errorf("node %s: evidence.xlsx lacks sheet %s", node, sheet)
			}
		}
	}
	for sheet, rows := range pops {
		if sheet == "Manifest" {
			continue
		}
		if len(rows) == 0 || len(rows[0]) == 0 || rows[0][0] != "Node" {
			return fmt.Errorf("evidence.xlsx: sheet %s has no Node column", sheet)
		}
		next := map[string]int{}
		for i, row := range rows[1:] {
			if len(row) == 0 {
				row = []string{""}
			}
			own, ok := books[row[0]][sheet]
			if !ok {
				return fmt.Errorf("evidence.xlsx: sheet %s row %d names node %q, which has no part", sheet, i+2, row[0])
			}
			j := next[row[0]] + 1 // past the node's header
			next[row[0]]++
			if j >= len(own) || !outsideSameRow(row[1:], own[j]) {
				return fmt.Errorf("node %s: evidence.xlsx: sheet %s row %d is not the node's row %d", row[0], sheet, i+2, j+1)
			}
		}
		for node, b := range books {
			if own := b[sheet]; next[node] != len(own)-1 {
				return fmt.Errorf("node %s: evidence.xlsx: sheet %s holds %d of the node's %d rows", node, sheet, next[node], len(own)-1)
			}
		}
	}
	return nil
}

// outsideCheckFleetManifest holds the fleet workbook's Manifest to the
// pack: its runs and nodes those of fleet.json, each node's checkpoint
// and key those of its verified part (cps) and fleet.json, no field the
// fleet Manifest does not have, and each sheet's stated row count and
// SHA-256 of rows those of the sheet (outsideSheetHashes).
func outsideCheckFleetManifest(fleetBook []byte, runs, nodes []string, keys, cps map[string]string) error {
	sheets, err := outsideSheets(fleetBook)
	if err != nil {
		return fmt.Errorf("evidence.xlsx: %v", err)
	}
	sums, err := outsideSheetHashes(fleetBook)
	if err != nil {
		return fmt.Errorf("evidence.xlsx: %v", err)
	}
	want := map[string]string{"Runs": strings.Join(runs, " "), "Nodes": strings.Join(nodes, " ")}
	for _, n := range nodes {
		want["Node "+n+": Signed checkpoint"] = cps[n]
		want["Node "+n+": Public key (ed25519, note verifier)"] = keys[n]
	}
	free := map[string]bool{"Label": true, "Export id": true, "Generated at (UTC)": true, "Filters": true,
		"Reconciliation balanced": true, "How to verify": true, "Timestamps": true}
	seen := map[string]bool{}
	table := false
	for i, row := range sheets["Manifest"] {
		row = append(row, "", "", "")
		switch {
		case i == 0:
		case table:
			rs, ok := sheets[row[0]]
			if !ok || row[0] == "Manifest" || seen["sheet "+row[0]] || row[1] != strconv.Itoa(len(rs)-1) {
				return fmt.Errorf("evidence.xlsx: sheet Manifest row %d: sheet %q with %q rows is not a sheet of the workbook as it is", i+1, row[0], row[1])
			}
			if row[2] != sums[row[0]] {
				return fmt.Errorf("evidence.xlsx: sheet Manifest row %d: sheet %s's SHA-256 of rows is %q; its rows hash to %s", i+1, row[0], row[2], sums[row[0]])
			}
			seen["sheet "+row[0]] = true
		case row[0] == "Sheet":
			table = true
		default:
			v, ok := want[row[0]]
			if (!ok && !free[row[0]]) || (ok && row[1] != v) || seen[row[0]] {
				return fmt.Errorf("evidence.xlsx: sheet Manifest row %d: %s is %q, not what the pack holds", i+1, row[0], row[1])
			}
			seen[row[0]] = true
		}
	}
	for f := range want {
		if !seen[f] {
			return fmt.Errorf("evidence.xlsx: sheet Manifest lacks %s", f)
		}
	}
	for name := range sheets {
		if name != "Manifest" && !seen["sheet "+name] {
			return fmt.Errorf("evidence.xlsx: sheet Manifest does not list sheet %s", name)
		}
	}
	return nil
}

// outsideSheetHashes computes the SHA-256 of rows of every sheet of an
// XLSX but the Manifest, as the fleet workbook's Manifest states them
// (docs/EVIDENCE-PACK.md, "Fleet packs", step 5): each row, header first,
// its cells' texts joined by tabs up to the header's last column, ended by
// a newline; a string cell its text (backslash, tab and newline escaped), a
// boolean TRUE or FALSE, a number in the date style the time it holds
// rounded to the microsecond as RFC 3339 UTC with milliseconds (the rest
// dropped), another number the shortest decimal that reads back as it.
func outsideSheetHashes(book []byte) (map[string]string, error) {
	decode, sheets, err := outsideBook(book)
	if err != nil {
		return nil, err
	}
	var styles struct {
		NumFmts []struct {
			ID   int    `xml:"numFmtId,attr"`
			Code string `xml:"formatCode,attr"`
		} `xml:"numFmts>numFmt"`
		Xfs []struct {
			NumFmt int `xml:"numFmtId,attr"`
		} `xml:"cellXfs>xf"`
	}
	if err := decode("xl/styles.xml", &styles); err != nil {
		return nil, fmt.Errorf("xl/styles.xml: %v", err)
	}
	dateFmts := map[int]bool{}
	for _, f := range styles.NumFmts {
		dateFmts[f.ID] = f.Code == `yyyy-mm-dd"T"hh:mm:ss.000"Z"`
	}
	out := map[string]string{}
	for _, s := range sheets {
		if s.name == "Manifest" {
			continue
		}
		var ws outsideWorksheet
		if err := decode(s.target, &ws); err != nil {
			return nil, fmt.Errorf("sheet %s: %v", s.name, err)
		}
		h := sha256.New()
		width := 0
		for i, r := range ws.Rows {
			var cols []string
			for _, c := range r.Cells {
				col := 0
				for _, ch := range strings.TrimRight(c.Ref, "0123456789") {
					col = col*26 + int(ch-'A'+1)
				}
				for len(cols) < col-1 {
					cols = append(cols, "")
				}
				date := c.Style >= 0 && c.Style < len(styles.Xfs) && dateFmts[styles.Xfs[c.Style].NumFmt]
				text := outsideCellText(c.Type, c.V, c.T, date)
				cols = append(cols, text)
			}
			if i == 0 {
				width = len(cols)
			}
			for len(cols) < width {
				cols = append(cols, "")
			}
			h.Write([]byte(strings.Join(cols, "\t") + "\n"))
		}
		out[s.name] = hex.EncodeToString(h.Sum(nil))
	}
	return out, nil
}

// outsideCellText is a cell's text in a sheet's hash (outsideSheetHashes):
// of type typ, its value v or its inline string t, date when its style is
// the date style.
func outsideCellText(typ, v, t string, date bool) string {
	escape := strings.NewReplacer(`\`, `\\`, "\t", `\t`, "\n", `\n`)
	x, err := strconv.ParseFloat(v, 64)
	switch {
	case typ == "inlineStr":
		return escape.Replace(t)
	case typ == "b" && v == "1":
		return "TRUE"
	case typ == "b":
		return "FALSE"
	case typ != "" && typ != "n" || err != nil:
		return escape.Replace(v)
	case date:
		days, frac := math.Modf(x)
		at := time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC).Add(time.Duration(days)*24*time.Hour + time.Duration(math.Round(frac*86400e9)))
		return at.Round(time.Microsecond).Format("2006-01-02T15:04:05.000Z")
	}
	return strconv.FormatFloat(x, 'f', -1, 64)
}
