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
	"slices"
	"strings"
	"sync/atomic"
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
	"github.com/auditd/auditd/seal"
	"github.com/auditd/auditd/staging"
	"github.com/auditd/auditd/telemetry"
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
	logFormat := fs.String("log-format", "text", "lifecycle log `format` on stderr: text or json")
	logLevel := fs.String("log-level", "info", "least `level` logged: debug, info, warn or error")
	var allowUpstream, denyUpstream listFlag
	fs.Var(&allowUpstream, "allow-upstream", "CIDR `prefix` or address upstream connections may reach even inside a denied range (repeatable; the most specific rule wins)")
	fs.Var(&denyUpstream, "deny-upstream", "CIDR `prefix` or address upstream connections must not reach, beyond link-local, metadata and unspecified (repeatable; 127.0.0.0/8 and ::1/128 deny loopback)")
	var witnesses listFlag
	fleetEtcd := fs.String("fleet-etcd", "", "comma-separated etcd client `URLs`: share each source's budget and pauses with the other nodes of the fleet (docs/FLEET.md)")
	node := fs.String("node", "", "this node's `name` in a fleet (with --fleet-etcd)")
	fleetAdvertise := fs.String("fleet-advertise", "", "the `URL` the other nodes of the fleet reach this node's API at (default: the listen address, which must be one they can reach)")
	fleetLag := fs.Duration("fleet-lag", 0, "the most a request on the wire may trail its fleet slot; slots are spaced to absorb it, and a request whose dispatch record commits later is not sent (default 40ms)")
	fs.Var(&witnesses, "witness", "a witness's C2SP cosignature verifier `key` whose cosignatures are kept (repeatable)")
	if err := fs.Parse(args); err != nil {
		return parseStatus(err)
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
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "auditd serve: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	var handler slog.Handler
	switch *logFormat {
	case "text":
		handler = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})
	case "json":
		handler = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level})
	default:
		fmt.Fprintf(stderr, "auditd serve: --log-format %q: want text or json\n", *logFormat)
		return 2
	}
	log := slog.New(handler)
	o := serveOptions{dataDir: *dataDir, addr: *addr, configPath: *configPath, demo: *demo,
		registry:    registry.Options{DefaultLimit: *startLimit, DefaultWindow: *startWindow},
		tokenBudget: budget, publicLog: *publicLog, witnesses: witnesses,
		allowUpstream: allowUpstream, denyUpstream: denyUpstream,
		fleet: fleetOptions{Node: *node, Lag: *fleetLag, Advertise: *fleetAdvertise}}
	if *fleetEtcd != "" {
		o.fleet.Etcd = strings.Split(*fleetEtcd, ",")
	}
	if _, err := fetch.NewPolicy(allowUpstream, denyUpstream); err != nil {
		fmt.Fprintf(stderr, "auditd serve: upstream policy: %v\n", err)
		return 2
	}
	if err := serve(ctx, o, stdout, log); err != nil {
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
	allowUpstream, denyUpstream     []string         // the upstream address policy's flags (the config file adds its own)
	fleet                           fleetOptions     // etcd and node name; none: the node runs alone
	bootstrap                       string           // the first admin token's secret, as AUDITD_BOOTSTRAP_TOKEN (fleet-demo's, one for every node)
}

