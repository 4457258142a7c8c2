package fetch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxAttempts  = 5                // dispatches (and breaker deferrals) per request
	DefaultConcurrency  = 2                // workers per source and run
	DefaultMaxBodyBytes = 32 << 20         // a response body past this is a failure, not a payload
	DefaultDrainTimeout = 10 * time.Second // graceful shutdown waits this long for in-flight requests
	// MaxItemsPerSubmit bounds one submit's items (a page of an open run,
	// or a whole run submitted at once); a run holds up to
	// runs.MaxItemsInRun, in pages.
	MaxItemsPerSubmit = 100_000
	// DefaultCompactEvery is how many items end between two compactions
	// of staging during runs (compactStaging).
	DefaultCompactEvery = 10_000
)

// Ledger is what the loop needs of the ledger (*ledger.Ledger).
type Ledger interface {
	// Add queues events to be stored, in order and in one commit group,
	// with puts in the same transaction (a payload lands with its
	// payload.staged), before anything added after it; the Future tells
	// when they are durable. It takes events over.
	Add(events []auditd.Event, puts ...auditd.Put) (auditd.Future, error)
	auditd.EventReader
	// SeqAt returns the first event recorded at or after t (seedGates).
	SeqAt(t time.Time) (uint64, error)
	// Stalled returns why commits fail, while they do, and since when the
	// last time they did: meanwhile appends wait for the disk.
	Stalled() (since time.Time, err error)
}

// Runs is what the loop needs of the store of runs (*runs.Store): it
// stores the runs the loop is given, keeps their live state while the loop
// works on them, and stores how they end.
type Runs interface {
	// Create stores a new run and its items, or returns runs.ErrKeyTaken.
	Create(run auditd.Run, nr auditd.NewRun) (*runs.Live, error)
	// RunByIdempotencyKey answers a repeated submit.
	RunByIdempotencyKey(ctx context.Context, nr auditd.NewRun) (auditd.RunView, error)
	// Run returns one run.
	Run(ctx context.Context, id string) (auditd.RunView, error)
	// AddItems stores a page of an open batch run's items; Close closes
	// it: it takes no more.
	AddItems(r *runs.Live, items []auditd.Item) error
	Close(r *runs.Live) error
	// Todo returns a chunk of a run's items not yet ended (the workers'
	// feed), and the index after the last it looked at.
	Todo(id, source string, from, upTo uint32, max int) ([]auditd.Item, uint32, error)
	// Unfinished lists the runs to resume, and Resume loads one.
	Unfinished() ([]string, error)
	Resume(id string) (*runs.Live, []auditd.Item, error)
	// Start stores a run's record as it starts and makes it live; End
	// stores its end, which run.finished completes.
	Start(r *runs.Live) error
	End(r *runs.Live, fin *auditd.Event) error
}

// queueBatch is how many item.queued events share one durable commit.
const queueBatch = 1000

// Config wires a Loop. Ledger, Runs, Registry, Limiter and Staging are
// required.
type Config struct {
	Ledger   Ledger
	Runs     Runs
	Registry *registry.Registry // source configuration and learned limits
	Limiter  *limiter.Limiter   // the gates; the loop configures it from the registry
	Staging  *staging.Store
	Client   *http.Client // default NewClient(DefaultClientOptions); never follows a redirect
	Clock    clock.Clock  // default clock.Real{}
	Logger   *slog.Logger // default slog.Default()

	MaxAttempts  int           // default DefaultMaxAttempts
	Concurrency  int           // default DefaultConcurrency; a source's own setting wins
	MaxBodyBytes int64         // default DefaultMaxBodyBytes
	DrainTimeout time.Duration // default DefaultDrainTimeout
	CodeVersion  string        // recorded with every run
	CompactEvery int           // default DefaultCompactEvery
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

	// ended counts the items ended, for CompactEvery; compacting is true
	// while a compaction of staging runs, and compactions waits for it.
	ended       atomic.Int64
	compacting  atomic.Bool
	compactions sync.WaitGroup

	// eventBufs hold a request's records (*[2]auditd.Event) until the
	// ledger has told their outcome: a dispatch, a response and an item's
	// end are allocations of nearly 600 bytes each otherwise
	// (BenchmarkLoopInMemory: 2.4 allocs/req and 2 GC cycles a run fewer).
	eventBufs sync.Pool
}

