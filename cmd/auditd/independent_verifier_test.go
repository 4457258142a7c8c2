package main

// An evidence pack verifier written from docs/EVIDENCE-PACK.md alone, as
// an outside auditor would: it uses only the standard library,
// transparency-dev/merkle (RFC 6962) and golang.org/x/mod/sumdb/note, and
// none of auditd's code (TestIndependentVerifierImports holds it to that).

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/transparency-dev/merkle/compact"
	"github.com/transparency-dev/merkle/rfc6962"
	"golang.org/x/mod/sumdb/note"
)

// outsideEvent is the part of an event's canonical encoding the
// outsider's checks read.
type outsideEvent struct {
	seq                    uint64
	typ, run, source, item string
	method, path           string
	detail                 string
	cause                  string // tag 35: a dispatch.interrupted's Reason, among others
	page, attempt          uint64
	status                 int64
	time                   time.Time
	chain                  [32]byte
}

// decodeOutside decodes the canonical encoding: a version byte 1, then
// tag and value pairs in increasing tag order.
func decodeOutside(b []byte) (outsideEvent, error) {
	var e outsideEvent
	if len(b) == 0 || b[0] != 1 {
		return e, errors.New("not version 1")
	}
	strTags := map[byte]bool{2: true, 3: true, 4: true, 5: true, 10: true, 11: true, 12: true, 18: true,
		22: true, 23: true, 31: true, 32: true, 33: true, 34: true, 35: true, 36: true, 37: true}
	i, last := 1, byte(0)
	for i < len(b) {
		tag := b[i]
		i++
		if tag <= last || tag > 37 {
			return e, fmt.Errorf("tag %d out of order", tag)
		}
		last = tag
		switch {
		case tag == 20: // Clamped: the bare tag
		case strTags[tag]:
			n, w := binary.Uvarint(b[i:])
			if w <= 0 || n > uint64(len(b)-i-w) {
				return e, errors.New("bad string")
			}
			s := string(b[i+w : i+w+int(n)])
			i += w + int(n)
			switch tag {
			case 2:
				e.typ = s
			case 3:
				e.run = s
			case 4:
				e.source = s
			case 5:
				e.item = s
			case 11:
				e.method = s
			case 12:
				e.path = s
			case 35:
				e.cause = s
			case 37:
				e.detail = s
			}
		case tag == 1 || tag == 6 || tag == 7:
			v, w := binary.Uvarint(b[i:])
			if w <= 0 {
				return e, errors.New("bad uvarint")
			}
			i += w
			switch tag {
			case 1:
				e.seq = v
			case 6:
				e.page = v
			case 7:
				e.attempt = v
			}
		default:
			v, w := binary.Varint(b[i:])
			if w <= 0 {
				return e, errors.New("bad varint")
			}
			i += w
			switch tag {
			case 8:
				e.time = time.Unix(0, v).UTC()
			case 13:
				e.status = v
			}
		}
	}
	return e, nil
}

