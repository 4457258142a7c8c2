package api

import (
	"context"
	"io"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
)

// This file declares what the API needs from the rest of auditd. Each
// interface is the consumer's view: cmd/auditd adapts the real packages to
// it, and tests use in-memory fakes. Every method returns an *auditd.Error
// for what the client got wrong (EINVALID naming the field, ENOTFOUND,
// ECONFLICT) and any other error for what the server got wrong.

// Tokens authenticates requests and manages API tokens. *auth.Store
// implements it; its Create and Revoke record their own token.changed events.
type Tokens interface {
	Authenticate(secret string) (auth.Token, error)
	Create(ctx context.Context, name string, role auth.Role, by string) (auth.Token, string, error)
	List() ([]auth.Token, error)
	Revoke(ctx context.Context, id, by string) (tok auth.Token, changed bool, err error)
}

// Sources is the registry: configured sources and what has been learned
// about them.
type Sources interface {
	// PutSource creates or replaces a source's configuration on behalf of
	// principal and reports whether it was new. It records the change as a
	// source.changed event (Principal; Detail the configuration without
	// header values) before it returns, and changes nothing when it fails.
	PutSource(ctx context.Context, src auditd.Source, principal string) (created bool, err error)
	// Source returns one source's state; ENOTFOUND when there is none.
	Source(ctx context.Context, id string) (SourceState, error)
	// Sources returns every source's state, sorted by id.
	Sources(ctx context.Context) ([]SourceState, error)
}

// SourceState is a source's configuration with what auditd has learned
// about it and where its gates stand now.
type SourceState struct {
	Config  auditd.Source
	Learned Learned
	Breaker Breaker
	// PausedUntil is when the source's (or its group's) pause ends; zero
	// when it is not paused.
	PausedUntil time.Time
}

// Learned is the limit in force for a source and what taught it.
type Learned struct {
	Limit     int
	Window    time.Duration
	Cause     string // what taught it: header, 429, probe_up, operator, config
	ChangedAt time.Time
	// Concurrency is the requests the source may have in flight, as
	// learned within its configured concurrency.
	Concurrency int
}

// Breaker is a source's circuit breaker now.
type Breaker struct {
	State    string // closed, open or half_open
	Failures int
	Until    time.Time // end of the cooldown while open; zero otherwise
}

// Runs is the store of runs and items, and the fetch loop that creates
// and cancels them.
type Runs interface {
	// CreateRun stores and starts a run. The caller has validated nr's shape;
	// CreateRun still refuses (EINVALID with the field) what only it can
	// check, storing nothing. When another run already holds
	// nr.IdempotencyKey it returns that run with created false, or
	// ECONFLICT when that run was submitted with other contents.
	CreateRun(ctx context.Context, nr auditd.NewRun) (run auditd.RunView, created bool, err error)
	// RunByIdempotencyKey returns the run created with nr.IdempotencyKey:
	// ENOTFOUND when there is none, ECONFLICT when it was created from a
	// request with other contents than nr (a key answers retries of its
	// first request only). The API scopes keys to the token that sent them.
	RunByIdempotencyKey(ctx context.Context, nr auditd.NewRun) (auditd.RunView, error)
	// Run returns one run with its live counts; ENOTFOUND when unknown.
	Run(ctx context.Context, id string) (auditd.RunView, error)
	// Runs returns up to f.Limit runs matching f, newest first, after the run
	// with id f.After; next is the id of the last run returned when more may
	// follow, "" otherwise.
	Runs(ctx context.Context, f auditd.RunFilter) (runs []auditd.RunView, next string, err error)
	// CancelRun stops a run on behalf of principal; ECONFLICT when it has
	// already finished.
	CancelRun(ctx context.Context, id, principal string) (auditd.RunView, error)
	// FinishRun ends a proxy-mode run on behalf of principal once its
	// requests in flight are answered, and returns it finished; it closes
	// an open batch run, which then ends once its items do; ECONFLICT for
	// a batch run submitted whole or one that has ended.
	FinishRun(ctx context.Context, id, principal string) (auditd.RunView, error)
	// AddRunItems adds a page of items to an open batch run and returns
	// the run. The caller has validated the page's shape; AddRunItems
	// refuses (EINVALID with the field) a key the run has, storing
	// nothing; ECONFLICT when the run is not an open batch run.
	AddRunItems(ctx context.Context, id string, items []auditd.Item) (auditd.RunView, error)
	// AddRunItemsStream adds a page too large to hold to an open batch
	// run: next yields its items a chunk at a time, each validated alone
	// by the caller, and io.EOF after the last. The page is the run's
	// whole once next is done, or, if next fails or a chunk is refused
	// (EINVALID naming the chunk's item as "items[i]"), not at all.
	AddRunItemsStream(ctx context.Context, id string, next func() ([]auditd.Item, error)) (auditd.RunView, error)
	// Acknowledge records that the downstream pipeline loaded the items
	// with keys; it returns how many were newly acknowledged. A key that
	// names no delivered item of the run is EINVALID with Field "items[i]",
	// and then nothing is recorded.
	Acknowledge(ctx context.Context, runID string, keys []string, principal string) (int, error)
	// Items returns up to limit items of a run in submission order after the
	// item with key after ("" for the first page); next as for Runs. An
	// after that names no item of the run is EINVALID with Field "cursor".
	Items(ctx context.Context, runID, after string, limit int) (items []auditd.ItemView, next string, err error)
	// Item returns one item; ENOTFOUND when the run or the key is unknown.
	Item(ctx context.Context, runID, key string) (auditd.ItemView, error)
	// Payload opens the payload an item staged; ENOTFOUND when it has none.
	Payload(ctx context.Context, runID, key string) (io.ReadCloser, error)
}

