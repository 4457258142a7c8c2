package pack

import (
	"bufio"
	"cmp"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/witness"
)

// Options configure Verify.
type Options struct {
	// Key is the ledger's verifier key from a source the verifier trusts.
	// Empty trusts the pack's own public-key.txt, and the report says so:
	// a pack re-signed whole under another key is then not caught.
	Key string
	// Witnesses are C2SP cosignature verifier keys; each must have
	// cosigned the pack's checkpoint.
	Witnesses []string
	// Previous is an earlier pack of the same ledger: the two checkpoints
	// must be consistent (the same tree, or this one an extension of it).
	Previous *Pack
}

// Report is the outcome of Verify.
type Report struct {
	OK         bool
	Origin     string
	TreeSize   uint64
	Leaves     uint64
	KeyTrusted bool             // the key was given, not taken from the pack
	Rows       map[string]int64 // data rows checked, per population
	Sheets     []string         // the workbook's sheets checked
	Witnessed  []string         // witnesses whose cosignature verified
	Consistent string           // what was proven of the previous checkpoint, if any
	Problems   []string         // what does not hold, each naming where
}

func (r *Report) fail(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// Verify checks everything p says, offline. Failures are Problems in the
// Report, not errors; an error means the check could not be done (an
// unreadable entry).
func Verify(p *Pack, opts Options) (*Report, error) {
	m := &p.Manifest
	r := &Report{Origin: m.Origin, TreeSize: m.TreeSize, Leaves: m.Leaves, Rows: map[string]int64{}}
	key := p.PublicKey
	if opts.Key != "" {
		r.KeyTrusted = true
		if opts.Key != p.PublicKey {
			r.fail("%s is not the trusted key: the pack names %q", FilePublicKey, p.PublicKey)
		}
		key = opts.Key
	}
	tree, err := ledger.OpenCheckpoint(p.Checkpoint, key)
	if err != nil {
		r.fail("%s: %v", FileCheckpoint, err)
	} else {
		if tree.Size != m.TreeSize || tree.Origin != m.Origin {
			r.fail("%s is of %s at size %d, %s says %s at %d", FileCheckpoint, tree.Origin, tree.Size, FileManifest, m.Origin, m.TreeSize)
		}
		if root := base64.StdEncoding.EncodeToString(tree.Root[:]); root != p.Proof.Root {
			r.fail("%s: root %s is not the checkpoint's %s", FileProof, p.Proof.Root, root)
		}
	}
	for _, wk := range opts.Witnesses {
		v, err := witness.NewVerifier(wk)
		if err != nil {
			return nil, err
		}
		if _, err := witness.Cosigned(p.Checkpoint, v); err != nil {
			r.fail("%s: %v", FileCheckpoint, err)
			continue
		}
		r.Witnessed = append(r.Witnessed, v.Name())
	}
	if err := p.readSingles(r); err != nil {
		return nil, err
	}
	// The runs' reconciliations, which the derived sheets are checked
	// against, are computed from the leaves beside the other two reads.
	type reconciled struct {
		reps []*reports.Report
		err  error
	}
	recs := make(chan reconciled, 1)
	go func() {
		reps, err := p.reconcile()
		recs <- reconciled{reps, err}
	}()
	derived := sync.OnceValues(func() ([]*reports.Report, error) {
		rc := <-recs
		return rc.reps, rc.err
	})
	// The leaves and the workbook are checked side by side: each reads
	// the leaves once.
	var (
		wg            sync.WaitGroup
		leaves, book  Report
		lerr, bookErr error
	)
	book.Rows = r.Rows
	feed := newLeafFeed(p.Manifest.Ranges[0].First)
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer feed.end()
		lerr = p.verifyLeaves(tree, feed, &leaves)
	}()
	bookErr = p.verifyWorkbook(feed, derived, &book)
	wg.Wait()
	if err := errors.Join(lerr, bookErr); err != nil {
		return nil, err
	}
	r.Problems = append(append(r.Problems, leaves.Problems...), book.Problems...)
	r.Sheets = book.Sheets
	p.verifyConsistency(key, tree, opts.Previous, r)
	r.OK = len(r.Problems) == 0
	return r, nil
}

// readSingles reads the retention events and the access events after the
// runs' ranges that the manifest lists from the leaves (decoding no
// other), for the workbook's Retention and Access log rows.
func (p *Pack) readSingles(r *Report) error {
	p.retention, p.access = nil, nil
	if len(p.Manifest.Retention) == 0 && len(p.Manifest.Access) == 0 {
		return nil
	}
	want := map[uint64]string{}
	for _, seq := range p.Manifest.Retention {
		want[seq] = "retention"
	}
	for _, seq := range p.Manifest.Access {
		want[seq] = "access"
	}
	rc, err := p.open(FileLeaves)
	if err != nil {
		return err
	}
	defer rc.Close()
	br := bufio.NewReaderSize(rc, 1<<16)
	var buf, hbuf []byte
	for _, rg := range p.Manifest.Ranges {
		// The chain hashes (the rows' Event hash) of a range that holds a
		// listed event are computed from its start.
		need := false
		for seq := range want {
			need = need || seq >= rg.First && seq <= rg.Last
		}
		var chain [32]byte
		hex.Decode(chain[:], []byte(rg.PrevHash))
		for seq := rg.First; seq <= rg.Last; seq++ {
			b, err := readFrame(br, buf, ledger.MaxEventSize)
			if err != nil {
				return nil // verifyLeaves names it
			}
			buf = b
			if !need {
				continue
			}
			prev := chain
			hbuf = append(append(hbuf[:0], chain[:]...), b...)
			chain = sha256.Sum256(hbuf)
			what, ok := want[seq]
			if !ok {
				continue
			}
			var e auditd.Event
			if err := ledger.UnmarshalCanonical(b, &e); err != nil {
				return nil
			}
			e.PrevHash, e.Hash = prev, chain
			switch {
			case what == "access" && e.Type.Access():
				p.access = append(p.access, e)
			case what == "retention" && e.Type.Retention():
				p.retention = append(p.retention, e)
			default:
				r.fail("%s: event %d is listed as a %s event but is a %s", FileManifest, seq, what, e.Type)
			}
		}
	}
	// The workbook lists access events in the manifest's order (run after
	// run), the leaves hold them in sequence order.
	at := make(map[uint64]int, len(p.Manifest.Access))
	for i, seq := range p.Manifest.Access {
		at[seq] = i
	}
	slices.SortStableFunc(p.access, func(a, b auditd.Event) int { return cmp.Compare(at[a.Seq], at[b.Seq]) })
	return nil
}
