package fetch

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/staging"
	"github.com/oklog/ulid/v2"
	bolt "go.etcd.io/bbolt"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxAttempts   = 5                // dispatches (and breaker deferrals) per request
	DefaultConcurrency   = 2                // workers per source and run
	DefaultMaxBodyBytes  = 32 << 20         // a response body past this is a failure, not a payload
	DefaultDrainTimeout  = 10 * time.Second // graceful shutdown waits this long for in-flight requests
	DefaultMaxItemsInRun = 100_000
)

// Ledger is what the loop needs of the ledger.
type Ledger interface {
	auditd.Appender
	auditd.EventReader
	// AppendWith appends events in order, all durable together or none,
	// with puts in the same transaction (a payload lands with its
	// payload.staged). It takes events over.
	AppendWith(ctx context.Context, events []auditd.Event, puts []ledger.Put) ([]auditd.Event, error)
	// AppendTo is Append in place: e becomes the event as stored.
	AppendTo(ctx context.Context, e *auditd.Event) error
	// SeqAt returns the first event recorded at or after t (seedGates).
	SeqAt(t time.Time) (uint64, error)
	// QueueTo queues e, to be stored before anything queued after it, and
	// returns; the Queued's Wait is AppendTo's wait for it to be durable.
	QueueTo(e *auditd.Event) (ledger.Queued, error)
	// Post is AppendWith without the wait: then learns the outcome.
	Post(events []auditd.Event, puts []ledger.Put, then func([]auditd.Event, error)) error
	Head() (seq uint64, hash [32]byte)
}

// queueBatch is how many item.queued events share one durable commit.
const queueBatch = 1000

// Config wires a Loop. DB, Ledger, Registry, Limiter and Staging are required.
type Config struct {
	DB       *bolt.DB
	Ledger   Ledger
	Registry *registry.Registry // source configuration and learned limits
	Limiter  *limiter.Limiter   // the gates; the loop configures it from the registry
	Staging  *staging.Store
	Client   *http.Client // default NewClient(DefaultClientOptions)
	Clock    clock.Clock  // default clock.Real{}
	Logger   *slog.Logger // default slog.Default()

	MaxAttempts  int           // default DefaultMaxAttempts
	Concurrency  int           // default DefaultConcurrency; a source's own setting wins
	MaxBodyBytes int64         // default DefaultMaxBodyBytes
	DrainTimeout time.Duration // default DefaultDrainTimeout
	CodeVersion  string        // recorded with every run
}

// Loop runs runs. Create with New, then Start; Close drains it.
type Loop struct {
	cfg Config
	log *slog.Logger

	ctx    context.Context // ends when Close starts draining
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu        sync.Mutex
	active    map[string]*activeRun
	sendLocks map[string]*sync.Mutex // per source: orders dispatch and breaker events
	closed    bool

	// runIDs keeps run ids minted in the same millisecond in the order
	// they were minted, so that Runs (newest first, by id) lists them in
	// submission order.
	runIDs *ulid.LockedMonotonicReader
}