// serve wires the service together, serves until ctx ends, and shuts it
// down in the reverse order of its start, on every path: the API, the
// fetch loop (draining what is in flight), the demo upstreams, the ledger
// (committing what is queued), and the bbolt file last.
//
// It is over a hundred lines on purpose: each part is built in the order
// the next depends on it, and its stop is pushed as it is built, so the
// start order and the reverse shutdown order read in one place, top to
// bottom. A part with logic of its own has a function (startFleet,
// startDemo, applySources, newLogAPI).
func serve(ctx context.Context, o serveOptions, stdout io.Writer, log *slog.Logger) error {
	// Nothing is created before the configuration is found good, and a
	// damaged file is refused before bbolt maps it.
	var cfg *fileConfig
	if o.configPath != "" {
		var err error
		if cfg, err = loadConfig(o.configPath, validateSource); err != nil {
			return err
		}
		// The flags win over the file.
		if len(o.fleet.Etcd) == 0 {
			o.fleet.Etcd = cfg.Fleet.Etcd
		}
		if o.fleet.Node == "" {
			o.fleet.Node = cfg.Fleet.Node
		}
		if o.fleet.Lag == 0 {
			o.fleet.Lag = cfg.Fleet.Lag
		}
		if o.fleet.Advertise == "" {
			o.fleet.Advertise = cfg.Fleet.Advertise
		}
	}
	if err := o.fleet.check(); err != nil {
		return err
	}
	if len(o.fleet.Etcd) > 0 {
		log = log.With("node", o.fleet.Node) // a fleet's logs are read together
	}
	// The address is bound before anything in the data directory is
	// created or changed: a taken port leaves no directory, token or
	// ledger event behind. It serves once the rest is ready (Open).
	srv := api.NewServer()
	srv.Addr = o.addr
	if err := srv.Listen(); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	serving := false
	defer func() {
		if !serving {
			srv.Shutdown(context.Background()) // closes the listener alone
		}
	}()
	var advertise string // the API's URL the fleet's other nodes call
	if len(o.fleet.Etcd) > 0 {
		var err error
		if advertise, err = advertiseURL(o.fleet.Advertise, srv.URL(), o.fleet.Etcd); err != nil {
			return err
		}
		srv.Node = o.fleet.Node
	}
	path := filepath.Join(o.dataDir, dbFile)
	if err := checkFile(path); errors.Is(err, ledger.ErrDamaged) {
		return fmt.Errorf("refusing to serve %s: %v; run auditd verify --data %s for the full report, and restore the data directory from a backup", path, err, o.dataDir)
	} else if err != nil {
		return err
	}
	db, err := openDB(o.dataDir, false)
	if err != nil {
		return err
	}
	defer db.Close()
	stop := &stopper{log: log}
	defer stop.run()

	// The service's metrics and lifecycle logs are read off the ledger's
	// commits.
	tel := telemetry.New()
	tel.Log = log
	// The loop logs which runs a stalled ledger pauses; it starts after
	// the ledger, which may stall before it does.
	var stalls atomic.Pointer[fetch.Loop]
	onStall := func(err error) {
		tel.Stalled(err)
		if loop := stalls.Load(); loop != nil {
			loop.Stalled(err)
		} else if err != nil {
			log.Error("ledger writes failing: waiting until they succeed", "err", err)
		}
	}
	led, err := ledger.Open(db, ledger.Options{KeyDir: o.dataDir, Observer: tel, OnStall: onStall})
	if err != nil {
		return fmt.Errorf("open ledger: %w", err)
	}
	stop.push("close ledger", led.Close)
	// Request headers and the paths as sent of items with credentials
	// are sealed at rest under a key of the data directory.
	box, err := seal.Open(o.dataDir)
	if err != nil {
		return err
	}
	o.registry.Ledger, o.registry.Seal = led, box
	reg, err := registry.Open(db, o.registry)
	if err != nil {
		return fmt.Errorf("open registry: %w", err)
	}
	stage, err := staging.Open(db, filepath.Join(o.dataDir, payloadsDir))
	if err != nil {
		return err
	}
	store, err := runs.Open(db, runs.Options{Ledger: led, Payloads: stage, Pace: fetch.Pace(reg), Stalled: led.Stalled, Seal: box})
	if err != nil {
		return err
	}
	lim := limiter.New(clock.Real{})
	reps := reports.NewService(led, store)
	reps.Payloads, reps.NewHash = stage, newLedgerHash
	reps.SecretQuery = func(id string) []string {
		src, _ := reg.GetSource(id)
		return src.SecretQuery
	}
	// Wired before the loop starts: a resumed run that ends at once is
	// logged with its checks like any other.
	tel.Wire(reg, lim, runReports{store: store, reps: reps})
	allow, deny := o.allowUpstream, o.denyUpstream
	if cfg != nil {
		allow = append(slices.Clone(allow), cfg.Upstream.Allow...)
		deny = append(slices.Clone(deny), cfg.Upstream.Deny...)
	}
	policy, err := fetch.NewPolicy(allow, deny)
	if err != nil {
		return fmt.Errorf("upstream policy: %w", err)
	}
	clientOpts := fetch.DefaultClientOptions()
	clientOpts.Policy = policy
	var openIdle time.Duration
	if cfg != nil {
		openIdle = cfg.Runs.OpenIdleTimeout.D()
	}
	loop, err := fetch.New(fetch.Config{
		Ledger: led, Runs: store, Registry: reg, Limiter: lim, Staging: stage,
		Client: fetch.NewClient(clientOpts), Logger: log, CodeVersion: codeVersion(),
		OpenIdleTimeout: openIdle,
	})
	if err != nil {
		return err
	}
	stalls.Store(loop)

	if cfg != nil {
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
	packs := livePacks{db: db, led: led, payloads: stage, secretQuery: reps.SecretQuery, admission: reps.Admission}
	var fruns *fleetRuns // fleet runs and the fleet log of logs (fleetrun.go)
	var fview *fleetView // the fleet's view of its budgets (fleet_view.go)
	if len(o.fleet.Etcd) > 0 {
		// Joined before the loop starts: no request leaves before the
		// budgets are shared.
		fl, err := startFleet(ctx, o.fleet, led.PublicKey(), lim, reg, led, log)
		if err != nil {
			return err
		}
		srv.Registry.MustRegister(fl) // the auditd_fleet_* metrics
		stop.push("leave fleet", fl.close)
		fview = startFleetView(fl)
		stop.push("leave the fleet view", fview.close)
		if fruns, err = newFleetRuns(o.fleet, fl.client, o.dataDir, led, db, loop, store, reps, packs, reg, log); err != nil {
			return err
		}
		stop.push("post to the fleet log", fruns.close)
	}
	stop.push("drain fetch loop", loop.Close)
	if err := loop.Start(ctx); err != nil {
		return fmt.Errorf("start fetch loop: %w", err)
	}

	tokens, err := auth.NewStore(db, led)
	if err != nil {
		return err
	}
	getenv := os.Getenv
	if o.bootstrap != "" {
		getenv = func(k string) string {
			if k == auth.BootstrapEnv {
				return o.bootstrap
			}
			return os.Getenv(k)
		}
	}
	secret, err := auth.Bootstrap(ctx, tokens, o.dataDir, getenv)
	if err != nil {
		return err
	}

	srv.Registry.MustRegister(tel.Collectors()...) // GET /metrics serves the API's and these
	srv.Tokens, srv.Ledger = tokens, led
	if o.tokenBudget != nil {
		srv.TokenBudget = o.tokenBudget
	}
	srv.Sources = sourcesAPI{loop: loop, reg: reg, lim: lim}
	srv.Runs = runsAPI{Store: store, loop: loop}
	srv.Proxy = loop
	srv.Integrity = integrityAPI{db: db, led: led}
	srv.Reports = reps
	srv.Packs = packs
	if fruns != nil {
		srv.Fleet, srv.Proxy = fruns, fruns
	}
	if fview != nil {
		srv.FleetView = fview
	}
	srv.Timelines = reports.NewTimelines(led)
	if srv.Log, err = newLogAPI(db, led, o.witnesses); err != nil {
		return err
	}
	srv.PublicLog = o.publicLog
	srv.Retention = retention.New(led, stage)
	srv.UI = web.Handler()
	srv.Logger = log
	if err := srv.Open(); err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	serving = true
	stop.push("shut down API", srv.Shutdown)
	if fruns != nil {
		if err := fruns.start(ctx, advertise); err != nil {
			return err
		}
	}
	log.Info("serving", "url", srv.URL(), "data", o.dataDir, "sources", len(reg.ListSources()))
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
	if len(s.steps) > 0 {
		s.log.Info("stopped")
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

// validateSource is the check a configuration file's sources get, the
// registry's (the same as a source put over the API), reported as field
// and message.
func validateSource(src *auditd.Source) (field, msg string) {
	err := registry.CheckSource(*src)
	if err == nil {
		return "", ""
	}
	var e *auditd.Error
	if errors.As(err, &e) {
		return e.Field, e.Message
	}
	return "", err.Error()
}

// runReports is what a finished run's log line reads: its counts from the
// store, its verdict from the reports service (which keeps it for the API).
type runReports struct {
	store *runs.Store
	reps  *reports.Service
}

func (r runReports) Run(ctx context.Context, id string) (auditd.RunView, error) {
	return r.store.Run(ctx, id)
}

func (r runReports) Reconciled(ctx context.Context, id string) (bool, []string, error) {
	rep, err := r.reps.Reconciliation(ctx, id)
	if err != nil {
		return false, nil, err
	}
	return rep.Balanced, rep.Failed(), nil
}
