package ledger

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"runtime/debug"
	"slices"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/note"
	"golang.org/x/mod/sumdb/tlog"
)

// DefaultProgressEvery is how many events Verify checks between two calls
// of VerifyOptions.Progress.
const DefaultProgressEvery = 1 << 16

// VerifyOptions configure Verify.
type VerifyOptions struct {
	// VerifierKey checks the checkpoints. Default: the public key in KeyDir.
	VerifierKey string

	// KeyDir is read for the public key when VerifierKey is empty.
	// Default: the bbolt file's directory.
	KeyDir string

	// Trusted is a checkpoint note kept apart from the ledger (exported
	// earlier). Without it, a ledger cut short together with its later
	// checkpoints is indistinguishable from a shorter ledger.
	Trusted []byte

	// Progress, when set, is called every DefaultProgressEvery events and
	// at the end.
	Progress func(done, total uint64)
}

// Report is the outcome of Verify.
type Report struct {
	OK          bool
	Events      uint64 // events read
	Head        uint64 // sequence number of the last contiguous event
	FirstBad    uint64 // first sequence number the ledger cannot vouch for; 0 when the chain holds
	Problem     string // what is wrong at FirstBad; empty when the chain holds
	Checkpoints int    // signed checkpoints checked against the events

	// Damage is what bbolt's own consistency check (tx.Check) found wrong
	// with the file's pages, or what could not be read of them; empty
	// when nothing. A damaged file is not intact whatever its chain.
	Damage []string
	// Index is where the run index or the idempotency index disagrees
	// with the events: an event of a run it does not list, an entry that
	// names an event of another run or none, a key that points elsewhere;
	// empty when they agree.
	Index []string
}

// Findings lists everything Verify found wrong, the chain's problem
// first; none when the ledger is intact.
func (r *Report) Findings() []string {
	var out []string
	if r.Problem != "" {
		out = append(out, fmt.Sprintf("first bad sequence %d: %s", r.FirstBad, r.Problem))
	}
	for _, d := range r.Damage {
		out = append(out, "data file: "+d)
	}
	return append(out, r.Index...)
}

// maxFindings caps the damage and index findings a Report lists.
const maxFindings = 20

// anchor is one signed checkpoint Verify holds the events against.
type anchor struct {
	tree   SignedTree
	source string // where it came from, for the report
}

// Verify checks, offline and read-only, everything the ledger in db claims:
// every record re-hashes to its stored hash and links to the one before,
// sequence numbers are contiguous from 1, the stored tree hashes are the
// ones the events give, and the recomputed tree and chain match every
// signed checkpoint (the history, the latest and opts.Trusted), which also
// proves successive checkpoints consistent with each other.
//
// It also runs bbolt's consistency check of the file's pages (tx.Check),
// and holds the run index and the idempotency index to the events. A file
// whose pages cannot be read is reported as damage, not a panic; a file
// that may be damaged should be checked with CheckFile before it is
// opened, since bbolt maps it and a page past its end faults.
//
// Tampering and damage are a Report with OK false, not an error; Verify
// returns an error only when it cannot do the check (no key, bad trusted
// checkpoint, ctx).
func Verify(ctx context.Context, db *bolt.DB, opts VerifyOptions) (*Report, error) {
	vkey := opts.VerifierKey
	if vkey == "" {
		dir := opts.KeyDir
		if dir == "" {
			dir = filepath.Dir(db.Path())
		}
		var err error
		if vkey, err = ReadPublicKey(dir); err != nil {
			return nil, fmt.Errorf("verify: %w", err)
		}
	}
	v, err := note.NewVerifier(vkey)
	if err != nil {
		return nil, fmt.Errorf("verify: verifier key: %w", err)
	}
	var anchors []anchor
	if opts.Trusted != nil {
		t, err := openCheckpoint(opts.Trusted, v)
		if err != nil {
			return nil, fmt.Errorf("verify: trusted checkpoint: %w", err)
		}
		anchors = append(anchors, anchor{t, "trusted checkpoint"})
	}

	r := &Report{}
	err = db.View(func(tx *bolt.Tx) error {
		// Damaged pages do not stop the rest: what can be read is read.
		checkPages(tx, r)
		return readSafely(r, func() error {
			events := tx.Bucket([]byte(bucketEvents))
			if events == nil {
				return verifyEmpty(r, anchors)
			}
			var bad bool
			if anchors, bad = loadAnchors(tx, v, anchors, r); bad {
				return nil
			}
			return verifyEvents(ctx, tx, anchors, opts.Progress, r)
		})
	})
	if err != nil {
		return nil, fmt.Errorf("verify: %w", err)
	}
	r.OK = r.Problem == "" && len(r.Damage) == 0 && len(r.Index) == 0
	return r, nil
}