// New returns a Loop; it starts nothing.
func New(cfg Config) (*Loop, error) {
	if cfg.DB == nil || cfg.Ledger == nil || cfg.Registry == nil || cfg.Limiter == nil || cfg.Staging == nil {
		return nil, errors.New("fetch: DB, Ledger, Registry, Limiter and Staging are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(DefaultClientOptions())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.MaxAttempts == 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = DefaultConcurrency
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if err := createBuckets(cfg.DB); err != nil {
		return nil, fmt.Errorf("create fetch buckets: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Loop{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, active: map[string]*activeRun{}, sendLocks: map[string]*sync.Mutex{},
		runIDs: &ulid.LockedMonotonicReader{MonotonicReader: ulid.Monotonic(rand.Reader, 0)}}, nil
}

// Start configures the gates of every registered source and resumes every
// run that a crash or restart left unfinished.
func (l *Loop) Start(ctx context.Context) error {
	for _, src := range l.cfg.Registry.ListSources() {
		if err := l.configureGates(src); err != nil {
			return fmt.Errorf("configure gates of %s: %w", src.ID, err)
		}
	}
	var ids []string
	err := l.cfg.DB.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketRuns).ForEach(func(k, v []byte) error {
			var rec runRecord
			if err := json.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("decode run %s: %w", k, err)
			}
			if !rec.Status.Terminal() {
				ids = append(ids, rec.ID)
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	var launches []func()
	for _, id := range ids {
		launch, err := l.resume(ctx, id)
		if err != nil {
			return fmt.Errorf("resume run %s: %w", id, err)
		}
		if launch != nil {
			launches = append(launches, launch)
		}
	}
	if err := l.seedGates(); err != nil {
		return err
	}
	for _, launch := range launches {
		launch()
	}
	return nil
}

// Close stops taking work, lets in-flight requests finish for up to
// DrainTimeout (or until ctx ends), then abandons the rest: unfinished runs
// stay unfinished and resume at the next Start.
func (l *Loop) Close(ctx context.Context) error {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.cancel()
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	t := l.cfg.Clock.NewTimer(l.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-done:
		return nil
	case <-t.C():
		select {
		case <-done: // both were ready; the drain did finish
			return nil
		default:
			return errors.New("fetch: drain timed out with requests in flight")
		}
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SubmitRequest is a new run.
type SubmitRequest struct {
	Name           string
	Award          auditd.Award
	Items          []auditd.Item
	Deadline       time.Time // zero: none; past it, unfinished items are shed
	Replay         bool      // read staged payloads instead of re-fetching
	IdempotencyKey string    // a second submit with the same key returns the first run
	Principal      string    // who submitted it
}

// Submit validates and stores a run and starts it. Nothing is stored or
// recorded when the request is refused: an unknown source or a duplicate
// item key fails before anything is queued.
func (l *Loop) Submit(ctx context.Context, req SubmitRequest) (RunView, bool, error) {
	if req.IdempotencyKey != "" {
		v, err := l.RunByIdempotencyKey(req)
		if err == nil {
			return v, false, nil
		} else if auditd.ErrorCode(err) != auditd.ENOTFOUND {
			return RunView{}, false, err
		}
	}
	if err := l.validate(req); err != nil {
		return RunView{}, false, err
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return RunView{}, false, auditd.Errorf(auditd.EUNAVAILABLE, "shutting down")
	}

	now := l.cfg.Clock.Now().UTC()
	rec := &runRecord{Run: auditd.Run{
		ID:          ulid.MustNew(ulid.Timestamp(now), l.runIDs).String(),
		Name:        req.Name,
		Award:       req.Award,
		Status:      auditd.RunRunning,
		InitiatedBy: req.Principal,
		ConfigHash:  l.runConfigHash(req.Items),
		CodeVersion: l.cfg.CodeVersion,
		CreatedAt:   now,
		Deadline:    req.Deadline,
		Replay:      req.Replay,
		ItemCount:   len(req.Items),
	}}
	if req.IdempotencyKey != "" {
		rec.RequestHash = requestHash(req)
	}
	for i := range req.Items {
		req.Items[i].Method = itemMethod(req.Items[i].Method)
	}
	err := l.cfg.DB.Update(func(tx *bolt.Tx) error {
		if req.IdempotencyKey != "" && tx.Bucket(bucketIdem).Get([]byte(req.IdempotencyKey)) != nil {
			return errIdemRace
		}
		return putRun(tx, rec, req.Items, req.IdempotencyKey)
	})
	if errors.Is(err, errIdemRace) {
		return l.Submit(ctx, req)
	} else if err != nil {
		return RunView{}, false, fmt.Errorf("store run: %w", err)
	}

	ar := newActiveRun(rec)
	if err := l.begin(ctx, ar, req.Items); err != nil {
		return RunView{}, false, err
	}
	l.launch(ar, req.Items)
	return l.view(ar), true, nil
}

var errIdemRace = errors.New("idempotency key taken concurrently")

// idempotentRun returns the stored record of the run submitted with key,
// nil when none was, in one read.
func (l *Loop) idempotentRun(key string) (*runRecord, error) {
	var rec *runRecord
	err := l.cfg.DB.View(func(tx *bolt.Tx) (err error) {
		if id := tx.Bucket(bucketIdem).Get([]byte(key)); id != nil {
			rec, err = loadRun(tx, string(id))
		}
		return err
	})
	return rec, err
}

// itemMethod is an item's method: GET when it names none.
func itemMethod(m string) string {
	if m == "" {
		return http.MethodGet
	}
	return m
}

func (l *Loop) validate(req SubmitRequest) error {
	if len(req.Items) == 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: "a run needs at least one item"}
	}
	if len(req.Items) > DefaultMaxItemsInRun {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: fmt.Sprintf("a run holds at most %d items", DefaultMaxItemsInRun)}
	}
	seen := make(map[string]bool, len(req.Items))
	checked := map[string]bool{}
	for i, it := range req.Items {
		if it.Key == "" {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".key"), Message: "key is required"}
		}
		if seen[it.Key] {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".key"), Message: fmt.Sprintf("duplicate item key %q", it.Key)}
		}
		seen[it.Key] = true
		if !checked[it.SourceID] {
			if _, err := l.cfg.Registry.GetSource(it.SourceID); err != nil {
				return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".source"), Message: fmt.Sprintf("unknown source %q", it.SourceID)}
			}
			checked[it.SourceID] = true
		}
		if _, err := pageRequest(&req.Items[i], 0); err != nil {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ""), Message: auditd.ErrorMessage(err)}
		}
	}
	return nil
}

