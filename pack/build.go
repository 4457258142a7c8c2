package pack

import (
	"archive/zip"
	"cmp"
	"compress/flate"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"golang.org/x/mod/sumdb/tlog"
)

// zipTime is the modification time of every entry, so that the same
// inputs give the same pack.
var zipTime = time.Date(1980, 1, 1, 0, 0, 0, 0, time.UTC)

// Builder writes evidence packs from a ledger.
type Builder struct {
	// Ledger is read for the leaves, the proofs and the checkpoint.
	Ledger *ledger.Reader
	// PublicKey is the note verifier key of the ledger's checkpoints.
	PublicKey string
	// Exporter writes the workbook; Build sets its Ledger to hand out the
	// pack's checkpoint. It must read the same ledger.
	Exporter *reports.Exporter
	// TmpDir holds the workbook while the pack is written ("" is
	// os.TempDir).
	TmpDir string
	// Retention gives the retention events of the runs' awards for the
	// workbook's Retention sheet; nil gives none (the sheet is empty).
	Retention reports.RetentionSource
}

// noRetention is a retention source with no events.
type noRetention struct{}

func (noRetention) Events([]string, func(*auditd.Event) error) error { return nil }

// Request is what one pack covers.
type Request struct {
	reports.Request
	// Checkpoint is the signed checkpoint to prove the leaves against (one
	// that witnesses cosigned, say); nil takes the latest.
	Checkpoint []byte
	// Previous is the checkpoint of an earlier pack; the pack then carries
	// the consistency proof from it to its own.
	Previous []byte
}

// fixedCheckpoint hands the exporter the pack's checkpoint, reading the
// latest once when none was chosen.
type fixedCheckpoint struct {
	r    *ledger.Reader
	key  string
	note []byte
}

func (c *fixedCheckpoint) PublicKey() string { return c.key }

func (c *fixedCheckpoint) Checkpoint() ([]byte, error) {
	if c.note == nil {
		n, err := c.r.Checkpoint()
		if err != nil {
			return nil, err
		}
		c.note = n
	}
	return c.note, nil
}

// Build writes the pack of req to w. Nothing is written to w unless the
// workbook and every proof were produced.
func (b *Builder) Build(ctx context.Context, w io.Writer, req Request) (*Manifest, error) {
	cp := &fixedCheckpoint{r: b.Ledger, key: b.PublicKey, note: req.Checkpoint}
	x := *b.Exporter
	x.Ledger = cp
	x.Retention = b.Retention
	if x.Retention == nil {
		x.Retention = noRetention{}
	}
	book, err := os.CreateTemp(b.TmpDir, "auditd-pack-*.xlsx")
	if err != nil {
		return nil, err
	}
	defer func() { book.Close(); os.Remove(book.Name()) }()
	bm, err := x.Export(ctx, book, req.Request)
	if err != nil {
		return nil, err
	}
	// The export's memory is garbage now; hand it back before the leaves
	// allocate their own, so that the build's peak RSS is the export's
	// (TestPackPeakRSS: 330 MB of anonymous memory without this, the
	// export's 290 with it, for the 1M-event run).
	debug.FreeOSMemory()
	tree, err := ledger.OpenCheckpoint(cp.note, b.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("pack checkpoint: %w", err)
	}
	if root, err := b.Ledger.TreeHash(tree.Size); err != nil || root != tree.Root {
		return nil, fmt.Errorf("pack checkpoint of size %d is not this ledger's tree (%v)", tree.Size, err)
	}
	m, proof, err := b.manifest(req, bm, tree)
	if err != nil {
		return nil, err
	}
	var cons *Consistency
	if req.Previous != nil {
		if cons, err = b.consistency(req.Previous, tree); err != nil {
			return nil, err
		}
	}
	z := newPackZip(w)
	z.put(FileVerify, verifyText(m))
	z.put(FileCheckpoint, cp.note)
	z.put(FilePublicKey, []byte(b.PublicKey+"\n"))
	if cons != nil {
		z.put(FilePreviousCheckpoint, req.Previous)
		z.putJSON(FileConsistency, cons)
	}
	z.putJSON(FileProof, proof)
	if z.err != nil {
		return nil, z.err
	}
	if err := b.leaves(ctx, z.zw, m); err != nil {
		return nil, err
	}
	z.putStored(FileWorkbook, book)
	z.putJSON(FileManifest, m)
	if z.err != nil {
		return nil, z.err
	}
	return m, z.zw.Close()
}

// manifest lists what the pack holds (its runs, retention and access
// records, the ranges of leaves that cover them) and proves each range
// against the checkpoint's tree.
func (b *Builder) manifest(req Request, bm *reports.Manifest, tree ledger.SignedTree) (*Manifest, Proof, error) {
	m := &Manifest{Format: Format, ExportID: req.ExportID, Filters: req.Filters, Origin: tree.Origin, TreeSize: tree.Size}
	for _, rep := range bm.Reports {
		r := Run{ID: rep.Run.ID, First: rep.Run.FirstSeq, Last: rep.Run.LastSeq}
		if r.Last > tree.Size {
			return nil, Proof{}, fmt.Errorf("run %s ends at event %d, after the checkpoint's %d events", r.ID, r.Last, tree.Size)
		}
		m.Runs = append(m.Runs, r)
	}
	m.Retention, m.Access = bm.Retention, bm.Access
	m.Ranges = mergeRanges(m.Runs, slices.Concat(m.Retention, m.Access))
	proof := Proof{TreeSize: tree.Size, Root: base64.StdEncoding.EncodeToString(tree.Root[:])}
	for _, rg := range m.Ranges {
		p, err := b.Ledger.ProveRange(rg.First, rg.Last, tree.Size)
		if err != nil {
			return nil, Proof{}, err
		}
		proof.Ranges = append(proof.Ranges, RangeProof{First: rg.First, Last: rg.Last, Left: b64(p.Left), Right: b64(p.Right)})
		m.Leaves += rg.Last - rg.First + 1
	}
	return m, proof, nil
}