// eventBuf returns a buffer for up to two events.
func (l *Loop) eventBuf() *[2]auditd.Event {
	if b, ok := l.eventBufs.Get().(*[2]auditd.Event); ok {
		return b
	}
	return new([2]auditd.Event)
}

// freeEventBuf returns b, whose events the ledger is done with, to the
// pool. Whoever takes it next sets each event it uses whole.
func (l *Loop) freeEventBuf(b *[2]auditd.Event) {
	l.eventBufs.Put(b)
}

// New returns a Loop; it starts nothing.
func New(cfg Config) (*Loop, error) {
	if cfg.Ledger == nil || cfg.Runs == nil || cfg.Registry == nil || cfg.Limiter == nil || cfg.Staging == nil {
		return nil, errors.New("fetch: Ledger, Runs, Registry, Limiter and Staging are required")
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(DefaultClientOptions())
	} else {
		// A redirect is never followed, whatever client is given: a 3xx
		// is its dispatch's outcome (doc.go), and a hop would be a request
		// with no dispatch of its own.
		c := *cfg.Client
		c.CheckRedirect = noRedirects
		cfg.Client = &c
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
	if cfg.CompactEvery == 0 {
		cfg.CompactEvery = DefaultCompactEvery
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Loop{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, active: map[string]*activeRun{}, sendLocks: map[string]*sync.Mutex{}}, nil
}

// Start configures the gates of every registered source and resumes every
// run that a crash or restart left unfinished.
func (l *Loop) Start(ctx context.Context) error {
	for _, src := range l.cfg.Registry.ListSources() {
		if err := l.configureGates(src); err != nil {
			return fmt.Errorf("configure gates of %s: %w", src.ID, err)
		}
	}
	ids, err := l.cfg.Runs.Unfinished()
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
	go func() { l.wg.Wait(); l.compactions.Wait(); close(done) }()
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

// Submit validates and stores a run and starts it, and reports whether it
// is new: a submit with the idempotency key of an earlier one, and the
// same contents, returns that run. Nothing is stored or recorded when the
// request is refused: an unknown source or a duplicate item key fails
// before anything is queued.
//
// Credentials in item paths are redacted here, before anything else sees
// them (redactItems): the run store, the ledger, the idempotency
// fingerprint and every view hold only the redacted path.
func (l *Loop) Submit(ctx context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	l.redactItems(nr.Items)
	if nr.IdempotencyKey != "" {
		v, err := l.cfg.Runs.RunByIdempotencyKey(ctx, nr)
		if err == nil {
			return v, false, nil
		} else if auditd.ErrorCode(err) != auditd.ENOTFOUND {
			return auditd.RunView{}, false, err
		}
	}
	if nr.Mode == auditd.RunProxy {
		return l.submitProxy(ctx, nr)
	}
	if err := l.validate(nr); err != nil {
		return auditd.RunView{}, false, err
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return auditd.RunView{}, false, auditd.Errorf(auditd.EUNAVAILABLE, "shutting down")
	}

	for i := range nr.Items {
		nr.Items[i].Method = itemMethod(nr.Items[i].Method)
	}
	live, err := l.cfg.Runs.Create(auditd.Run{
		Name:        nr.Name,
		Award:       nr.Award,
		Status:      auditd.RunRunning,
		InitiatedBy: nr.Principal,
		ConfigHash:  l.runConfigHash(nr.Items),
		CodeVersion: l.cfg.CodeVersion,
		CreatedAt:   l.cfg.Clock.Now().UTC(),
		Deadline:    nr.Deadline,
		Replay:      nr.Replay,
		ItemCount:   len(nr.Items),
		Open:        nr.Open,
	}, nr)
	if errors.Is(err, runs.ErrKeyTaken) {
		return l.Submit(ctx, nr)
	} else if err != nil {
		return auditd.RunView{}, false, err
	}

	ar := newActiveRun(live)
	if err := l.begin(ctx, ar, nr.Items); err != nil {
		return auditd.RunView{}, false, err
	}
	l.launch(ar, sourcesOf(nr.Items))
	v, err := l.cfg.Runs.Run(ctx, live.ID())
	return v, true, err
}

// redactItems redacts, under each item's source's rule, the credentials
// in its path: Path becomes the redacted path, and SendPath keeps the path
// as sent, which the run store keeps sealed until the run ends. An item
// whose path holds none is left as it is. A source that is not known has
// the built-in names only (validate refuses the item anyway).
func (l *Loop) redactItems(items []auditd.Item) {
	rules := map[string]redact.Rule{}
	for i := range items {
		it := &items[i]
		rule, ok := rules[it.SourceID]
		if !ok {
			src, _ := l.cfg.Registry.GetSource(it.SourceID)
			rule = redact.New(src.SecretQuery)
			rules[it.SourceID] = rule
		}
		if red := rule.URL(it.Path); red != it.Path {
			it.SendPath, it.Path = it.Path, red
		}
	}
}

// itemMethod is an item's method: GET when it names none.
func itemMethod(m string) string {
	if m == "" {
		return http.MethodGet
	}
	return m
}

func (l *Loop) validate(req auditd.NewRun) error {
	if len(req.Items) == 0 && !req.Open {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: "a run needs at least one item"}
	}
	if len(req.Items) > MaxItemsPerSubmit {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: fmt.Sprintf("a submit holds at most %d items; submit a larger run in pages (open, then POST /v1/runs/{id}/items)", MaxItemsPerSubmit)}
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
		sent := it.Path
		if it.SendPath != "" {
			sent = it.SendPath
		}
		if !auditd.ValidPath(sent) {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".path"), Message: "path must start with / and hold no space, control character or fragment"}
		}
		if _, err := pageRequest(&req.Items[i], 0); err != nil {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ""), Message: auditd.ErrorMessage(err)}
		}
	}
	return nil
}