// itemField names a field of the i-th item in a validation error, such as
// "items[3].key". It is built only for an error: a run can hold 100,000
// items.
func itemField(i int, field string) string {
	return fmt.Sprintf("items[%d]%s", i, field)
}

// begin records the start of a new run: run.started, a registry snapshot of
// every source it uses, and item.queued for each item.
func (l *Loop) begin(ctx context.Context, ar *activeRun, items []auditd.Item) error {
	detail, _ := json.Marshal(map[string]any{
		"name": ar.rec.Name, "award": ar.rec.Award, "config_hash": ar.rec.ConfigHash,
		"code_version": ar.rec.CodeVersion, "initiated_by": ar.rec.InitiatedBy, "items": len(items),
	})
	first, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunStarted, Detail: string(detail), Principal: ar.rec.InitiatedBy})
	if err != nil {
		return err
	}
	ar.mu.Lock()
	ar.rec.FirstSeq = first.Seq
	ar.rec.HeadAtStart = hex.EncodeToString(first.PrevHash[:])
	ar.mu.Unlock()
	if err := l.cfg.Registry.StartRun(ctx, ar.rec.ID, sourcesOf(items)); err != nil {
		return fmt.Errorf("snapshot registry: %w", err)
	}
	if err := l.queueItems(ctx, ar, items); err != nil {
		return err
	}
	return l.saveRun(ar)
}

// recordBatch appends events for run ar as one commit group and counts
// them. It returns once all are durable, and takes events over (as
// ledger.AppendWith does): the caller may reuse the slice only after a nil
// error.
func (l *Loop) recordBatch(ctx context.Context, ar *activeRun, events []auditd.Event) error {
	for i := range events {
		events[i].RunID = ar.rec.ID
	}
	got, err := l.cfg.Ledger.AppendWith(ctx, events, nil)
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(events), err)
	}
	ar.count(got)
	return nil
}

// post records events for run ar, with puts in the same transaction,
// without waiting for them to be durable: for what has already happened
// when nothing the caller does next depends on the record (a response, an
// item's end). Whatever the run records after post returns is stored after
// them; a run's run.finished therefore waits for all of them. Once they are
// durable they are counted, on the ledger's commit goroutine. When they end
// an item (res is not nil, and the last event is its item.finished), the
// run then keeps res as the item's result, and its payload as request
// lastGood's newest good copy (activeRun.finished). A failure is logged,
// as mustRecord logs it: the record describes something that happened, and
// the reconciliation will show the gap.
func (l *Loop) post(ar *activeRun, events []auditd.Event, puts []ledger.Put, res *ItemResult, lastGood string) {
	// Post copies the events, but they would escape to the heap through
	// the interface call all the same (an event is some 500 bytes, and a
	// request posts two or three): they go through a pooled buffer instead.
	buf := eventBuffers.Get().(*[2]auditd.Event)
	defer putEventBuffer(buf)
	evs := append(buf[:0], events...)
	for i := range evs {
		evs[i].RunID = ar.rec.ID
	}
	typ, item := evs[0].Type, evs[0].ItemKey
	ar.posts.Add(1)
	// An item's end comes as res and lastGood, not as a function to call
	// back: each function value made here is an allocation.
	err := l.cfg.Ledger.Post(evs, puts, func(got []auditd.Event, err error) {
		defer ar.posts.Done()
		if err != nil {
			l.log.Error("ledger append failed", "run", ar.rec.ID, "type", typ, "item", item, "err", err)
			l.unspool(puts)
			return
		}
		ar.count(got)
		if res != nil {
			ar.finished(res, lastGood, got[len(got)-1].Time)
		}
	})
	if err != nil {
		ar.posts.Done()
		l.log.Error("ledger append failed", "run", ar.rec.ID, "type", typ, "item", item, "err", err)
		l.unspool(puts)
	}
}

// unspool tells staging that puts, the records of a post that failed, were
// never stored: a payload's spool entry among them is not to be looked for.
func (l *Loop) unspool(puts []ledger.Put) {
	for _, p := range puts {
		l.cfg.Staging.Unspool(staging.Record(p))
	}
}

