package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-playground/validator/v10"
	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/seal"
)

// Defaults for Options.
const (
	// DefaultLimit per DefaultWindow is where an unknown source starts: low
	// enough that a legacy county server never throttles the first request.
	DefaultLimit  = 15
	DefaultWindow = time.Minute

	// DefaultCeiling per DefaultCeilingWindow caps a source whose operator set
	// no Limit: ten requests a second is already impolite to a public server.
	DefaultCeiling       = 600
	DefaultCeilingWindow = time.Minute

	// DefaultGrowth multiplies the pace after each clean round of slow
	// start, until the first refusal.
	DefaultGrowth = 2.0

	// DefaultStartRound is how many successes make a round in slow start.
	DefaultStartRound = 2

	// DefaultDecrease is the factor applied after a refusal to the rate
	// the server was found to admit (the lower of the refused pace and the
	// rate admitted over the busy spell before it).
	DefaultDecrease = 0.9

	// DefaultProbeAfter is how many successes make a round after the first
	// refusal.
	DefaultProbeAfter = 10

	// DefaultProbeGain is the first step of a probe above the rate last
	// refused, as a share of it; it doubles while probes stay clean.
	DefaultProbeGain = 0.05

	// DefaultProbeHold is how many rounds a pace just under the rate last
	// refused holds before a probe past it; DefaultMaxHold bounds how far a
	// refused probe doubles it.
	DefaultProbeHold = 3
	DefaultMaxHold   = 64

	// DefaultProbeUtilization is the share of the pace a round must have
	// used to count: a pace that was never tried is not learned.
	DefaultProbeUtilization = 0.8

	// DefaultOutageStreak is how many failures in a row (5xx, transport)
	// make an outage, for a source that sets no breaker threshold: the
	// limiter's default threshold.
	DefaultOutageStreak = limiter.DefaultBreakerThreshold

	// DefaultAssumedWindow is the window of an advertised limit when neither
	// the headers nor Remaining and Reset tell it: most such APIs count per
	// minute. Using it is recorded as an assumption.
	DefaultAssumedWindow = time.Minute

	// DefaultMaxWindow bounds how far the window stretches once the limit is
	// down to one request.
	DefaultMaxWindow = time.Hour
)

// Causes: what taught a change, as recorded in registry.changed events.
const (
	CauseHeader    = "header"     // an advertised quota
	CauseThrottle  = "throttle"   // a refusal: 429, 503 with Retry-After, a plain 503 between successes
	CauseSlowStart = "slow_start" // a clean round before any refusal
	CauseRecover   = "recover"    // a clean round on the way back toward the rate last refused
	CauseProbeUp   = "probe_up"   // a probe past the rate last refused
	CauseOutage    = "outage"     // a plain 503's cut undone: an outage followed
	CauseOperator  = "operator"
)

// Causes of registry.snapshot events.
const (
	CauseRunStart = "run.start"
	CauseRunEnd   = "run.end"
)

// Scopes of a registry.changed event, in its Detail.
const (
	ScopeSource = "source"
	ScopeGroup  = "group"
)

// Errors.
var (
	// ErrNoLedger is returned by Open when Options.Ledger is nil: a registry
	// that cannot record its changes must not make any.
	ErrNoLedger = errors.New("registry: no ledger")

	// ErrSourceNotFound is returned for a source ID that was never put. It is
	// an *auditd.Error with code ENOTFOUND underneath, so the API maps it.
	ErrSourceNotFound = &auditd.Error{Code: auditd.ENOTFOUND, Message: "Source not found."}
)

// Bucket names. Everything the registry stores lives in bucketRoot.
const (
	bucketRoot    = "registry"
	bucketSources = "sources" // source ID -> JSON auditd.Source without Headers
	bucketSecrets = "secrets" // source ID -> request headers: sealed JSON map (JSON in the clear without Options.Seal)
	bucketQuery   = "query"   // source ID -> secret query parameters of proxied requests: sealed JSON map, as the headers
	bucketLearned = "learned" // source ID -> JSON state
	bucketGroups  = "groups"  // group name -> JSON state
)

// bucket returns the nested bucket name of the registry in tx.
func bucket(tx *bolt.Tx, name string) *bolt.Bucket {
	return tx.Bucket([]byte(bucketRoot)).Bucket([]byte(name))
}