// itemField names a field of the i-th item in a validation error, such as
// "items[3].key". It is built only for an error: a submit can hold
// 100,000 items.
func itemField(i int, field string) string {
	return fmt.Sprintf("items[%d]%s", i, field)
}

// begin records the start of a new run: run.started, a registry snapshot of
// every source it uses, and item.queued for each item.
func (l *Loop) begin(ctx context.Context, ar *activeRun, items []auditd.Item) error {
	run := ar.live.Run()
	detail, _ := json.Marshal(map[string]any{
		"name": run.Name, "award": run.Award, "config_hash": run.ConfigHash,
		"code_version": run.CodeVersion, "initiated_by": run.InitiatedBy, "items": len(items),
	})
	first, err := l.record(ctx, ar, auditd.Event{Type: auditd.EventRunStarted, Detail: string(detail), Principal: run.InitiatedBy})
	if err != nil {
		return err
	}
	ar.live.Started(&first)
	if err := l.cfg.Registry.StartRun(ctx, ar.id, sourcesOf(items)); err != nil {
		return fmt.Errorf("snapshot registry: %w", err)
	}
	if err := l.queueItems(ctx, ar, items); err != nil {
		return err
	}
	return l.cfg.Runs.Start(ar.live)
}

// recordBatch records events for run ar in one commit group and counts
// them. It returns once all are durable, and leaves them as stored.
func (l *Loop) recordBatch(ctx context.Context, ar *activeRun, events []auditd.Event) error {
	for i := range events {
		events[i].RunID = ar.id
	}
	f, err := l.cfg.Ledger.Add(events)
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return fmt.Errorf("append %d events: %w", len(events), err)
	}
	ar.live.Count(events...)
	return nil
}

