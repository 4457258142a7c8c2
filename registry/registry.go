package registry

import (
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/go-playground/validator/v10"
	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/internal/validation"
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
		validate: validation.New(),
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
	learned, groups := bucket(tx, bucketLearned), bucket(tx, bucketGroups)
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
		if err := r.loadSecrets(tx, e); err != nil {
			return err
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