// Options configure a Registry. Zero fields take the Default of their name.
type Options struct {
	// Ledger receives every registry.changed, registry.snapshot and
	// source.changed event. Required.
	Ledger auditd.Appender

	// Clock dates what was taught and measures runs of successes.
	// Default clock.Real{}.
	Clock clock.Clock

	// Seal seals the sources' request headers at rest. Default: nil, which
	// stores them in the clear (tests); the service always sets it.
	Seal *seal.Box

	// DefaultLimit per DefaultWindow is where an unknown source starts.
	DefaultLimit  int
	DefaultWindow time.Duration

	// DefaultCeiling per DefaultCeilingWindow caps a source configured
	// without a Limit.
	DefaultCeiling       int
	DefaultCeilingWindow time.Duration

	// Growth multiplies the pace after each clean round of slow start,
	// until the first refusal; StartRound successes make such a round.
	Growth     float64
	StartRound int

	// Decrease multiplies the rate found admitted after a refusal; in (0, 1).
	Decrease float64

	// ProbeAfter, ProbeGain, ProbeHold, MaxHold and ProbeUtilization shape
	// learning after the first refusal; see the package doc.
	ProbeAfter       int
	ProbeGain        float64
	ProbeHold        int
	MaxHold          int
	ProbeUtilization float64

	// OutageStreak is how many failures in a row make an outage, for a
	// source without a breaker threshold of its own.
	OutageStreak int

	// MaxWindow bounds the window's growth at a limit of one.
	MaxWindow time.Duration

	// AssumedWindow is the window of an advertised limit without one.
	AssumedWindow time.Duration
}

func (o *Options) setDefaults() {
	if o.Clock == nil {
		o.Clock = clock.Real{}
	}
	if o.DefaultLimit <= 0 {
		o.DefaultLimit = DefaultLimit
	}
	if o.DefaultWindow <= 0 {
		o.DefaultWindow = DefaultWindow
	}
	if o.DefaultCeiling <= 0 {
		o.DefaultCeiling = DefaultCeiling
	}
	if o.DefaultCeilingWindow <= 0 {
		o.DefaultCeilingWindow = DefaultCeilingWindow
	}
	if o.Growth <= 1 {
		o.Growth = DefaultGrowth
	}
	if o.StartRound <= 0 {
		o.StartRound = DefaultStartRound
	}
	if o.Decrease <= 0 || o.Decrease >= 1 {
		o.Decrease = DefaultDecrease
	}
	if o.ProbeAfter <= 0 {
		o.ProbeAfter = DefaultProbeAfter
	}
	if o.ProbeGain <= 0 || o.ProbeGain >= 1 {
		o.ProbeGain = DefaultProbeGain
	}
	if o.ProbeHold <= 0 {
		o.ProbeHold = DefaultProbeHold
	}
	if o.MaxHold < o.ProbeHold {
		o.MaxHold = max(DefaultMaxHold, o.ProbeHold)
	}
	if o.ProbeUtilization <= 0 || o.ProbeUtilization > 1 {
		o.ProbeUtilization = DefaultProbeUtilization
	}
	if o.OutageStreak <= 0 {
		o.OutageStreak = DefaultOutageStreak
	}
	if o.MaxWindow <= 0 {
		o.MaxWindow = DefaultMaxWindow
	}
	if o.AssumedWindow <= 0 {
		o.AssumedWindow = DefaultAssumedWindow
	}
}

// Registry is the persistent store of source configuration and learned
// limits. It is safe for concurrent use; Observe calls for different sources
// do not wait on each other unless the sources share a group.
type Registry struct {
	db       *bolt.DB
	opts     Options
	validate *validator.Validate

	// mu guards the maps; each entry has its own lock for its state.
	// Lock order: Registry.mu, then a source entry, then a group entry.
	mu      sync.RWMutex
	sources map[string]*entry
	groups  map[string]*entry
	// unopened names the sources whose stored headers did not open under
	// Options.Seal (the key changed): their requests fail until the source
	// is put again, rather than leave without their credentials.
	unopened map[string]bool
	// queries holds each source's secret query parameters (Source.Query),
	// kept out of its configuration as its headers are.
	queries map[string]map[string]string
}