// outsideVerify checks the pack at path against key, the ledger's
// published verifier key, and returns what does not hold.
func outsideVerify(packBytes []byte, key string) error {
	zr, err := zip.NewReader(bytes.NewReader(packBytes), int64(len(packBytes)))
	if err != nil {
		return err
	}
	read := func(name string) ([]byte, error) { return readZipEntry(zr, name) }
	// 1. The key and the checkpoint.
	pub, err := read("public-key.txt")
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(pub)) != key {
		return errors.New("public-key.txt is not the published key")
	}
	v, err := note.NewVerifier(key)
	if err != nil {
		return err
	}
	cpBytes, err := read("checkpoint.txt")
	if err != nil {
		return err
	}
	n, err := note.Open(cpBytes, note.VerifierList(v))
	if err != nil {
		return fmt.Errorf("checkpoint: %v", err)
	}
	lines := strings.Split(n.Text, "\n")
	if len(lines) < 4 {
		return errors.New("checkpoint: short")
	}
	size, err := strconv.ParseUint(lines[1], 10, 64)
	if err != nil {
		return fmt.Errorf("checkpoint: size: %v", err)
	}
	root, err := base64.StdEncoding.DecodeString(lines[2])
	if err != nil {
		return fmt.Errorf("checkpoint: root: %v", err)
	}

	// 2. The manifest and the proof.
	var manifest struct {
		TreeSize uint64 `json:"tree_size"`
		Runs     []struct {
			ID    string `json:"id"`
			First uint64 `json:"first_seq"`
			Last  uint64 `json:"last_seq"`
		} `json:"runs"`
		Ranges []struct {
			First    uint64 `json:"first_seq"`
			Last     uint64 `json:"last_seq"`
			PrevHash string `json:"prev_hash"`
		} `json:"ranges"`
	}
	var proof struct {
		Ranges []struct {
			Left, Right []string
		} `json:"ranges"`
	}
	for name, v := range map[string]any{"pack.json": &manifest, "proof.json": &proof} {
		b, err := read(name)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("%s: %v", name, err)
		}
	}
	if manifest.TreeSize != size || len(proof.Ranges) != len(manifest.Ranges) {
		return errors.New("pack.json and proof.json do not match the checkpoint")
	}

	// 3. The leaves, the root and the chain.
	bin, err := read("events.bin")
	if err != nil {
		return err
	}
	events := map[uint64]outsideEvent{}
	var order []uint64
	rf := &compact.RangeFactory{Hash: rfc6962.DefaultHasher.HashChildren}
	unb := func(ss []string) ([][]byte, error) {
		var out [][]byte
		for _, s := range ss {
			b, err := base64.StdEncoding.DecodeString(s)
			if err != nil {
				return nil, err
			}
			out = append(out, b)
		}
		return out, nil
	}
	for i, rg := range manifest.Ranges {
		left, err := unb(proof.Ranges[i].Left)
		if err != nil {
			return fmt.Errorf("proof.json: %v", err)
		}
		cr, err := rf.NewRange(0, rg.First-1, left)
		if err != nil {
			return fmt.Errorf("proof.json: %v", err)
		}
		var chain [32]byte
		if _, err := hex.Decode(chain[:], []byte(rg.PrevHash)); err != nil {
			return fmt.Errorf("pack.json: prev_hash: %v", err)
		}
		for seq := rg.First; seq <= rg.Last; seq++ {
			if len(bin) < 4 {
				return fmt.Errorf("events.bin: leaf %d missing", seq-1)
			}
			l := binary.BigEndian.Uint32(bin)
			if uint64(len(bin)-4) < uint64(l) {
				return fmt.Errorf("events.bin: leaf %d cut short", seq-1)
			}
			leaf := bin[4 : 4+l]
			bin = bin[4+l:]
			e, err := decodeOutside(leaf)
			if err != nil || e.seq != seq {
				return fmt.Errorf("events.bin: leaf %d is not event %d (%v)", seq-1, seq, err)
			}
			chain = sha256.Sum256(append(chain[:], leaf...))
			e.chain = chain
			events[seq] = e
			order = append(order, seq)
			if err := cr.Append(rfc6962.DefaultHasher.HashLeaf(leaf), nil); err != nil {
				return err
			}
		}
		right, err := unb(proof.Ranges[i].Right)
		if err != nil {
			return fmt.Errorf("proof.json: %v", err)
		}
		rr, err := rf.NewRange(rg.Last, size, right)
		if err != nil {
			return fmt.Errorf("proof.json: %v", err)
		}
		if err := cr.AppendRange(rr, nil); err != nil {
			return fmt.Errorf("proof.json: %v", err)
		}
		got, err := cr.GetRootHash(nil)
		if err != nil || !bytes.Equal(got, root) {
			return fmt.Errorf("events %d to %d with proof.json do not rebuild the checkpoint's root", rg.First, rg.Last)
		}
	}
	if len(bin) != 0 {
		return errors.New("events.bin: leaves beyond the ranges")
	}

	// 4. The workbook: the Manifest holds the checkpoint, and the
	// Dispatches rows are exactly the runs' dispatch leaves.
	book, err := read("evidence.xlsx")
	if err != nil {
		return err
	}
	sheets, err := outsideSheets(book)
	if err != nil {
		return fmt.Errorf("evidence.xlsx: %v", err)
	}
	found := false
	for _, row := range sheets["Manifest"] {
		found = found || len(row) > 1 && row[0] == "Signed checkpoint" && row[1] == string(cpBytes)
	}
	if !found {
		return errors.New("evidence.xlsx: the Manifest does not hold checkpoint.txt")
	}
	inRun := map[string]bool{}
	for _, r := range manifest.Runs {
		inRun[r.ID] = true
	}
	var want []uint64
	for _, seq := range order {
		if e := events[seq]; e.typ == "dispatch" && inRun[e.run] {
			want = append(want, seq)
		}
	}
	rows := sheets["Dispatches"]
	if len(rows) == 0 || len(rows)-1 != len(want) {
		return fmt.Errorf("evidence.xlsx: Dispatches has %d rows, the leaves %d dispatches", max(len(rows)-1, 0), len(want))
	}
	col := map[string]int{}
	for i, title := range rows[0] {
		col[title] = i
	}
	cellAt := func(row []string, title string) string {
		if i, ok := col[title]; ok && i < len(row) {
			return row[i]
		}
		return ""
	}
	for i, row := range rows[1:] {
		seq, err := strconv.ParseUint(cellAt(row, "Seq"), 10, 64)
		e, ok := events[seq]
		if err != nil || !ok || seq != want[i] {
			return fmt.Errorf("evidence.xlsx: Dispatches row %d is seq %q; the leaves give %d", i+2, cellAt(row, "Seq"), want[i])
		}
		checks := []struct{ title, want string }{
			{"Run", e.run}, {"Item", e.item}, {"Source", e.source}, {"Method", e.method},
			{"Page", strconv.FormatUint(e.page, 10)}, {"Attempt", strconv.FormatUint(e.attempt, 10)},
			{"Event hash", hex.EncodeToString(e.chain[:])},
		}
		if e.page == 0 {
			checks[4].want = "0"
		}
		// A dispatch's cost (records) is its Detail's {"cost":N}; 1 when
		// it names none.
		var d struct {
			Cost int64 `json:"cost"`
		}
		if json.Unmarshal([]byte(e.detail), &d) != nil || d.Cost < 1 {
			d.Cost = 1
		}
		checks = append(checks, struct{ title, want string }{"Cost (records)", strconv.FormatInt(d.Cost, 10)})
		for _, c := range checks {
			if got := cellAt(row, c.title); got != c.want {
				return fmt.Errorf("evidence.xlsx: Dispatches row %d (seq %d) %s is %q; its leaf says %q", i+2, seq, c.title, got, c.want)
			}
		}
		if !strings.HasPrefix(e.path, cellAt(row, "Path (credentials stripped)")) && cellAt(row, "Path (credentials stripped)") != e.path {
			return fmt.Errorf("evidence.xlsx: Dispatches row %d (seq %d) path is not its leaf's", i+2, seq)
		}
		days, err := strconv.ParseFloat(cellAt(row, "Dispatched at"), 64)
		at := time.Date(1899, 12, 30, 0, 0, 0, 0, time.UTC).Add(time.Duration(math.Round(days * 86400e9)))
		if err != nil || at.Sub(e.time).Abs() > time.Millisecond {
			return fmt.Errorf("evidence.xlsx: Dispatches row %d (seq %d) dispatched at %s; its leaf says %s", i+2, seq, at, e.time)
		}
		// The row's status is that of the dispatch's outcome: the next
		// response or throttle of the same request.
		var status string
		for _, s := range order {
			o := events[s]
			if s > seq && o.run == e.run && o.item == e.item && o.page == e.page && o.attempt == e.attempt && (o.typ == "response" || o.typ == "throttle") {
				status = strconv.FormatInt(o.status, 10)
				break
			}
		}
		if got := cellAt(row, "Status"); got != status {
			return fmt.Errorf("evidence.xlsx: Dispatches row %d (seq %d) status %q; its outcome's leaf says %q", i+2, seq, got, status)
		}
	}
	return nil
}

