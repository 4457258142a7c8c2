package telemetry

import (
	"context"
	"log/slog"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// Registry is what the metrics read of the sources at a scrape.
type Registry interface {
	ListSources() []auditd.Source
	// PeekState never waits on a change in progress: a scrape must
	// answer while the ledger is stalled.
	PeekState(id string) (registry.State, error)
}

// Limiter is what the metrics read of the gates at a scrape.
type Limiter interface {
	State(id string) (limiter.State, error)
}

// Runs gives the counts and the verdict of a finished run, for its log line.
type Runs interface {
	Run(ctx context.Context, id string) (auditd.RunView, error)
	// Reconciled reports whether the run reconciles, and the ids of the
	// checks that failed.
	Reconciled(ctx context.Context, id string) (bool, []string, error)
}

// Telemetry counts the ledger's commits into Prometheus collectors and logs
// the loop's lifecycle. It implements ledger.Observer. The ledger, and so
// the Observer, comes first: Wire hands it the registry, the limiter and
// the runs once they exist; until then their parts are left out.
type Telemetry struct {
	// Log receives the lifecycle lines. Default: slog.Default(). Set it
	// before the ledger opens.
	Log *slog.Logger
	// Now stamps the end of a commit, for the append latency. Default:
	// time.Now. Set it before the ledger opens.
	Now func() time.Time

	parts atomic.Pointer[parts]
	// stalledSince is when the ledger's commits started to fail (Unix
	// nanoseconds), 0 while they succeed.
	stalledSince atomic.Int64

	stalls prometheus.Counter

	dispatches   *prometheus.CounterVec
	retries      *prometheus.CounterVec
	responses    *prometheus.CounterVec
	throttles    *prometheus.CounterVec
	waits        *prometheus.HistogramVec
	breakers     *prometheus.CounterVec
	changes      *prometheus.CounterVec
	items        *prometheus.CounterVec
	shed         *prometheus.CounterVec
	cached       *prometheus.CounterVec
	runsStarted  prometheus.Counter
	runsFinished *prometheus.CounterVec
	appendDelay  prometheus.Histogram
	groupSize    prometheus.Histogram
	commitTime   prometheus.Histogram
}

// parts are what Wire hands over.
type parts struct {
	reg  Registry
	lim  Limiter
	runs Runs
}

// Wire hands t the registry and limiter the gauges read, and the runs a
// finished run's line is read from. Any may be nil. Safe to call while the
// ledger commits.
func (t *Telemetry) Wire(reg Registry, lim Limiter, runs Runs) {
	t.parts.Store(&parts{reg: reg, lim: lim, runs: runs})
}

func (t *Telemetry) wired() parts {
	if p := t.parts.Load(); p != nil {
		return *p
	}
	return parts{}
}

// New returns a Telemetry; register its Collectors with the service's
// Prometheus registry.
func New() *Telemetry {
	src := []string{"source"}
	t := &Telemetry{
		dispatches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_dispatches_total", Help: "Requests sent upstream, each recorded before it left.",
		}, src),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_retries_total", Help: "Requests sent upstream that were not an item page's first attempt.",
		}, src),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_responses_total", Help: "Outcomes of requests sent upstream, by class: 2xx, 3xx, 4xx, 429, 5xx, transport.",
		}, []string{"source", "class"}),
		throttles: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_throttles_total", Help: "Refusals for rate (429, 503 with Retry-After, a plain 503 taken for one), by status.",
		}, []string{"source", "status"}),
		waits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "auditd_wait_seconds", Help: "Time requests waited at the gates before they were sent, by gate: backoff, breaker, concurrency, pause, rate.",
			Buckets: []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, []string{"source", "gate"}),
		breakers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_breaker_transitions_total", Help: "Circuit breaker transitions, by the state moved to.",
		}, []string{"source", "to"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_learned_limit_changes_total", Help: "Changes of a learned limit (registry.changed), by what taught them.",
		}, []string{"source", "cause"}),
		items: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_items_total", Help: "Items ended, by outcome: succeeded, cached, failed, shed.",
		}, []string{"source", "outcome"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_shed_total", Help: "Requests the gates could not admit before their run's deadline, by gate.",
		}, []string{"source", "gate"}),
		cached: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_cache_served_total", Help: "Items served from their last good copy.",
		}, src),
		stalls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditd_ledger_stalls_total", Help: "Times the ledger's commits started to fail (a full disk, say); dispatching pauses until they succeed.",
		}),
		runsStarted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditd_runs_started_total", Help: "Runs started (resumed runs are not counted again).",
		}),
		runsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_runs_finished_total", Help: "Runs finished, by status.",
		}, []string{"status"}),
		appendDelay: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "auditd_ledger_append_seconds", Help: "Time from an event's stamp to its commit group being durable.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
		groupSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "auditd_ledger_commit_group_events", Help: "Events per ledger commit group (one fsync each).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 8),
		}),
		commitTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "auditd_ledger_commit_seconds", Help: "Time a ledger commit group's transaction took, fsync included.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1},
		}),
	}
	return t
}