// post records the first n events of buf for run ar, with puts in the same
// transaction, without waiting for them to be durable: for what has
// already happened when nothing the caller does next depends on the record
// (a response, an item's end). It takes buf over, and frees it once the
// ledger has told the outcome. Whatever the run records after post
// returns is stored after them; a run's run.finished therefore waits for
// all of them. When they end an item (res is not nil, and the last event
// is its item.finished), res is stored as the item's result in the same
// commit (runs.ResultPut); a proxied request's item is stored so with its
// item.queued. Once they are durable they are counted, and staging learns
// that the puts are stored (a last-good record among them makes its copy
// usable by every run). A failure is logged, as mustRecord logs it: the record describes something that happened,
// and the reconciliation will show the gap.
func (l *Loop) post(ar *activeRun, buf *[2]auditd.Event, n int, puts []auditd.Put, res *auditd.ItemResult) {
	events := buf[:n]
	for i := range events {
		events[i].RunID = ar.id
	}
	puts = append(puts, l.queuedPuts(events)...)
	typ, item := events[0].Type, events[0].ItemKey
	if res != nil {
		puts = append(puts, ar.live.ResultPut(item, res)) // stored with its item.finished
	}
	f, err := l.cfg.Ledger.Add(events, puts...)
	if err != nil {
		l.freeEventBuf(buf)
		l.postFailed(ar, typ, item, puts, err)
		return
	}
	ar.posts.Add(1)
	f.Then(func(stored []auditd.Event, err error) {
		defer ar.posts.Done()
		defer l.freeEventBuf(buf)
		if err != nil {
			l.postFailed(ar, typ, item, puts, err)
			return
		}
		ar.live.Count(stored...)
		if len(puts) > 0 {
			l.cfg.Staging.Stored(puts) // a new last good copy is usable from now on
		}
		if res != nil && l.ended.Add(1)%int64(l.cfg.CompactEvery) == 0 {
			l.compactStaging()
		}
	})
}

// compactStaging moves, in the background, the payloads and last good
// copies staging keeps since its last compaction to their indexes
// (staging.Store.Compact), unless a compaction is running. Staging keeps
// them, in its spool and in memory, until then: at every run's end alone
// that would be a share of every item of a long run.
func (l *Loop) compactStaging() {
	if !l.compacting.CompareAndSwap(false, true) {
		return
	}
	l.compactions.Add(1)
	go func() {
		defer l.compactions.Done()
		defer l.compacting.Store(false)
		if _, err := l.cfg.Staging.Compact(); err != nil {
			l.log.Error("compact staged payloads", "err", err)
		}
	}()
}

// queuedPuts are what store the proxied requests' items whose item.queued
// is among events, for the ledger's commit of them (runs.Live.QueuedPuts).
func (l *Loop) queuedPuts(events []auditd.Event) []auditd.Put {
	var puts []auditd.Put
	for i := range events {
		if events[i].Type != auditd.EventItemQueued {
			continue
		}
		if ar := l.activeRun(events[i].RunID); ar != nil && ar.proxy != nil {
			puts = append(puts, ar.live.QueuedPuts(events[i].ItemKey)...)
		}
	}
	return puts
}

// postFailed logs a post that failed, and tells staging that its puts were
// never stored: a payload's spool entry among them is not to be looked for.
func (l *Loop) postFailed(ar *activeRun, typ auditd.EventType, item string, puts []auditd.Put, err error) {
	l.log.Error("ledger append failed", "run", ar.id, "type", typ, "item", item, "err", err)
	for _, p := range puts {
		l.cfg.Staging.Unspool(p)
	}
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
	for i := range items {
		it := &items[i]
		// Path is redacted already (Submit), or was when stored (resume).
		batch = append(batch, auditd.Event{
			Type: auditd.EventItemQueued, RunID: ar.id, SourceID: it.SourceID, ItemKey: it.Key,
			Method: it.Method, Path: it.Path,
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

// record records e for run ar and counts it. It returns once e is durable,
// with e as stored.
func (l *Loop) record(ctx context.Context, ar *activeRun, e auditd.Event) (auditd.Event, error) {
	events := []auditd.Event{e}
	events[0].RunID = ar.id
	f, err := l.cfg.Ledger.Add(events)
	if err == nil {
		err = f.Wait(ctx)
	}
	if err != nil {
		return auditd.Event{}, fmt.Errorf("append %s: %w", e.Type, err)
	}
	ar.live.Count(events...)
	return events[0], nil
}

// runConfigHash is the hash recorded with a run of the configuration it
// runs under: the sources it uses as the registry holds them (secret
// headers are never part of it) and the loop's own limits. Two runs with
// the same hash were paced under the same terms.
func (l *Loop) runConfigHash(items []auditd.Item) string {
	ids := sourcesOf(items)
	sort.Strings(ids)
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