// errNoPart: an XLSX has no such part.
var errNoPart = errors.New("no part")

// outsideSheet is a sheet of an XLSX and the part that holds it.
type outsideSheet struct{ name, target string }

// outsideBook opens an XLSX with encoding/xml: decode reads one of its
// parts into v, and sheets are its sheets in order, each with its part.
func outsideBook(book []byte) (decode func(name string, v any) error, sheets []outsideSheet, err error) {
	zr, err := zip.NewReader(bytes.NewReader(book), int64(len(book)))
	if err != nil {
		return nil, nil, err
	}
	files := map[string]*zip.File{}
	for _, f := range zr.File {
		files[f.Name] = f
	}
	decode = func(name string, v any) error {
		f, ok := files[name]
		if !ok {
			return fmt.Errorf("%w %s", errNoPart, name)
		}
		rc, err := f.Open()
		if err != nil {
			return err
		}
		defer rc.Close()
		return xml.NewDecoder(rc).Decode(v)
	}
	var wb struct {
		Sheets []struct {
			Name string `xml:"name,attr"`
			ID   string `xml:"http://schemas.openxmlformats.org/officeDocument/2006/relationships id,attr"`
		} `xml:"sheets>sheet"`
	}
	var rels struct {
		Rels []struct {
			ID     string `xml:"Id,attr"`
			Target string `xml:"Target,attr"`
		} `xml:"Relationship"`
	}
	if err := decode("xl/workbook.xml", &wb); err != nil {
		return nil, nil, fmt.Errorf("xl/workbook.xml: %v", err)
	}
	if err := decode("xl/_rels/workbook.xml.rels", &rels); err != nil {
		return nil, nil, fmt.Errorf("xl/_rels/workbook.xml.rels: %v", err)
	}
	for _, s := range wb.Sheets {
		sh := outsideSheet{name: s.Name}
		for _, r := range rels.Rels {
			if r.ID == s.ID {
				sh.target = path.Join("xl", r.Target)
			}
		}
		sheets = append(sheets, sh)
	}
	return decode, sheets, nil
}