// Open returns a Registry over db, creating its buckets when needed and
// loading every stored source and learned state into memory.
func Open(db *bolt.DB, opts Options) (*Registry, error) {
	if opts.Ledger == nil {
		return nil, ErrNoLedger
	}
	opts.setDefaults()
	r := &Registry{
		db:       db,
		opts:     opts,
		validate: newValidator(),
		sources:  make(map[string]*entry),
		groups:   make(map[string]*entry),
		unopened: make(map[string]bool),
		queries:  make(map[string]map[string]string),
	}
	if err := db.Update(func(tx *bolt.Tx) error {
		root, err := tx.CreateBucketIfNotExists([]byte(bucketRoot))
		if err != nil {
			return err
		}
		for _, name := range []string{bucketSources, bucketSecrets, bucketQuery, bucketLearned, bucketGroups} {
			if _, err := root.CreateBucketIfNotExists([]byte(name)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("create registry buckets: %w", err)
	}
	if err := db.View(r.load); err != nil {
		return nil, fmt.Errorf("load registry: %w", err)
	}
	return r, nil
}

// load reads every source, its learned state and the groups' states.
func (r *Registry) load(tx *bolt.Tx) error {
	learned, groups, secrets := bucket(tx, bucketLearned), bucket(tx, bucketGroups), bucket(tx, bucketSecrets)
	if err := bucket(tx, bucketSources).ForEach(func(k, v []byte) error {
		var src auditd.Source
		if err := json.Unmarshal(v, &src); err != nil {
			return fmt.Errorf("source %q: %w", k, err)
		}
		e := &entry{id: src.ID, src: src}
		e.ceil = r.sourceCeiling(src)
		if v := learned.Get(k); v != nil {
			if err := json.Unmarshal(v, &e.st); err != nil {
				return fmt.Errorf("learned state of %q: %w", k, err)
			}
		} else {
			e.st = r.initialState(e.ceil)
		}
		if v := secrets.Get(k); v != nil {
			if seal.IsSealed(v) {
				if r.opts.Seal == nil {
					r.unopened[src.ID] = true
					v = nil
				} else if opened, err := r.opts.Seal.Open(v, secretsContext(src.ID)); err == nil {
					v = opened
				} else {
					r.unopened[src.ID] = true
					v = nil
				}
			}
			if v != nil {
				if err := json.Unmarshal(v, &e.headers); err != nil {
					return fmt.Errorf("request headers of %q: %w", k, err)
				}
			}
		}
		if v := bucket(tx, bucketQuery).Get(k); v != nil {
			if seal.IsSealed(v) {
				opened, err := []byte(nil), error(nil)
				if r.opts.Seal != nil {
					opened, err = r.opts.Seal.Open(v, queryContext(src.ID))
				}
				if r.opts.Seal == nil || err != nil {
					r.unopened[src.ID] = true // as headers that do not open
				}
				v = opened
			}
			if v != nil {
				var q map[string]string
				if err := json.Unmarshal(v, &q); err != nil {
					return fmt.Errorf("secret query of %q: %w", k, err)
				}
				r.queries[src.ID] = q
			}
		}
		e.setConfig(src, e.headers)
		r.startLearning(e)
		r.sources[src.ID] = e
		return nil
	}); err != nil {
		return err
	}
	for _, e := range r.sources {
		if e.src.Group == "" {
			continue
		}
		g := r.groups[e.src.Group]
		if g == nil {
			g = &entry{id: e.src.Group, group: true}
			if v := groups.Get([]byte(e.src.Group)); v != nil {
				if err := json.Unmarshal(v, &g.st); err != nil {
					return fmt.Errorf("learned state of group %q: %w", e.src.Group, err)
				}
			}
			r.startLearning(g)
			r.groups[e.src.Group] = g
		}
		e.grp = g
	}
	for name, g := range r.groups {
		g.ceil = r.groupCeiling(name)
		if g.st.Limit == 0 {
			g.st = r.initialState(g.ceil)
		}
	}
	for _, e := range r.sources {
		if e.grp != nil {
			e.grp.setMember(e.id, e.rate())
		}
	}
	return nil
}

// startLearning readies e's in-memory learning state after a load. A state
// stored before learning had phases (or with nothing learned) starts in slow
// start from the limit it has, forgetting the limit last refused: under the
// old rules an outage's 503s cut the limit, and this lets it recover.
func (r *Registry) startLearning(e *entry) {
	e.hold, e.gain = r.opts.ProbeHold, r.opts.ProbeGain
	if e.st.Phase == "" {
		e.st.Phase, e.st.Refused, e.st.Bad = PhaseStart, 0, 0
	}
}

// initialState is where an entry with nothing learned starts: the default,
// clamped to its ceiling.
func (r *Registry) initialState(ceil rate) state {
	l, w := clamp(r.opts.DefaultLimit, r.opts.DefaultWindow, ceil)
	return state{Limit: l, Window: auditd.Duration(w), Base: auditd.Duration(w), Phase: PhaseStart}
}

// sourceCeiling is the configured ceiling of src, or the default.
func (r *Registry) sourceCeiling(src auditd.Source) rate {
	if src.Limit <= 0 {
		return rate{r.opts.DefaultCeiling, r.opts.DefaultCeilingWindow}
	}
	w := src.Window.D()
	if w <= 0 {
		w = r.opts.DefaultCeilingWindow // as the limiter reads a Limit without a Window
	}
	return rate{src.Limit, w}
}

// groupCeiling is the highest ceiling among the group's members: members
// sharing one gateway cannot together be allowed more than the most any one
// of them is allowed. Callers hold r.mu (or own r exclusively).
func (r *Registry) groupCeiling(name string) rate {
	var best rate
	for _, e := range r.sources {
		if e.src.Group == name && (best.limit == 0 || e.ceil.faster(best)) {
			best = e.ceil
		}
	}
	return best
}

// Limits is what the limiter needs to pace one source.
type Limits struct {
	Limit  int           // requests per Window for the source itself
	Window time.Duration //
	Group  string        // gateway group; empty when none
	// GroupLimit per GroupWindow is the budget the whole group shares, as
	// learned from correlated throttles; MembersLimit is the sum of its
	// members' own limits per GroupWindow. Zero when Group is empty.
	GroupLimit   int
	GroupWindow  time.Duration
	MembersLimit int
}

// Pace returns the budget the limiter paces the source at. Without a group
// it is the source's own limit. In a group, whose members draw on one
// budget, it is the group's limit or the sum of the members' own limits,
// whichever is lower: a member's throttle that was not correlated cuts only
// that member's limit, and through the sum it still slows the shared budget
// (the limiter cannot pace one member apart from the others).
func (l Limits) Pace() (limit int, window time.Duration) {
	if l.Group == "" {
		return l.Limit, l.Window
	}
	if l.MembersLimit > 0 && l.MembersLimit < l.GroupLimit {
		return l.MembersLimit, l.GroupWindow
	}
	return l.GroupLimit, l.GroupWindow
}

// Limits returns the current limits of source id.
func (r *Registry) Limits(id string) (Limits, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l := e.limits()
	e.seen.Store(&l)
	return l, nil
}

// Peek is Limits for those who only show or estimate with them (a run's
// view, its finish estimate): it never waits for a change in progress,
// which holds the source while its registry.changed is made durable (and
// so for as long as a stalled ledger refuses writes). It returns the
// limits now when no change is in progress, else those last read.
func (r *Registry) Peek(id string) (Limits, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	if release, ok := e.tryHold(); ok {
		defer release()
		l := e.limitsWith(e.grp)
		e.seen.Store(&l)
		return l, nil
	}
	if l := e.seen.Load(); l != nil {
		return *l, nil
	}
	return r.Limits(id) // never read yet: wait, as Limits does
}

// limits reads e's limits and its group's. Callers hold e.mu, not the
// group's.
func (e *entry) limits() Limits {
	g := e.grp
	if g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
	}
	return e.limitsWith(g)
}

// limitsWith reads e's limits and those of its group g (nil without one).
// Callers hold e.mu and g.mu.
func (e *entry) limitsWith(g *entry) Limits {
	l := Limits{Limit: e.st.Limit, Window: e.st.Window.D()}
	if g != nil {
		l.Group, l.GroupLimit, l.GroupWindow, l.MembersLimit = g.id, g.st.Limit, g.st.Window.D(), g.membersLimit
	}
	return l
}

// State is everything the registry holds about one source, for reading:
// its configuration (without secrets) and what it has learned.
type State struct {
	Source auditd.Source // configuration, tier and breaker policy; Headers is always nil

	Limit  int           // learned limit per Window
	Window time.Duration //
	// CeilingLimit per CeilingWindow is the most the source may be sent.
	CeilingLimit  int
	CeilingWindow time.Duration
	// AdvertisedLimit per AdvertisedWindow is the last quota the source
	// advertised in its headers; zero when it never did.
	AdvertisedLimit  int
	AdvertisedWindow time.Duration
	Cause            string    // what taught Limit and Window; empty for the default
	TaughtAt         time.Time // when; zero for the default
	TaughtRun        string    // run whose response taught it
	TaughtBy         string    // source whose response taught it
	ThrottledAt      int       // the rate last refused, per Window; zero when none
	Phase            string    // PhaseStart or PhaseSteady
	WindowFrom       string    // how the advertised window was learned (WindowAdvertised...); empty when none

	Group              string // gateway group; the Group fields are zero without one
	GroupLimit         int
	GroupWindow        time.Duration
	GroupCeilingLimit  int
	GroupCeilingWindow time.Duration
	GroupCause         string
	GroupTaughtAt      time.Time
	GroupThrottledAt   int // the group limit last refused; zero when none
	MembersLimit       int // the members' own limits summed per GroupWindow
}

// State returns what the registry holds about source id.
func (r *Registry) State(id string) (State, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return State{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if g := e.grp; g != nil {
		g.mu.Lock()
		defer g.mu.Unlock()
	}
	return e.state(), nil
}

// state reads e's state and its group's, and keeps it for PeekState.
// Callers hold e.mu and the group's.
func (e *entry) state() State {
	s := State{
		Source:           e.src,
		Limit:            e.st.Limit,
		Window:           e.st.Window.D(),
		CeilingLimit:     e.ceil.limit,
		CeilingWindow:    e.ceil.window,
		AdvertisedLimit:  e.st.AdvLimit,
		AdvertisedWindow: e.st.AdvWindow.D(),
		Cause:            e.st.Cause,
		TaughtAt:         e.st.TaughtAt,
		TaughtRun:        e.st.RunID,
		TaughtBy:         e.st.SourceID,
		ThrottledAt:      e.st.refusedLimit(),
		Phase:            e.st.Phase,
		WindowFrom:       e.st.WindowFrom,
		Group:            e.src.Group,
	}
	if g := e.grp; g != nil {
		s.GroupLimit, s.GroupWindow = g.st.Limit, g.st.Window.D()
		s.GroupCause, s.GroupTaughtAt = g.st.Cause, g.st.TaughtAt
		s.GroupCeilingLimit, s.GroupCeilingWindow = g.ceil.limit, g.ceil.window
		s.GroupThrottledAt, s.MembersLimit = g.st.refusedLimit(), g.membersLimit
	}
	e.seenState.Store(&s)
	return s
}

// tryHold takes e and its group, as Limits and State do, unless a change
// holds either; release lets them go.
func (e *entry) tryHold() (release func(), ok bool) {
	if !e.mu.TryLock() {
		return nil, false
	}
	g := e.grp
	if g != nil && !g.mu.TryLock() {
		e.mu.Unlock()
		return nil, false
	}
	return func() {
		if g != nil {
			g.mu.Unlock()
		}
		e.mu.Unlock()
	}, true
}

// PeekState is State for what only shows it (the metrics' gauges): it
// never waits for a change in progress (one held by a stalled ledger),
// answering with the state last read instead.
func (r *Registry) PeekState(id string) (State, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return State{}, ErrSourceNotFound
	}
	if release, ok := e.tryHold(); ok {
		defer release()
		return e.state(), nil
	}
	if st := e.seenState.Load(); st != nil {
		return *st, nil
	}
	return r.State(id) // never read yet: wait, as State does
}

// setConfig sets the entry's configuration and headers, and the view of
// them the lock-free readers see. Callers hold mu, or own e alone.
func (e *entry) setConfig(src auditd.Source, headers map[string]string) {
	e.src, e.headers = src, headers
	names := slices.Sorted(maps.Keys(headers))
	e.config.Store(&configView{src: src, headerNames: names})
}

// GetSource returns the configuration of source id without its secret
// headers (Headers is nil).
func (r *Registry) GetSource(id string) (auditd.Source, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return auditd.Source{}, ErrSourceNotFound
	}
	return e.config.Load().src, nil
}

// ListSources returns every source's configuration, without secret headers,
// sorted by ID.
func (r *Registry) ListSources() []auditd.Source {
	r.mu.RLock()
	entries := make([]*entry, 0, len(r.sources))
	for _, e := range r.sources {
		entries = append(entries, e)
	}
	r.mu.RUnlock()
	out := make([]auditd.Source, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.config.Load().src)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// RequestHeaders returns a copy of the secret headers to add to every
// request to source id. It is meant for the fetch loop only: nothing it
// returns may be recorded.
func (r *Registry) RequestHeaders(id string) (map[string]string, error) {
	r.mu.RLock()
	e, unopened := r.sources[id], r.unopened[id] // Put changes both under r.mu
	r.mu.RUnlock()
	if e == nil {
		return nil, ErrSourceNotFound
	}
	if unopened {
		return nil, fmt.Errorf("the stored request headers of source %q do not open under the sealing key (%s changed?); put the source again", id, seal.KeyFile)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.headers), nil
}

// HeaderNames returns the names of source id's request headers, sorted,
// without their values: what the API shows of them.
func (r *Registry) HeaderNames(id string) ([]string, error) {
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return nil, ErrSourceNotFound
	}
	return slices.Clone(e.config.Load().headerNames), nil
}

// secretsContext binds a source's sealed headers to its id.
func secretsContext(id string) []byte { return []byte("registry.secrets/" + id) }

// queryContext binds a source's sealed secret query parameters to its id.
func queryContext(id string) []byte { return []byte("registry.query/" + id) }

// RequestQuery returns a copy of the secret query parameters to add to
// every request proxied to source id (Source.Query). Like RequestHeaders
// it is for the fetch loop only: nothing it returns may be recorded.
func (r *Registry) RequestQuery(id string) (map[string]string, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.sources[id] == nil {
		return nil, ErrSourceNotFound
	}
	return maps.Clone(r.queries[id]), nil
}

// PutSource creates or replaces the configuration of src.ID, on behalf of
// principal. It validates src, appends a source.changed event whose Detail
// is the configuration without its headers, then stores the headers apart.
// What was learned about the source is kept, clamped to a lowered ceiling
// (a registry.changed event with Cause "operator" when that moves it).
func (r *Registry) PutSource(ctx context.Context, principal string, src auditd.Source) error {
	_, err := r.Put(ctx, principal, src)
	return err
}

// Put is PutSource, and reports whether it created the source: of
// concurrent puts of one new id, exactly one creates it.
func (r *Registry) Put(ctx context.Context, principal string, src auditd.Source) (created bool, err error) {
	if err := r.validateSource(src); err != nil {
		return false, err
	}
	secrets, query := src.Headers, src.Query
	src.Headers, src.Query = nil, nil
	if src.Group == src.ID {
		// A group and a source sharing a name would be indistinguishable in
		// the ledger's Group field; nothing is lost by forbidding it.
		return false, &auditd.Error{Code: auditd.EINVALID, Field: "group", Message: "Group must differ from the source id."}
	}
	cfg, err := json.Marshal(src)
	if err != nil {
		return false, fmt.Errorf("encode source %q: %w", src.ID, err)
	}
	var sec, qry []byte
	if len(secrets) > 0 {
		if sec, err = json.Marshal(secrets); err != nil {
			return false, fmt.Errorf("encode request headers of %q: %w", src.ID, err)
		}
		if r.opts.Seal != nil {
			sec = r.opts.Seal.Seal(sec, secretsContext(src.ID))
		}
	}
	if len(query) > 0 {
		if qry, err = json.Marshal(query); err != nil {
			return false, fmt.Errorf("encode secret query of %q: %w", src.ID, err)
		}
		if r.opts.Seal != nil {
			qry = r.opts.Seal.Seal(qry, queryContext(src.ID))
		}
	}

	// Registry.mu is held for the whole put: membership and ceilings of
	// groups change here, and puts are rare.
	r.mu.Lock()
	defer r.mu.Unlock()
	created = r.sources[src.ID] == nil

	if _, err := r.opts.Ledger.Append(ctx, auditd.Event{
		Type:      auditd.EventSourceChanged,
		SourceID:  src.ID,
		Group:     src.Group,
		Principal: principal,
		Detail:    string(cfg),
	}); err != nil {
		return false, fmt.Errorf("append source.changed for %q: %w", src.ID, err)
	}
	if err := r.db.Update(func(tx *bolt.Tx) error {
		if err := bucket(tx, bucketSources).Put([]byte(src.ID), cfg); err != nil {
			return err
		}
		if qry == nil {
			if err := bucket(tx, bucketQuery).Delete([]byte(src.ID)); err != nil {
				return err
			}
		} else if err := bucket(tx, bucketQuery).Put([]byte(src.ID), qry); err != nil {
			return err
		}
		if sec == nil {
			return bucket(tx, bucketSecrets).Delete([]byte(src.ID))
		}
		return bucket(tx, bucketSecrets).Put([]byte(src.ID), sec)
	}); err != nil {
		return false, fmt.Errorf("store source %q: %w", src.ID, err)
	}

	e := r.sources[src.ID]
	if e == nil {
		e = &entry{id: src.ID}
		e.ceil = r.sourceCeiling(src)
		e.st = r.initialState(e.ceil)
		r.startLearning(e)
		r.sources[src.ID] = e
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	oldGroup := e.src.Group
	e.ceil = r.sourceCeiling(src)
	e.setConfig(src, maps.Clone(secrets))
	delete(r.unopened, src.ID)
	if len(query) > 0 {
		r.queries[src.ID] = maps.Clone(query)
	} else {
		delete(r.queries, src.ID)
	}

	// Groups whose membership or ceilings may have moved.
	if src.Group != "" {
		g := r.groups[src.Group]
		if g == nil {
			g = &entry{id: src.Group, group: true}
			r.startLearning(g)
			r.groups[src.Group] = g
		}
		e.grp = g
	} else {
		e.grp = nil
	}
	touched := []string{src.Group}
	if oldGroup != "" && oldGroup != src.Group {
		touched = append(touched, oldGroup)
		if r.groupCeiling(oldGroup).limit == 0 {
			delete(r.groups, oldGroup) // no members left; its stored state stays for a comeback
			touched = touched[:1]
		}
	}

	if err := r.clampOperator(ctx, e, principal, src.Group); err != nil {
		return created, err
	}
	for _, name := range touched {
		if name == "" {
			continue
		}
		g := r.groups[name]
		g.mu.Lock()
		g.ceil = r.groupCeiling(name)
		if g.st.Limit == 0 {
			if err := r.loadGroup(g); err != nil {
				g.mu.Unlock()
				return created, err
			}
		}
		err := r.clampOperator(ctx, g, principal, src.ID)
		if name == src.Group {
			g.setMember(src.ID, e.rate())
		} else {
			g.dropMember(src.ID)
		}
		g.mu.Unlock()
		if err != nil {
			return created, err
		}
	}
	return created, nil
}

// loadGroup reads a group's stored state, or starts it at the default.
// Callers hold g.mu.
func (r *Registry) loadGroup(g *entry) error {
	err := r.db.View(func(tx *bolt.Tx) error {
		v := bucket(tx, bucketGroups).Get([]byte(g.id))
		if v == nil {
			return nil
		}
		return json.Unmarshal(v, &g.st)
	})
	if err != nil {
		return fmt.Errorf("load group %q: %w", g.id, err)
	}
	if g.st.Limit == 0 {
		g.st = r.initialState(g.ceil)
	}
	r.startLearning(g)
	return nil
}

// clampOperator brings e within its (possibly new) ceiling, recording the
// move as an operator change. For a source, other is its group; for a group,
// the source whose put moved it. Callers hold e.mu.
func (r *Registry) clampOperator(ctx context.Context, e *entry, principal, other string) error {
	l, w := clamp(e.st.Limit, e.st.Window.D(), e.ceil)
	if l == e.st.Limit && w == e.st.Window.D() {
		return nil
	}
	c := change{cause: CauseOperator, principal: principal}
	if e.group {
		c.sourceID = other
	} else {
		c.sourceID = e.id
	}
	old := e.st
	e.set(l, w, c, r.opts.Clock.Now())
	return r.commit(ctx, e, old, c)
}

// SetLimit sets the learned limit of source id by hand, on behalf of
// principal (Cause "operator"), within the source's ceiling. It returns the
// limits now in force.
func (r *Registry) SetLimit(ctx context.Context, principal, id string, limit int, window time.Duration) (Limits, error) {
	if limit < 1 {
		return Limits{}, &auditd.Error{Code: auditd.EINVALID, Field: "limit", Message: "Limit must be at least 1."}
	} else if window <= 0 {
		return Limits{}, &auditd.Error{Code: auditd.EINVALID, Field: "window", Message: "Window must be positive."}
	}
	r.mu.RLock()
	e := r.sources[id]
	r.mu.RUnlock()
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l, w := clamp(limit, window, e.ceil)
	if l != e.st.Limit || w != e.st.Window.D() {
		c := change{cause: CauseOperator, principal: principal, sourceID: id}
		old := e.st
		e.set(l, w, c, r.opts.Clock.Now())
		// The operator's word replaces what refusals taught: hold at it, then
		// probe past it.
		e.st.Refused, e.st.Phase, e.probing, e.held = 0, PhaseSteady, false, 0
		if err := r.commit(ctx, e, old, c); err != nil {
			return Limits{}, err
		}
		if g := e.grp; g != nil {
			g.mu.Lock()
			g.setMember(e.id, e.rate())
			g.mu.Unlock()
		}
	}
	return e.limits(), nil
}

// StartRun appends a registry.snapshot (Cause "run.start") for each of the
// sources run runID uses. Call it after run.started, before the first item.
func (r *Registry) StartRun(ctx context.Context, runID string, sourceIDs []string) error {
	return r.snapshot(ctx, runID, CauseRunStart, sourceIDs)
}

// EndRun appends a registry.snapshot (Cause "run.end") for each of the
// sources run runID used. Call it before run.finished.
func (r *Registry) EndRun(ctx context.Context, runID string, sourceIDs []string) error {
	return r.snapshot(ctx, runID, CauseRunEnd, sourceIDs)
}

// snapshotDetail is the Detail of a registry.snapshot event.
type snapshotDetail struct {
	CeilingLimit     int             `json:"ceiling_limit"`
	CeilingWindow    auditd.Duration `json:"ceiling_window"`
	TaughtBy         string          `json:"taught_by,omitempty"`
	TaughtAt         time.Time       `json:"taught_at,omitzero"`
	AdvertisedLimit  int             `json:"advertised_limit,omitempty"`
	AdvertisedWindow auditd.Duration `json:"advertised_window,omitempty"`
	GroupLimit       int             `json:"group_limit,omitempty"`
	GroupWindow      auditd.Duration `json:"group_window,omitempty"`
	MembersLimit     int             `json:"members_limit,omitempty"`
	Tier             string          `json:"tier,omitempty"`
	// Burst is how many requests the source may send back to back on top
	// of its pace (the limiter's token bucket); reconciliation's R9 allows
	// it on top of the limit in force.
	Burst int `json:"burst"`
}

func (r *Registry) snapshot(ctx context.Context, runID, cause string, sourceIDs []string) error {
	ids := make([]string, 0, len(sourceIDs))
	seen := make(map[string]bool, len(sourceIDs))
	for _, id := range sourceIDs {
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	sort.Strings(ids) // a run's snapshots read the same whatever order the caller had
	events := make([]auditd.Event, 0, len(ids))
	for _, id := range ids {
		s, err := r.State(id)
		if err != nil {
			return fmt.Errorf("snapshot %q: %w", id, err)
		}
		detail, err := json.Marshal(snapshotDetail{
			CeilingLimit:     s.CeilingLimit,
			CeilingWindow:    auditd.Duration(s.CeilingWindow),
			TaughtBy:         s.Cause,
			TaughtAt:         s.TaughtAt,
			AdvertisedLimit:  s.AdvertisedLimit,
			AdvertisedWindow: auditd.Duration(s.AdvertisedWindow),
			GroupLimit:       s.GroupLimit,
			GroupWindow:      auditd.Duration(s.GroupWindow),
			MembersLimit:     s.MembersLimit,
			Tier:             s.Source.Tier,
			Burst:            effectiveBurst(s),
		})
		if err != nil {
			return fmt.Errorf("encode snapshot of %q: %w", id, err)
		}
		events = append(events, auditd.Event{
			Type:      auditd.EventRegistrySnapshot,
			RunID:     runID,
			SourceID:  id,
			NewLimit:  s.Limit,
			NewWindow: s.Window,
			Group:     s.Group,
			Snapshot:  cause,
			Detail:    string(detail),
		})
	}
	// A ledger that takes a batch makes a run's snapshots durable in one
	// commit instead of one per source.
	if b, ok := r.opts.Ledger.(batchAppender); ok {
		if _, err := b.AppendBatch(ctx, events); err != nil {
			return fmt.Errorf("append snapshots: %w", err)
		}
		return nil
	}
	for _, e := range events {
		if _, err := r.opts.Ledger.Append(ctx, e); err != nil {
			return fmt.Errorf("append snapshot of %q: %w", e.SourceID, err)
		}
	}
	return nil
}

// batchAppender is a ledger that appends several events in one commit.
type batchAppender interface {
	AppendBatch(ctx context.Context, events []auditd.Event) ([]auditd.Event, error)
}

// newValidator returns a validator that names fields by their JSON names, so
// an error's Field is what the client sent.
func newValidator() *validator.Validate {
	v := validator.New(validator.WithRequiredStructEnabled())
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			return ""
		}
		return name
	})
	return v
}

