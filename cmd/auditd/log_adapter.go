package main

import (
	"context"
	"encoding/base64"
	"errors"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/witness"
	bolt "go.etcd.io/bbolt"
	"golang.org/x/mod/sumdb/tlog"
)

// logAPI serves the ledger's tree to witnesses and auditors (api.Log):
// proofs and the checkpoint history from the ledger, cosigned checkpoints
// from the witness store.
type logAPI struct {
	r       *ledger.Reader
	led     *ledger.Ledger
	witness *witness.Store
}

func newLogAPI(db *bolt.DB, led *ledger.Ledger, witnesses []string) (logAPI, error) {
	r := ledger.NewReader(db)
	st, err := witness.Open(db, led.PublicKey(), witnesses, r)
	if err != nil {
		return logAPI{}, err
	}
	return logAPI{r: r, led: led, witness: st}, nil
}

// clientErr makes a size the ledger cannot answer for the client's error.
func clientErr(err error, field string) error {
	if errors.Is(err, ledger.ErrBadSize) {
		return &auditd.Error{Code: auditd.EINVALID, Field: field, Message: err.Error()}
	}
	return err
}

func b64s(hs []tlog.Hash) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = base64.StdEncoding.EncodeToString(h[:])
	}
	return out
}

func (a logAPI) Consistency(_ context.Context, old, new uint64) (api.ConsistencyProof, error) {
	p, err := a.r.ConsistencyProof(old, new)
	if err != nil {
		return api.ConsistencyProof{}, clientErr(err, "old")
	}
	oldRoot, err := a.r.TreeHash(old)
	if err != nil {
		return api.ConsistencyProof{}, clientErr(err, "old")
	}
	newRoot, err := a.r.TreeHash(new)
	if err != nil {
		return api.ConsistencyProof{}, clientErr(err, "new")
	}
	return api.ConsistencyProof{OldSize: old, NewSize: new, OldRoot: b64s([]tlog.Hash{oldRoot})[0],
		NewRoot: b64s([]tlog.Hash{newRoot})[0], Hashes: b64s(p)}, nil
}

func (a logAPI) Inclusion(_ context.Context, seq, size uint64) (api.Inclusion, error) {
	p, root, err := a.r.InclusionProof(seq, size)
	if err != nil {
		return api.Inclusion{}, clientErr(err, "seq")
	}
	out := api.Inclusion{Seq: seq, LeafIndex: seq - 1, TreeSize: size, RootHash: b64s([]tlog.Hash{root})[0], Hashes: b64s(p)}
	err = a.r.ScanRecords(seq, seq, func(rec *ledger.Record) error {
		out.LeafHash = b64s([]tlog.Hash{tlog.RecordHash(rec.Canonical)})[0]
		return nil
	})
	if err != nil {
		return api.Inclusion{}, err
	}
	if cp, err := a.r.CheckpointAt(size); err == nil {
		out.Checkpoint = string(cp)
	}
	return out, nil
}

func (a logAPI) Checkpoints(_ context.Context, after uint64, limit int) ([]api.CheckpointInfo, bool, error) {
	var out []api.CheckpointInfo
	more := false
	var bad error
	err := a.r.Checkpoints(after, func(size uint64, msg []byte) bool {
		if len(out) == limit {
			more = true
			return false
		}
		t, err := ledger.OpenCheckpoint(msg, a.led.PublicKey())
		if err != nil {
			bad = err
			return false
		}
		out = append(out, api.CheckpointInfo{Size: size, Root: b64s([]tlog.Hash{t.Root})[0], Time: t.Time, Note: string(msg)})
		return true
	})
	if err == nil {
		err = bad
	}
	return out, more, err
}

func (a logAPI) CheckpointAt(_ context.Context, size uint64) ([]byte, error) {
	if cp, err := a.witness.Get(size); err != nil || cp != nil {
		return cp, err
	}
	cp, err := a.r.CheckpointAt(size)
	if errors.Is(err, ledger.ErrNotFound) {
		return nil, auditd.Errorf(auditd.ENOTFOUND, "No signed checkpoint of size %d is kept; the history keeps one at least every %d events.", size, ledger.DefaultCheckpointEvery)
	}
	return cp, err
}

func (a logAPI) Cosign(_ context.Context, note []byte) (api.Cosigned, error) {
	size, names, err := a.witness.Add(note)
	if errors.Is(err, witness.ErrNotOurs) || errors.Is(err, witness.ErrUnknownWitness) {
		return api.Cosigned{}, &auditd.Error{Code: auditd.EINVALID, Field: "body", Message: err.Error()}
	}
	if err != nil {
		return api.Cosigned{}, err
	}
	return api.Cosigned{Size: size, Witnesses: names}, nil
}

func (a logAPI) Scan(from, to uint64, fn func(*auditd.Event) error) error {
	return a.led.Scan(from, to, fn)
}