// Proxy carries out requests sent through the proxy route (*fetch.Loop):
// it paces, records and forwards each, and writes its one final response
// to out. When it returns an error it has written nothing, and meta says
// what is known of the request (its item, attempts, RetryAfter). Errors:
// ENOTFOUND for an unknown run or source, ECONFLICT for a run that takes
// no proxied requests or an item key it has, EUNAVAILABLE when the
// request was not answered by its deadline (meta.RetryAfter), EUPSTREAM
// when the upstream could not be reached.
type Proxy interface {
	Proxy(ctx context.Context, req *auditd.ProxyRequest, out auditd.ProxyResponder) (meta auditd.ProxyMeta, err error)
}

// Ledger is what the API reads from the ledger and the one event it writes
// itself (export.downloaded). *ledger.Ledger implements it.
type Ledger interface {
	auditd.Appender
	// ScanRun visits a run's events with Seq > after, in order.
	ScanRun(runID string, after uint64, fn func(*auditd.Event) error) error
	// Head returns the newest event's sequence number and hash.
	Head() (seq uint64, hash [32]byte)
	// Checkpoint returns the latest signed checkpoint note.
	Checkpoint() ([]byte, error)
	// PublicKey returns the note verifier key that checks checkpoints.
	PublicKey() string
}

// Integrity checks the ledger and proves events belong to it.
type Integrity interface {
	// Verify checks the whole ledger: hash chain, Merkle tree, checkpoints.
	// A ledger that fails the check is a Verification with OK false, not
	// an error.
	Verify(ctx context.Context) (Verification, error)
	// Prove returns the inclusion proof of event seq in the tree of the
	// latest checkpoint; ENOTFOUND when no event has seq.
	Prove(ctx context.Context, seq uint64) (Proof, error)
}

// Verification is the outcome of a full ledger check.
type Verification struct {
	OK       bool   `json:"ok"`
	Events   uint64 `json:"events"`              // events checked
	HeadSeq  uint64 `json:"head_seq"`            // newest event checked
	HeadHash string `json:"head_hash"`           // its hash, hex
	FirstBad uint64 `json:"first_bad,omitempty"` // first bad sequence number when not OK
	Problem  string `json:"problem,omitempty"`   // what is wrong there
	// Findings lists everything found wrong: the chain's problem, damage
	// to the file's pages (bbolt's check), the run and idempotency
	// indexes disagreeing with the events. Empty when OK.
	Findings []string `json:"findings,omitempty"`
}

// Proof is an RFC 6962 inclusion proof of one event.
type Proof struct {
	Seq        uint64   `json:"seq"`
	LeafHash   string   `json:"leaf_hash"`  // base64, as tlog prints hashes
	TreeSize   uint64   `json:"tree_size"`  // size of the checkpoint's tree
	RootHash   string   `json:"root_hash"`  // base64
	Hashes     []string `json:"hashes"`     // the proof, base64, leaf to root
	Checkpoint string   `json:"checkpoint"` // the signed note the proof checks against
}

// Reports writes reconciliations and evidence workbooks. Each method writes
// the whole document to w; until it first writes, an error still reaches the
// client as a problem.
type Reports interface {
	// WriteReconciliation writes a run's reconciliation as format: "json",
	// "csv" or "xlsx". The JSON is an object with at least "run_id",
	// "balanced" and "checks" (see openapi.yaml, Reconciliation).
	WriteReconciliation(ctx context.Context, w io.Writer, runID, format string) error
	// WriteRunEvidence writes a run's evidence workbook (XLSX).
	WriteRunEvidence(ctx context.Context, w io.Writer, runID string) error
	// WriteAwardEvidence writes the evidence workbook (XLSX) of every run of
	// award f.FAIN created in [f.From, f.To) (zero: from the first run, up
	// to now).
	WriteAwardEvidence(ctx context.Context, w io.Writer, f auditd.RunFilter) error
}

// Packs builds evidence packs (docs/EVIDENCE-PACK.md) from the serving
// ledger, which keeps taking events meanwhile.
type Packs interface {
	// WritePack writes the pack of runIDs, in this order, proven against
	// the ledger's latest checkpoint; filters says in words how the runs
	// were chosen (the Manifest's Filters). The caller has checked that
	// every run has ended. Until it first writes, an error still reaches
	// the client as a problem (a *reports.BusyError when every export
	// slot is taken).
	WritePack(ctx context.Context, w io.Writer, runIDs []string, filters string) error
}