// validateSource checks src's tags and the rules the tags cannot say.
func (r *Registry) validateSource(src auditd.Source) error {
	if err := r.validate.Struct(src); err != nil {
		var verrs validator.ValidationErrors
		if errors.As(err, &verrs) && len(verrs) > 0 {
			fe := verrs[0]
			field := strings.TrimPrefix(fe.Namespace(), "Source.")
			return &auditd.Error{Code: auditd.EINVALID, Field: field,
				Message: fmt.Sprintf("Invalid %s: fails %q.", field, fe.Tag())}
		}
		return &auditd.Error{Code: auditd.EINVALID, Message: "Invalid source."}
	}
	if src.Window < 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "window", Message: "Window must not be negative."}
	} else if src.Window > 0 && src.Limit == 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "limit", Message: "A window needs a limit."}
	}
	if err := checkBaseURL(src.BaseURL); err != nil {
		return err
	}
	for name, value := range src.Headers {
		if !validHeaderName(name) {
			return &auditd.Error{Code: auditd.EINVALID, Field: "headers", Message: "Invalid header name."}
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return &auditd.Error{Code: auditd.EINVALID, Field: "headers[" + name + "]", Message: fmt.Sprintf("The value of header %s must not contain CR, LF or NUL.", name)}
		}
	}
	for name := range src.Query {
		if !validHeaderName(name) { // a token: nothing a query string would need to escape
			return &auditd.Error{Code: auditd.EINVALID, Field: "query", Message: "Invalid query parameter name."}
		}
	}
	return nil
}