// eventBuffers hold the events of one post or record while the ledger
// copies them.
var eventBuffers = sync.Pool{New: func() any { return new([2]auditd.Event) }}

func putEventBuffer(buf *[2]auditd.Event) {
	clear(buf[:])
	eventBuffers.Put(buf)
}

// queueItems records item.queued for items, a commit group at a time.
func (l *Loop) queueItems(ctx context.Context, ar *activeRun, items []auditd.Item) error {
	batch := make([]auditd.Event, 0, min(len(items), queueBatch))
	flush := func() error {
		if err := l.recordBatch(ctx, ar, batch); err != nil {
			return err
		}
		batch = batch[:0]
		return nil
	}
	secret := map[string][]string{}
	for i := range items {
		it := &items[i]
		q, ok := secret[it.SourceID]
		if !ok {
			src, _ := l.cfg.Registry.GetSource(it.SourceID)
			q = src.SecretQuery
			secret[it.SourceID] = q
		}
		batch = append(batch, auditd.Event{
			Type: auditd.EventItemQueued, RunID: ar.rec.ID, SourceID: it.SourceID, ItemKey: it.Key,
			Method: it.Method, Path: redactPath(it.Path, q),
		})
		if len(batch) == queueBatch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if len(batch) > 0 {
		return flush()
	}
	return nil
}

func sourcesOf(items []auditd.Item) []string {
	var ids []string
	seen := map[string]bool{}
	for _, it := range items {
		if !seen[it.SourceID] {
			seen[it.SourceID] = true
			ids = append(ids, it.SourceID)
		}
	}
	return ids
}

// record appends e for run ar and counts it. It returns once e is durable.
func (l *Loop) record(ctx context.Context, ar *activeRun, e auditd.Event) (auditd.Event, error) {
	buf := eventBuffers.Get().(*[2]auditd.Event)
	defer putEventBuffer(buf)
	buf[0] = e
	err := l.recordTo(ctx, ar, &buf[0])
	return buf[0], err
}

// recordTo is record in place: e, which must not be on the caller's stack
// (it would escape to the heap; take it from eventBuffers), becomes the
// event as stored, so that while the caller waits for the commit its stack
// holds no copy of the event. (A worker's dispatch is recorded the same
// way, in two halves: see queueDispatch. With copies, its wait took over
// 9 KB of stack, which a worker then grew to 16 KB after every GC had
// shrunk it.)
func (l *Loop) recordTo(ctx context.Context, ar *activeRun, e *auditd.Event) error {
	e.RunID = ar.rec.ID
	if err := l.cfg.Ledger.AppendTo(ctx, e); err != nil {
		return fmt.Errorf("append %s: %w", e.Type, err)
	}
	ar.countOne(e)
	return nil
}

func (l *Loop) saveRun(ar *activeRun) error {
	ar.mu.Lock()
	rec := ar.rec
	rec.Counts = ar.rec.Counts.clone()
	ar.mu.Unlock()
	return l.cfg.DB.Update(func(tx *bolt.Tx) error { return saveRun(tx, &rec) })
}

// runConfigHash is the hash recorded with a run of the configuration it
// runs under: the sources it uses as the registry holds them (secret
// headers are never part of it) and the loop's own limits. Two runs with
// the same hash were paced under the same terms.
func (l *Loop) runConfigHash(items []auditd.Item) string {
	ids := sortedStrings(sourcesOf(items))
	srcs := make([]auditd.Source, 0, len(ids))
	for _, id := range ids {
		src, _ := l.cfg.Registry.GetSource(id)
		srcs = append(srcs, src)
	}
	b, _ := json.Marshal(struct {
		Sources      []auditd.Source `json:"sources"`
		MaxAttempts  int             `json:"max_attempts"`
		Concurrency  int             `json:"concurrency"`
		MaxBodyBytes int64           `json:"max_body_bytes"`
	}{srcs, l.cfg.MaxAttempts, l.cfg.Concurrency, l.cfg.MaxBodyBytes})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// OutageBound is how long, once the breaker has opened, the items of a run
// can take to end against a source that answers nothing but failures: each
// failed half-open probe an item waits through costs it an attempt, once
// maxAttempts probes in a row have failed every item finding the breaker
// open ends at once (failed, or from its last good copy), and the cooldown
// doubles from cooldown up to backoff times it. For the defaults (5
// attempts, 30s, 4) it is 7m30s.
func OutageBound(maxAttempts int, cooldown time.Duration, backoff int) time.Duration {
	var total time.Duration
	for i, c := 0, cooldown; i < maxAttempts; i++ {
		total += c
		c = min(2*c, time.Duration(backoff)*cooldown)
	}
	return total
}