// Collectors are t's counters, histograms and scrape-time gauges.
func (t *Telemetry) Collectors() []prometheus.Collector {
	return []prometheus.Collector{t.dispatches, t.retries, t.responses, t.throttles, t.waits, t.breakers, t.changes,
		t.items, t.shed, t.cached, t.runsStarted, t.runsFinished, t.appendDelay, t.groupSize, t.commitTime,
		t.stalls, gauges{t}}
}

// Stalled is told when the ledger's commits start to fail, with the
// error, and with nil once one succeeds again (ledger.Options.OnStall).
func (t *Telemetry) Stalled(err error) {
	if err == nil {
		t.stalledSince.Store(0)
		return
	}
	if t.stalledSince.CompareAndSwap(0, time.Now().UnixNano()) {
		t.stalls.Inc()
	}
}

// Committed counts a durable commit group and logs its lifecycle events. It
// implements ledger.Observer.
func (t *Telemetry) Committed(events []*auditd.Event, took time.Duration) {
	now := time.Now()
	if t.Now != nil {
		now = t.Now()
	}
	t.groupSize.Observe(float64(len(events)))
	t.commitTime.Observe(took.Seconds())
	for _, e := range events {
		t.appendDelay.Observe(max(now.Sub(e.Time), 0).Seconds())
		t.count(e)
		t.logEvent(e)
	}
}

// count adds e to its counters.
func (t *Telemetry) count(e *auditd.Event) {
	switch e.Type {
	case auditd.EventDispatch:
		t.dispatches.WithLabelValues(e.SourceID).Inc()
		if e.Attempt > 1 {
			t.retries.WithLabelValues(e.SourceID).Inc()
		}
	case auditd.EventResponse:
		t.responses.WithLabelValues(e.SourceID, statusClass(e.Status)).Inc()
	case auditd.EventThrottle:
		t.responses.WithLabelValues(e.SourceID, statusClass(e.Status)).Inc()
		t.throttles.WithLabelValues(e.SourceID, strconv.Itoa(e.Status)).Inc()
	case auditd.EventTransportError:
		t.responses.WithLabelValues(e.SourceID, "transport").Inc()
	case auditd.EventWait:
		t.waits.WithLabelValues(e.SourceID, e.Gate).Observe(e.Actual.Seconds())
	case auditd.EventBreaker:
		t.breakers.WithLabelValues(e.SourceID, e.To).Inc()
	case auditd.EventRegistryChanged:
		t.changes.WithLabelValues(e.SourceID, e.Cause).Inc()
	case auditd.EventItemFinished:
		t.items.WithLabelValues(e.SourceID, string(e.Outcome)).Inc()
	case auditd.EventShed:
		t.shed.WithLabelValues(e.SourceID, e.Gate).Inc()
	case auditd.EventCacheServed:
		t.cached.WithLabelValues(e.SourceID).Inc()
	case auditd.EventRunStarted:
		t.runsStarted.Inc()
	case auditd.EventRunFinished:
		t.runsFinished.WithLabelValues(string(e.Outcome)).Inc()
	}
}