// checkPages runs bbolt's consistency check and adds what it finds to
// r.Damage.
func checkPages(tx *bolt.Tx, r *Report) {
	n := 0
	for err := range tx.Check() {
		if n++; n <= maxFindings {
			r.Damage = append(r.Damage, err.Error())
		}
	}
	if n > maxFindings {
		r.Damage = append(r.Damage, fmt.Sprintf("and %d more", n-maxFindings))
	}
}

// readSafely runs fn, turning a panic of bbolt's on pages it cannot read
// (and, in this goroutine, a fault on memory it maps) into damage.
func readSafely(r *Report, fn func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if p := recover(); p != nil {
			r.Damage = append(r.Damage, fmt.Sprintf("reading the ledger's buckets failed: %v", p))
			err = nil
		}
	}()
	return fn()
}

func verifyEmpty(r *Report, anchors []anchor) error {
	for _, a := range anchors {
		if a.tree.Size > 0 {
			r.FirstBad, r.Problem = 1, fmt.Sprintf("ledger has no events but the %s covers %d", a.source, a.tree.Size)
		}
	}
	return nil
}

// loadAnchors adds the stored checkpoints to anchors, sorted by size. A
// checkpoint that does not verify is reported at the first event after the
// last good checkpoint before it.
func loadAnchors(tx *bolt.Tx, v note.Verifier, anchors []anchor, r *Report) ([]anchor, bool) {
	// load reports a checkpoint that does not verify at the first event
	// after the last good one below it (it vouched for nothing beyond).
	load := func(size uint64, msg []byte, source string, stored bool) bool {
		t, err := openCheckpoint(msg, v)
		if err == nil && stored && t.Size != size {
			err = fmt.Errorf("says size %d", t.Size)
		}
		if err != nil {
			r.FirstBad = 1
			for _, a := range anchors {
				if a.tree.Size < size {
					r.FirstBad = max(r.FirstBad, a.tree.Size+1)
				}
			}
			if stored {
				source = fmt.Sprintf("%s at size %d", source, size)
			}
			r.Problem = fmt.Sprintf("%s: %v", source, err)
			return false
		}
		anchors = append(anchors, anchor{t, source})
		return true
	}
	if b := tx.Bucket([]byte(bucketCheckpoints)); b != nil {
		c := b.Cursor()
		for k, msg := c.First(); k != nil; k, msg = c.Next() {
			if len(k) != 8 {
				r.FirstBad, r.Problem = 1, fmt.Sprintf("checkpoint stored under malformed key %x", k)
				return nil, true
			}
			size := binary.BigEndian.Uint64(k)
			if !load(size, msg, "history checkpoint", true) {
				return nil, true
			}
		}
	}
	if b := tx.Bucket([]byte(bucketMeta)); b != nil {
		if msg := b.Get([]byte(metaCheckpoint)); msg != nil && !load(math.MaxUint64, msg, "latest checkpoint", false) {
			return nil, true
		}
	}
	slices.SortStableFunc(anchors, func(a, b anchor) int { return cmp.Compare(a.tree.Size, b.tree.Size) })
	return anchors, false
}

// verifyEvents reads every event once, in order, and checks each against
// the one before (its chain), its own bytes, the tree hashes stored for it
// and every anchor of its size; the first that fails is r's FirstBad.
func verifyEvents(ctx context.Context, tx *bolt.Tx, anchors []anchor, progress func(done, total uint64), r *Report) error {
	events := tx.Bucket([]byte(bucketEvents))
	total := headSeq(events)
	w := &eventWalk{r: r, anchors: anchors, next: 1}
	if b := tx.Bucket([]byte(bucketTree)); b != nil {
		w.tree = b.Cursor()
		w.tk, w.tv = w.tree.First()
	}
	// Anchors of size 0 only need the empty tree.
	if !w.vouch(0) {
		return nil
	}
	index := newIndexCheck(tx, r)
	ec := newEventsCursor(events)
	expected := uint64(1)
	for seq, v, err := ec.first(); ; seq, v, err = ec.next() {
		if bad, ok := errors.AsType[*corruptAt](err); ok {
			w.fail(bad.Seq, "%s", bad.Msg)
			return nil
		} else if err != nil {
			return err
		}
		if v == nil {
			break
		}
		if seq != expected {
			w.fail(expected, "event %d is missing (the next stored event is %d)", expected, seq)
			return nil
		}
		canon, ok := w.record(seq, v)
		if !ok {
			return nil
		}
		index.observe(&w.e)
		if !w.treeHashes(seq, canon) {
			return nil
		}
		r.Events++
		if !w.vouch(seq) {
			return nil
		}
		if seq%DefaultProgressEvery == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
			if progress != nil {
				progress(seq, total)
			}
		}
		expected++
	}
	r.Head = expected - 1
	index.finish(events)
	if progress != nil {
		progress(r.Head, total)
	}
	w.end()
	return nil
}

