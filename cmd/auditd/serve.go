package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"runtime/debug"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fetch"
	"github.com/auditd/auditd/ledger"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/reports"
	"github.com/auditd/auditd/retention"
	"github.com/auditd/auditd/runs"
	"github.com/auditd/auditd/staging"
	"github.com/auditd/auditd/web"
)

// shutdownTimeout bounds the whole graceful shutdown.
const shutdownTimeout = 20 * time.Second

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data", "./data", "data `directory`: the bbolt file, signing key, staged payloads")
	addr := fs.String("addr", api.DefaultAddr, "listen `address` of the REST API and web UI")
	configPath := fs.String("config", "", "YAML `file` of sources to declare at start")
	demo := fs.String("demo", "", "also serve the simulator `scenario` and submit demo runs against it (make run)")
	startLimit := fs.Int("start-limit", registry.DefaultLimit, "requests per --start-window an unknown source starts at")
	startWindow := fs.Duration("start-window", registry.DefaultWindow, "window of --start-limit")
	tokenLimit := fs.Int("token-limit", api.DefaultTokenLimit, "units of work each API token may spend per --token-window")
	tokenWindow := fs.Duration("token-window", api.DefaultTokenWindow, "window of --token-limit")
	tokenBurst := fs.Int("token-burst", api.DefaultTokenBurst, "units of work a token may spend back to back")
	publicLog := fs.Bool("public-log", false, "publish the checkpoint, public key, checkpoint history and consistency proofs, and accept witness cosignatures, without a token")
	var witnesses listFlag
	fs.Var(&witnesses, "witness", "a witness's C2SP cosignature verifier `key` whose cosignatures are kept (repeatable)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *startLimit < 1 || *startWindow <= 0 {
		fmt.Fprintln(stderr, "auditd serve: --start-limit and --start-window must be positive")
		return 2
	}
	budget, err := api.NewKeyedBudget(clock.Real{}, limiter.BudgetConfig{Limit: *tokenLimit, Window: *tokenWindow, Burst: *tokenBurst})
	if err != nil {
		fmt.Fprintf(stderr, "auditd serve: token budget: %v\n", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	opts := serveOptions{dataDir: *dataDir, addr: *addr, configPath: *configPath, demo: *demo,
		registry:    registry.Options{DefaultLimit: *startLimit, DefaultWindow: *startWindow},
		tokenBudget: budget, publicLog: *publicLog, witnesses: witnesses}
	if err := serve(ctx, opts, stdout, log); err != nil {
		fmt.Fprintf(stderr, "auditd serve: %v\n", err)
		return 1
	}
	return 0
}

// serveOptions are serve's flags.
type serveOptions struct {
	dataDir, addr, configPath, demo string
	registry                        registry.Options // start limits; the ledger is filled in
	tokenBudget                     api.Budget       // each API token's budget
	publicLog                       bool             // the log's routes for witnesses need no token
	witnesses                       []string         // witness keys whose cosignatures are kept
}

// serve wires the service together, serves until ctx ends, and shuts it
// down in the reverse order of its start, on every path: the API, the
// fetch loop (draining what is in flight), the demo upstreams, the ledger
// (committing what is queued), and the bbolt file last.
func serve(ctx context.Context, o serveOptions, stdout io.Writer, log *slog.Logger) error {
	db, err := openDB(o.dataDir, false)
	if err != nil {
		return err
	}
	defer db.Close()
	stop := &stopper{log: log}
	defer stop.run()

	led, err := ledger.Open(db, ledger.Options{KeyDir: o.dataDir})
	if err != nil {
		return fmt.Errorf("open ledger: %w", err)
	}
	stop.push("close ledger", led.Close)
	o.registry.Ledger = led
	reg, err := registry.Open(db, o.registry)
	if err != nil {
		return fmt.Errorf("open registry: %w", err)
	}
	stage, err := staging.Open(db, filepath.Join(o.dataDir, payloadsDir))
	if err != nil {
		return err
	}
	store, err := runs.Open(db, runs.Options{Ledger: led, Payloads: stage, Pace: fetch.Pace(reg)})
	if err != nil {
		return err
	}
	lim := limiter.New(clock.Real{})
	loop, err := fetch.New(fetch.Config{
		Ledger: led, Runs: store, Registry: reg, Limiter: lim, Staging: stage,
		Logger: log, CodeVersion: codeVersion(),
	})
	if err != nil {
		return err
	}

	if o.configPath != "" {
		cfg, err := loadConfig(o.configPath, func(src *auditd.Source) (string, string) { return validateSource(reg, src) })
		if err != nil {
			return err
		}
		if err := applySources(ctx, loop, reg, cfg.Sources, "config:"+filepath.Base(o.configPath)); err != nil {
			return err
		}
	}
	var demo *demoUpstreams
	if o.demo != "" {
		if demo, err = startDemo(ctx, o.demo, loop, reg); err != nil {
			return fmt.Errorf("demo: %w", err)
		}
		stop.push("stop demo upstreams", demo.close)
	}
	stop.push("drain fetch loop", loop.Close)
	if err := loop.Start(ctx); err != nil {
		return fmt.Errorf("start fetch loop: %w", err)
	}

	tokens, err := auth.NewStore(db, led)
	if err != nil {
		return err
	}
	secret, err := auth.Bootstrap(ctx, tokens, o.dataDir, os.Getenv)
	if err != nil {
		return err
	}
	reps := reports.NewService(led, store)
	reps.Payloads, reps.NewHash = stage, newLedgerHash

	srv := api.NewServer()
	srv.Tokens, srv.Ledger = tokens, led
	if o.tokenBudget != nil {
		srv.TokenBudget = o.tokenBudget
	}
	srv.Sources = sourcesAPI{loop: loop, reg: reg, lim: lim}
	srv.Runs = runsAPI{Store: store, loop: loop}
	srv.Proxy = loop
	srv.Integrity = integrityAPI{db: db, led: led}
	srv.Reports = reps
	srv.Timelines = reports.NewTimelines(led)
	if srv.Log, err = newLogAPI(db, led, o.witnesses); err != nil {
		return err
	}
	srv.PublicLog = o.publicLog
	srv.Retention = retention.New(led, stage)
	srv.UI = web.Handler()
	srv.Logger = log
	srv.Addr = o.addr
	if err := srv.Open(); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	stop.push("shut down API", srv.Shutdown)
	greet(stdout, srv.URL(), o.dataDir, secret)
	if demo != nil {
		go demo.submitRuns(ctx, loop, log)
	}

	<-ctx.Done()
	log.Info("shutting down")
	return nil
}

// stopper stops what serve started, the last started first, under one
// deadline (shutdownTimeout) that starts when it does.
type stopper struct {
	log   *slog.Logger
	steps []stopStep
}

type stopStep struct {
	what string
	stop func(context.Context) error
}

func (s *stopper) push(what string, stop func(context.Context) error) {
	s.steps = append(s.steps, stopStep{what, stop})
}

func (s *stopper) run() {
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	for i := len(s.steps) - 1; i >= 0; i-- {
		if err := s.steps[i].stop(ctx); err != nil {
			s.log.Error(s.steps[i].what, "err", err)
		}
	}
}

func greet(w io.Writer, url, dataDir, secret string) {
	fmt.Fprintf(w, "auditd is serving on %s (web UI and REST API)\n", url)
	switch {
	case secret != "":
		fmt.Fprintf(w, "admin token (shown once; also in %s, mode 0600):\n  %s\n", filepath.Join(dataDir, auth.BootstrapFile), secret)
	default:
		if _, err := os.Stat(filepath.Join(dataDir, auth.BootstrapFile)); err == nil {
			fmt.Fprintf(w, "admin token: in %s\n", filepath.Join(dataDir, auth.BootstrapFile))
		}
	}
	fmt.Fprintln(w, "Ctrl-C stops it gracefully; runs in progress resume at the next start.")
}

// applySources declares sources from a configuration file. A source whose
// stored configuration already equals the file's is left alone, so restarts
// do not fill the ledger with source.changed events.
func applySources(ctx context.Context, loop *fetch.Loop, reg *registry.Registry, srcs []auditd.Source, principal string) error {
	for _, src := range srcs {
		if old, err := reg.GetSource(src.ID); err == nil {
			headers, _ := reg.RequestHeaders(src.ID)
			query, _ := reg.RequestQuery(src.ID)
			want := src
			want.Headers, want.Query = nil, nil
			if reflect.DeepEqual(old, want) && reflect.DeepEqual(headers, nonNil(src.Headers)) && reflect.DeepEqual(nonNil(query), nonNil(src.Query)) {
				continue
			}
		}
		if _, err := loop.PutSource(ctx, principal, src); err != nil {
			return fmt.Errorf("source %s: %w", src.ID, err)
		}
	}
	return nil
}

func nonNil(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// validateSource is the check a configuration file's sources get: the
// registry's own validation, reported as field and message.
func validateSource(reg *registry.Registry, src *auditd.Source) (field, msg string) {
	err := reg.ValidateSource(*src)
	if err == nil {
		return "", ""
	}
	var e *auditd.Error
	if errors.As(err, &e) {
		return e.Field, e.Message
	}
	return "", err.Error()
}

// codeVersion names the build: the module version or VCS revision.
func codeVersion() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return bi.Main.Version
}