// statusClass names an HTTP status's class; 429 is one of its own.
func statusClass(status int) string {
	switch {
	case status == 429:
		return "429"
	case status >= 200 && status < 600:
		return strconv.Itoa(status/100) + "xx"
	}
	return "other"
}

// gauges are read when Prometheus scrapes: what is a state, not an event.
type gauges struct{ t *Telemetry }

var (
	descBreaker = prometheus.NewDesc("auditd_breaker_state",
		"A source's circuit breaker: 0 closed, 1 half-open, 2 open.", []string{"source"}, nil)
	descLimit = prometheus.NewDesc("auditd_learned_limit_per_second",
		"The pace a source's learned limit allows, in requests per second.", []string{"source"}, nil)
	descWindow = prometheus.NewDesc("auditd_learned_window_seconds",
		"The window a source's learned limit is expressed in.", []string{"source"}, nil)
	descConcurrency = prometheus.NewDesc("auditd_learned_concurrency",
		"The requests a source may have in flight, as learned within its configured concurrency.", []string{"source"}, nil)
	descCeiling = prometheus.NewDesc("auditd_ceiling_per_second",
		"A source's configured ceiling, in requests per second.", []string{"source"}, nil)
	descGroupLimit = prometheus.NewDesc("auditd_group_learned_limit_per_second",
		"The pace a gateway group's learned limit allows, in requests per second.", []string{"group"}, nil)
	descPause = prometheus.NewDesc("auditd_pause_remaining_seconds",
		"How long the pause in force on a source (its group's, when shared) still holds it.", []string{"source"}, nil)
	descInFlight = prometheus.NewDesc("auditd_in_flight_requests",
		"Requests to a source sent and not yet answered.", []string{"source"}, nil)
	descStalled = prometheus.NewDesc("auditd_ledger_stalled_seconds",
		"How long the ledger's commits have been failing; 0 while they succeed.", nil, nil)
	descQueued = prometheus.NewDesc("auditd_queued_requests",
		"Requests waiting at a source's rate gate (its group's, when shared).", []string{"source"}, nil)
)

func (g gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descBreaker, descLimit, descWindow, descConcurrency, descCeiling, descGroupLimit, descPause, descInFlight, descQueued, descStalled} {
		ch <- d
	}
}

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	stalled := 0.0
	if since := g.t.stalledSince.Load(); since != 0 {
		stalled = time.Since(time.Unix(0, since)).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(descStalled, prometheus.GaugeValue, stalled)
	p := g.t.wired()
	reg, lim := p.reg, p.lim
	if reg == nil {
		return
	}
	now := time.Now()
	groups := map[string]float64{}
	for _, src := range reg.ListSources() {
		s, err := reg.PeekState(src.ID)
		if err != nil {
			continue
		}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, src.ID)
		}
		gauge(descLimit, perSecond(s.Limit, s.Window))
		gauge(descWindow, s.Window.Seconds())
		gauge(descConcurrency, float64(s.Concurrency))
		gauge(descCeiling, perSecond(s.CeilingLimit, s.CeilingWindow))
		if s.Group != "" {
			groups[s.Group] = perSecond(s.GroupLimit, s.GroupWindow)
		}
		if lim == nil {
			continue
		}
		ls, err := lim.State(src.ID)
		if err != nil {
			continue
		}
		state := 0.0
		switch ls.Breaker {
		case limiter.BreakerHalfOpen:
			state = 1
		case limiter.BreakerOpen:
			state = 2
		}
		gauge(descBreaker, state)
		gauge(descPause, max(ls.PausedUntil.Sub(now), 0).Seconds())
		gauge(descInFlight, float64(ls.InFlight))
		gauge(descQueued, float64(ls.Queued))
	}
	for name, v := range groups {
		ch <- prometheus.MustNewConstMetric(descGroupLimit, prometheus.GaugeValue, v, name)
	}
}

func perSecond(limit int, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(limit) / window.Seconds()
}