// checkBaseURL refuses a base URL that is not http or https with a host,
// that carries a query or a fragment, or that carries credentials: those
// belong in headers (stored sealed, never recorded) or in item paths under
// a parameter named in secret_query (redacted before anything is stored).
// A host written as a number in another form than dotted decimal
// ("0x7f000001", "2130706433", "127.1") is refused too: resolvers disagree
// about what it names.
func checkBaseURL(raw string) error {
	bad := func(format string, args ...any) error {
		return &auditd.Error{Code: auditd.EINVALID, Field: "base_url", Message: fmt.Sprintf(format, args...)}
	}
	u, err := url.Parse(raw)
	if err != nil {
		return bad("base_url is not a URL.")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return bad("base_url must be an http or https URL.")
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return bad("base_url must name a host (http://host or https://host).")
	}
	if u.User != nil || redact.New(nil).URL(raw) != raw {
		return bad("base_url must not carry credentials; put them in headers, or in item paths under a parameter named in secret_query.")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.ContainsAny(raw, "?#") {
		return bad("base_url must not have a query or a fragment; parameters belong in item paths.")
	}
	if host := u.Hostname(); !strings.Contains(host, ":") && numericHost(host) {
		if _, err := netip.ParseAddr(host); err != nil {
			return bad("base_url's host %q is a number but not a dotted-decimal IPv4 address; write the address in full.", host)
		}
	}
	return nil
}

// numericHost reports whether host is made of digits, dots and hex
// notation only: an address in some form, not a name.
func numericHost(host string) bool {
	h := strings.ToLower(strings.TrimSuffix(host, "."))
	if h == "" {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" {
			return false
		}
		if strings.HasPrefix(label, "0x") {
			label = strings.TrimLeft(label[2:], "0123456789abcdef")
		} else {
			label = strings.TrimLeft(label, "0123456789")
		}
		if label != "" {
			return false
		}
	}
	return true
}

