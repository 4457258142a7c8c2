package pack

import (
	"archive/zip"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/auditd/auditd/reports"
)

// FleetFormat names this version of the fleet pack in fleet.json.
const FleetFormat = "auditd-fleet-pack/1"

// The entries of a fleet pack (docs/EVIDENCE-PACK.md, "Fleet packs"),
// beside one node pack per node at FleetNodePack(name).
const (
	FileFleetManifest   = "fleet.json"
	FileFleetCheckpoint = "fleet-checkpoint.txt"
)

// FleetNodePack is the entry holding a node's evidence pack, stored.
func FleetNodePack(node string) string { return "nodes/" + node + ".zip" }

// FleetManifest is fleet.json: the fleet checkpoint the pack is proven
// against, and per node where its part is and how its ledger's checkpoint
// is a leaf of the fleet log.
type FleetManifest struct {
	Format string `json:"format"`
	// Origin and TreeSize are those of fleet-checkpoint.txt.
	Origin   string `json:"origin"`
	TreeSize uint64 `json:"tree_size"`
	// Runs are the fleet runs every node part covers.
	Runs  []string    `json:"runs"`
	Nodes []FleetNode `json:"nodes"`
	// Limits are the limits in force on the runs' sources, for the
	// over-limit proof.
	Limits []FleetLimit `json:"limits,omitempty"`
	// SlotSlack is how long after its slot a dispatch may be recorded
	// (the slot's grace and the node's lag); 0: no dispatch is held to
	// the blocks.
	SlotSlack int64 `json:"slot_slack_nanos,omitempty"`
}

// FleetNode is one node's part of a fleet pack.
type FleetNode struct {
	Name string `json:"name"`
	// Key is the node ledger's note verifier key: it signs the node's
	// checkpoints and cosigns the fleet checkpoint.
	Key string `json:"key"`
	// Leaf is the fleet log leaf of the node's checkpoint (base64): the
	// node pack's checkpoint.txt with the node's name and revision
	// (fleetlog.Leaf); LeafIndex its index; Inclusion the RFC 6962
	// inclusion proof of it in the fleet checkpoint's tree (base64).
	LeafIndex uint64   `json:"leaf_index"`
	Leaf      string   `json:"leaf"`
	Inclusion []string `json:"inclusion"`
	// Blocks are the slot reservations the node was granted for the runs'
	// sources.
	Blocks []FleetBlock `json:"blocks,omitempty"`
}

// FleetBlock is one slot reservation (fleet.Block): Count slots at First,
// First+Interval, ..., granted at etcd revision Revision.
type FleetBlock struct {
	Source   string `json:"source"`
	First    int64  `json:"first_unix_nano"`
	Interval int64  `json:"interval_nanos"`
	Count    int64  `json:"count"`
	Revision int64  `json:"revision"`
}

// FleetLimit is a limit in force on a source from From (Unix
// nanoseconds; 0 for always): at most Limit dispatches in any Window.
// It is the fleet reconciliation's, whose R9 checks the same windows.
type FleetLimit = reports.FleetLimit

// FleetParts is what WriteFleet puts in a fleet pack.
type FleetParts struct {
	Manifest   FleetManifest
	Checkpoint []byte // the cosigned fleet checkpoint
	// Packs holds each node's evidence pack, by name, proven against the
	// checkpoint of its fleet leaf (Request.Checkpoint).
	Packs map[string]io.Reader
	// Workbook, when set, is the fleet run's evidence workbook merged
	// from the node packs' (reports.WriteFleetEvidence), stored as
	// FileFleetWorkbook.
	Workbook io.Reader
}