// outsideSheets reads every sheet of an XLSX into rows of cell texts,
// shared and inline strings resolved, with encoding/xml.
func outsideSheets(book []byte) (map[string][][]string, error) {
	decode, sheets, err := outsideBook(book)
	if err != nil {
		return nil, err
	}
	var shared []string
	var sst struct {
		SI []struct {
			T string `xml:"t"`
		} `xml:"si"`
	}
	if err := decode("xl/sharedStrings.xml", &sst); err == nil {
		for _, si := range sst.SI {
			shared = append(shared, si.T)
		}
	} else if !errors.Is(err, errNoPart) {
		return nil, err
	}
	out := map[string][][]string{}
	for _, s := range sheets {
		var ws outsideWorksheet
		if err := decode(s.target, &ws); err != nil {
			return nil, fmt.Errorf("sheet %s: %v", s.name, err)
		}
		for _, r := range ws.Rows {
			var row []string
			for _, c := range r.Cells {
				colIdx := 0
				for _, ch := range c.Ref {
					if ch < 'A' || ch > 'Z' {
						break
					}
					colIdx = colIdx*26 + int(ch-'A'+1)
				}
				for len(row) < colIdx-1 {
					row = append(row, "")
				}
				text := c.V
				switch c.Type {
				case "inlineStr":
					text = c.T
				case "s":
					i, _ := strconv.Atoi(c.V)
					if i >= 0 && i < len(shared) {
						text = shared[i]
					}
				}
				row = append(row, text)
			}
			out[s.name] = append(out[s.name], row)
		}
	}
	return out, nil
}

// outsideWorksheet is a worksheet's cells as the outsiders' verifiers read
// them with encoding/xml: reference, type, style, value, inline text.
type outsideWorksheet struct {
	Rows []struct {
		Cells []struct {
			Ref   string `xml:"r,attr"`
			Type  string `xml:"t,attr"`
			Style int    `xml:"s,attr"`
			V     string `xml:"v"`
			T     string `xml:"is>t"`
		} `xml:"c"`
	} `xml:"sheetData>row"`
}