// eventWalk is what verifyEvents has read so far: the chain and the tree
// of the events up to the current one, and where it stands in the anchors
// and the stored tree hashes.
type eventWalk struct {
	r       *Report
	anchors []anchor
	next    int    // anchors[next-1] is the next anchor to check
	vouched uint64 // events up to here match a signed checkpoint

	front  frontier
	chain  [32]byte
	leaf   leafHasher
	stored []tlog.Hash // the tree hashes the current event adds
	packed []byte      // stored, as bytes
	e      auditd.Event

	tree   *bolt.Cursor // nil without a tree bucket
	tk, tv []byte       // the tree entry being read, its unread part
}

// fail reports event seq as the first bad one, saying why. It returns
// false: the walk stops there.
func (w *eventWalk) fail(seq uint64, format string, args ...any) bool {
	w.r.FirstBad, w.r.Problem = seq, fmt.Sprintf(format, args...)
	return false
}

// record checks the stored record v of event seq: it links to the chain,
// its hash is of its bytes, and it decodes as event seq (into w.e). It
// returns the event's canonical encoding.
func (w *eventWalk) record(seq uint64, v []byte) ([]byte, bool) {
	if len(v) < 2*sha256.Size+1 {
		return nil, w.fail(seq, "event %d: record of %d bytes is too short", seq, len(v))
	}
	if !bytes.Equal(v[:sha256.Size], w.chain[:]) {
		return nil, w.fail(seq, "event %d: previous hash does not link to event %d", seq, seq-1)
	}
	body := v[:len(v)-sha256.Size]
	h := sha256.Sum256(body)
	if !bytes.Equal(h[:], v[len(v)-sha256.Size:]) {
		return nil, w.fail(seq, "event %d: stored hash does not match its bytes: altered", seq)
	}
	canon := body[sha256.Size:]
	if err := UnmarshalCanonical(canon, &w.e); err != nil {
		return nil, w.fail(seq, "event %d: %v", seq, err)
	}
	if w.e.Seq != seq {
		return nil, w.fail(seq, "event stored as %d says it is %d", seq, w.e.Seq)
	}
	w.chain = h
	return canon, true
}

// treeHashes adds event seq's leaf to the tree and checks the hashes
// stored for it. A tree entry holds the hashes of each of its events in
// turn (see doc.go): this event's come next, and the entry ends exactly
// with the event its key names.
func (w *eventWalk) treeHashes(seq uint64, canon []byte) bool {
	w.stored = w.front.push(w.leaf.hash(canon), w.stored[:0])
	w.packed = w.packed[:0]
	for _, sh := range w.stored {
		w.packed = append(w.packed, sh[:]...)
	}
	if len(w.tk) != 8 || binary.BigEndian.Uint64(w.tk) < seq || !bytes.HasPrefix(w.tv, w.packed) {
		return w.fail(seq, "event %d: stored tree hashes do not match the event", seq)
	}
	w.tv = w.tv[len(w.packed):]
	last := binary.BigEndian.Uint64(w.tk) == seq
	if last != (len(w.tv) == 0) {
		return w.fail(seq, "event %d: stored tree hashes do not match the event", seq)
	}
	if last {
		w.tk, w.tv = w.tree.Next()
	}
	return true
}

// vouch holds the events read so far, size of them, against every anchor
// of that size.
func (w *eventWalk) vouch(size uint64) bool {
	for ; w.next <= len(w.anchors) && w.anchors[w.next-1].tree.Size == size; w.next++ {
		a := w.anchors[w.next-1]
		if a.tree.Root != w.front.root() || a.tree.Chain != w.chain {
			return w.fail(w.vouched+1, "events %d to %d do not match the %s signed at size %d: rewritten after it was signed",
				w.vouched+1, size, a.source, size)
		}
		w.r.Checkpoints++
		w.vouched = size
	}
	return true
}

// end checks, once every event is read, that no anchor covers more, that
// every event is vouched for, and that no tree hash is left over.
func (w *eventWalk) end() {
	head := w.r.Head
	switch {
	case w.next <= len(w.anchors):
		a := w.anchors[len(w.anchors)-1]
		w.fail(head+1, "ledger ends at event %d but the %s covers %d: truncated", head, a.source, a.tree.Size)
	case w.vouched < head:
		w.fail(w.vouched+1, "events %d to %d are not covered by any signed checkpoint", w.vouched+1, head)
	case w.tk != nil:
		w.fail(head+1, "tree hashes stored past the last event %d", head)
	}
}