// WriteFleet writes a fleet pack of parts to w. The node packs are stored,
// not compressed, so that VerifyFleet reads them in place.
func WriteFleet(w io.Writer, parts FleetParts) error {
	m := parts.Manifest
	m.Format = FleetFormat
	zw := zip.NewWriter(w)
	put := func(name string, method uint16, r io.Reader) error {
		f, err := zw.CreateHeader(&zip.FileHeader{Name: name, Method: method, Modified: zipTime})
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		return err
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := put(FileFleetManifest, zip.Deflate, strings.NewReader(string(b))); err != nil {
		return err
	}
	if err := put(FileFleetCheckpoint, zip.Deflate, strings.NewReader(string(parts.Checkpoint))); err != nil {
		return err
	}
	for _, n := range m.Nodes {
		r := parts.Packs[n.Name]
		if r == nil {
			return fmt.Errorf("fleet pack: no pack of node %s", n.Name)
		}
		if err := put(FleetNodePack(n.Name), zip.Store, r); err != nil {
			return fmt.Errorf("fleet pack: node %s: %w", n.Name, err)
		}
	}
	if parts.Workbook != nil {
		if err := put(FileFleetWorkbook, zip.Store, parts.Workbook); err != nil {
			return fmt.Errorf("fleet pack: %s: %w", FileFleetWorkbook, err)
		}
	}
	return zw.Close()
}

// FleetPack is an opened fleet pack: its manifest and checkpoint read,
// its node packs opened in place.
type FleetPack struct {
	Manifest   FleetManifest
	Checkpoint []byte
	// Nodes are the node packs by name; a node fleet.json lists whose
	// pack is missing or malformed has none, and its error in Missing.
	Nodes   map[string]*Pack
	Missing map[string]error
	// Workbook is the fleet workbook in place (FileFleetWorkbook), nil
	// when the pack has none.
	Workbook *io.SectionReader
	// raw are the node packs' bytes, in place, by name.
	raw map[string]*io.SectionReader
	// unlisted are node packs in the ZIP that fleet.json does not list.
	unlisted []string
}

// OpenFleetFile opens the fleet pack in the file at path; close it when
// done.
func OpenFleetFile(path string) (*FleetPack, io.Closer, error) {
	return openFile(path, OpenFleet)
}

// OpenFleet reads the fleet pack in ra. It fails with ErrBadPack when
// fleet.json or the checkpoint is missing or malformed; a node pack that
// is missing or malformed is left to VerifyFleet to name (Missing).
func OpenFleet(ra io.ReaderAt, size int64) (*FleetPack, error) {
	outer, err := readEntries(ra, size)
	if err != nil {
		return nil, err
	}
	fp := &FleetPack{Nodes: map[string]*Pack{}, Missing: map[string]error{}, raw: map[string]*io.SectionReader{}}
	if err := outer.readJSON(FileFleetManifest, &fp.Manifest); err != nil {
		return nil, err
	}
	if fp.Manifest.Format != FleetFormat {
		return nil, fmt.Errorf("%w: %s: format %q, want %q", ErrBadPack, FileFleetManifest, fp.Manifest.Format, FleetFormat)
	}
	if fp.Checkpoint, err = outer.small(FileFleetCheckpoint); err != nil {
		return nil, err
	}
	listed := map[string]bool{}
	for _, n := range fp.Manifest.Nodes {
		if listed[n.Name] {
			return nil, fmt.Errorf("%w: %s lists node %s twice", ErrBadPack, FileFleetManifest, n.Name)
		}
		listed[n.Name] = true
		p, raw, err := openNested(ra, outer.files[FleetNodePack(n.Name)])
		if err != nil {
			fp.Missing[n.Name] = err
			continue
		}
		fp.Nodes[n.Name], fp.raw[n.Name] = p, raw
	}
	if f := outer.files[FileFleetWorkbook]; f != nil {
		if f.Method != zip.Store {
			return nil, fmt.Errorf("%w: %s is compressed; a fleet pack stores it", ErrBadPack, FileFleetWorkbook)
		}
		off, err := f.DataOffset()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrBadPack, FileFleetWorkbook, err)
		}
		fp.Workbook = io.NewSectionReader(ra, off, int64(f.CompressedSize64))
	}
	for name := range outer.files {
		if node, ok := strings.CutPrefix(name, "nodes/"); ok && !listed[strings.TrimSuffix(node, ".zip")] {
			fp.unlisted = append(fp.unlisted, name)
		}
	}
	return fp, nil
}

// NodePack returns the bytes of node's pack, to copy into another fleet
// pack (a node's part into the fleet's); nil when it has none.
func (fp *FleetPack) NodePack(node string) io.Reader {
	r := fp.raw[node]
	if r == nil {
		return nil
	}
	return io.NewSectionReader(r, 0, r.Size())
}

// openNested opens a stored node pack in place.
func openNested(ra io.ReaderAt, f *zip.File) (*Pack, *io.SectionReader, error) {
	if f == nil {
		return nil, nil, fmt.Errorf("%w: no such entry", ErrBadPack)
	}
	if f.Method != zip.Store {
		return nil, nil, fmt.Errorf("%w: %s is compressed; a fleet pack stores it", ErrBadPack, f.Name)
	}
	off, err := f.DataOffset()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrBadPack, f.Name, err)
	}
	raw := io.NewSectionReader(ra, off, int64(f.CompressedSize64))
	p, err := Open(raw, raw.Size())
	return p, raw, err
}
