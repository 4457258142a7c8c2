package fetch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
)

// Defaults for Config fields left zero.
const (
	DefaultMaxAttempts  = 5                // dispatches (and breaker deferrals) per request
	DefaultMaxBodyBytes = 32 << 20         // a response body past this is a failure, not a payload
	DefaultDrainTimeout = 10 * time.Second // graceful shutdown waits this long for in-flight requests
	// MaxItemsPerSubmit bounds one submit's items (a page of an open run,
	// or a whole run submitted at once); a run holds up to
	// runs.MaxItemsInRun, in pages.
	MaxItemsPerSubmit = 100_000
	// DefaultCompactEvery is how many items end between two compactions
	// of staging during runs (compactStaging). A compaction's memory is
	// the index pages it rewrites, about one per item moved once the
	// last-good index outgrows the batch (its keys are hashes): 10,000
	// made a transient of some 60 MB at 1,000,000 items against 30 at
	// 250,000 (docs/bench/fetch.md); 1,000 keeps it a few MB at any size,
	// for about the same pages written per item.
	DefaultCompactEvery = 1_000
	// DefaultOpenIdleTimeout is Config.OpenIdleTimeout's default.
	DefaultOpenIdleTimeout = time.Hour
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
	// BeginItems starts a page stored a chunk at a time and committed
	// whole (AddItemsStream); ItemsAt reads a chunk of a run's items from
	// an index on.
	BeginItems(r *runs.Live) (*runs.PendingPage, error)
	ItemsAt(id string, from uint32, max int) ([]auditd.Item, error)
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
	Concurrency  int           // workers per source and run; default registry.MaxConcurrency; a source's own setting wins
	MaxBodyBytes int64         // default DefaultMaxBodyBytes
	DrainTimeout time.Duration // default DefaultDrainTimeout
	CodeVersion  string        // recorded with every run
	CompactEvery int           // default DefaultCompactEvery
	// OpenIdleTimeout finishes an open batch run that has had no page for
	// this long, unless the run names its own; default DefaultOpenIdleTimeout.
	OpenIdleTimeout time.Duration
}

// Loop runs runs. Create with New, then Start; Close drains it.
type Loop struct {
	cfg Config
	log *slog.Logger
	recorder
	copies
	gates

	ctx    context.Context // ends when Close starts draining
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	active map[string]*activeRun
	closed bool
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
		// Enough workers for any concurrency a source can learn: the
		// limiter's concurrency gate, which starts at its default and
		// moves as the registry learns, holds the rest back.
		cfg.Concurrency = registry.MaxConcurrency
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
	if cfg.OpenIdleTimeout == 0 {
		cfg.OpenIdleTimeout = DefaultOpenIdleTimeout
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &Loop{cfg: cfg, log: cfg.Logger, ctx: ctx, cancel: cancel, active: map[string]*activeRun{}}
	l.recorder = recorder{ledger: cfg.Ledger, staging: cfg.Staging, limiter: cfg.Limiter, registry: cfg.Registry, clock: cfg.Clock, log: cfg.Logger,
		sendLocks: map[string]*sync.Mutex{}, compactEvery: int64(cfg.CompactEvery)}
	l.gates = gates{registry: cfg.Registry, limiter: cfg.Limiter, ledger: cfg.Ledger, clock: cfg.Clock, log: cfg.Logger}
	l.copies = copies{staging: cfg.Staging, ledger: cfg.Ledger, clock: cfg.Clock}
	return l, nil
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

// OutageBound is how long a source's breaker may stay open, from when it
// first opened, before every request finding it open ends at once (failed,
// or from its last good copy) rather than wait for the next probe: a run
// against a source that answers nothing but failures ends about this long
// after the breaker opened. Until then its requests wait, and a source that
// answers again is probed within a cooldown (limiter.DefaultBreakerCooldown
// at first, doubling while probes fail) and resumes. It is the length of
// the outage, not the number of probes that failed, that ends requests, so
// a source configured with a short cooldown is not given up on sooner.
const OutageBound = 7*time.Minute + 30*time.Second

// downReason is why a request ends against a source that stayed down.
func downReason(down *limiter.DownError, now time.Time) string {
	return fmt.Sprintf("source down: the breaker open for %v, %d probes failed", now.Sub(down.Since).Round(time.Second), down.Reopens)
}