// packZip writes a pack's files; the first error sticks and later writes
// are skipped.
type packZip struct {
	zw  *zip.Writer
	err error
}

func newPackZip(w io.Writer) *packZip {
	zw := zip.NewWriter(w)
	zw.RegisterCompressor(zip.Deflate, func(w io.Writer) (io.WriteCloser, error) {
		return flate.NewWriter(w, flate.BestSpeed)
	})
	return &packZip{zw: zw}
}

func (z *packZip) put(name string, data []byte) {
	if z.err != nil {
		return
	}
	var f io.Writer
	if f, z.err = z.zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Deflate, Modified: zipTime}); z.err == nil {
		_, z.err = f.Write(data)
	}
}

func (z *packZip) putJSON(name string, v any) {
	if z.err != nil {
		return
	}
	j, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		z.err = err
		return
	}
	z.put(name, append(j, '\n'))
}

// putStored copies the workbook in stored, not compressed again: it is a
// ZIP itself, and stored bytes can be read in place (Pack.Workbook).
func (z *packZip) putStored(name string, book *os.File) {
	if z.err != nil {
		return
	}
	if _, z.err = book.Seek(0, io.SeekStart); z.err != nil {
		return
	}
	var f io.Writer
	if f, z.err = z.zw.CreateHeader(&zip.FileHeader{Name: name, Method: zip.Store, Modified: zipTime}); z.err == nil {
		_, z.err = io.Copy(f, book)
	}
}

func (b *Builder) consistency(previous []byte, tree ledger.SignedTree) (*Consistency, error) {
	old, err := ledger.OpenCheckpoint(previous, b.PublicKey)
	if err != nil {
		return nil, fmt.Errorf("previous checkpoint: %w", err)
	}
	if old.Size > tree.Size || old.Size == 0 {
		return nil, fmt.Errorf("previous checkpoint of size %d cannot precede one of %d", old.Size, tree.Size)
	}
	if root, err := b.Ledger.TreeHash(old.Size); err != nil || root != old.Root {
		return nil, fmt.Errorf("previous checkpoint of size %d is not in this ledger's history: its tree there differs (a fork or a rewrite)", old.Size)
	}
	p, err := b.Ledger.ConsistencyProof(old.Size, tree.Size)
	if err != nil {
		return nil, err
	}
	return &Consistency{OldSize: old.Size, NewSize: tree.Size, Hashes: b64(p)}, nil
}

// mergeRanges returns the runs' ranges and the single events in order,
// overlapping or touching ones merged.
func mergeRanges(runs []Run, single []uint64) []Range {
	rs := make([]Range, 0, len(runs)+len(single))
	for _, r := range runs {
		rs = append(rs, Range{First: r.First, Last: r.Last})
	}
	for _, seq := range single {
		rs = append(rs, Range{First: seq, Last: seq})
	}
	slices.SortFunc(rs, func(a, b Range) int { return cmp.Compare(a.First, b.First) })
	var out []Range
	for _, r := range rs {
		if n := len(out); n > 0 && r.First <= out[n-1].Last+1 {
			out[n-1].Last = max(out[n-1].Last, r.Last)
			continue
		}
		out = append(out, r)
	}
	return out
}

// leaves writes events.bin and events.ndjson in one read of the ranges,
// each entry compressed on the side (deflated).
func (b *Builder) leaves(ctx context.Context, zw *zip.Writer, m *Manifest) error {
	bin, err := newDeflated(b.TmpDir)
	if err != nil {
		return err
	}
	defer bin.discard()
	nd, err := newDeflated(b.TmpDir)
	if err != nil {
		return err
	}
	defer nd.discard()
	var (
		e    auditd.Event
		line []byte
		buf  []byte
		n    int
	)
	for i := range m.Ranges {
		rg := &m.Ranges[i]
		want := rg.First
		err := b.Ledger.ScanRecords(rg.First, rg.Last, func(rec *ledger.Record) error {
			if rec.Seq != want {
				return fmt.Errorf("%w: event %d missing from the range", ledger.ErrCorrupt, want)
			}
			if want == rg.First {
				rg.PrevHash = hex.EncodeToString(rec.PrevHash[:])
			}
			want++
			if n++; n%4096 == 0 {
				if err := ctx.Err(); err != nil {
					return err
				}
			}
			if err := writeFrame(bin, rec.Canonical); err != nil {
				return err
			}
			if err := ledger.UnmarshalCanonical(rec.Canonical, &e); err != nil {
				return fmt.Errorf("event %d: %w", rec.Seq, err)
			}
			e.PrevHash, e.Hash = rec.PrevHash, rec.Hash
			buf = append(append(buf[:0], 0x00), rec.Canonical...)
			var err error
			if line, err = appendLeafLine(line[:0], &e, tlog.Hash(sha256.Sum256(buf))); err != nil {
				return err
			}
			_, err = nd.Write(line)
			return err
		})
		if err != nil {
			return err
		}
		if want != rg.Last+1 {
			return fmt.Errorf("%w: range %d to %d ends at %d", ledger.ErrCorrupt, rg.First, rg.Last, want-1)
		}
	}
	if err := bin.copyTo(zw, FileLeaves); err != nil {
		return err
	}
	return nd.copyTo(zw, FileNDJSON)
}