// validHeaderName reports whether name is an RFC 9110 token.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte(`"(),/:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// ValidateSource checks src as PutSource would, storing nothing. A
// configuration file is checked whole with it before any source is applied.
func (r *Registry) ValidateSource(src auditd.Source) error { return r.validateSource(src) }

// CheckSource is ValidateSource without a registry: a configuration file
// is checked before anything is opened or created for it.
func CheckSource(src auditd.Source) error {
	return checker().validateSource(src)
}

// checker is the Registry CheckSource validates with, its validator built
// once (a config file checks every source it lists).
var checker = sync.OnceValue(func() *Registry { return &Registry{validate: newValidator()} })

// effectiveBurst is the burst the limiter gives a source: its configured
// Burst, the limiter's default when it sets none, and the default for a
// gateway group member (members share one budget, described alike).
func effectiveBurst(s State) int {
	if s.Source.Burst > 0 && s.Group == "" {
		return s.Source.Burst
	}
	return limiter.DefaultBurst
}

// SecretQueries reads, from a registry's bbolt file opened read-only (a
// stopped service's, for an offline export), each source's declared
// secret query parameter names. A file without a registry has none.
func SecretQueries(db *bolt.DB) (map[string][]string, error) {
	out := map[string][]string{}
	err := db.View(func(tx *bolt.Tx) error {
		root := tx.Bucket([]byte(bucketRoot))
		if root == nil || root.Bucket([]byte(bucketSources)) == nil {
			return nil
		}
		return root.Bucket([]byte(bucketSources)).ForEach(func(k, v []byte) error {
			var src auditd.Source
			if err := json.Unmarshal(v, &src); err != nil {
				return fmt.Errorf("source %q: %w", k, err)
			}
			if len(src.SecretQuery) > 0 {
				out[string(k)] = src.SecretQuery
			}
			return nil
		})
	})
	return out, err
}
