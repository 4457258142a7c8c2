package api

import (
	"errors"
	"math"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

// Budget admits units of work per key: a token id, or a client address for
// failed authentication.
type Budget interface {
	// Admit charges cost to key and returns 0 when the cost fits now.
	// Otherwise it charges nothing and returns how long until the same cost
	// would fit, or Never when it never can.
	Admit(key string, cost float64) time.Duration
	// Delay returns what Admit would, charging nothing.
	Delay(key string, cost float64) time.Duration
}

// Never is the wait a Budget returns for a cost larger than it can ever admit.
const Never = time.Duration(math.MaxInt64)

// Budget defaults. A token can submit a run of 100,000 items (the fetch
// loop's ceiling) from a full bucket, and gets at most 250,000 units in any
// five minutes (about 833 a second, sustained). A client address gets ten
// failed authentications in a burst and twenty in any minute.
const (
	DefaultTokenLimit  = 250_000
	DefaultTokenWindow = 5 * time.Minute
	DefaultTokenBurst  = 110_000

	DefaultAuthFailureLimit  = 20
	DefaultAuthFailureWindow = time.Minute
	DefaultAuthFailureBurst  = 10
)

// pruneAt is how many keys a KeyedBudget holds before it forgets idle ones.
const pruneAt = 10_000

// KeyedBudget is a Budget with one limiter.Budget per key: a token bucket
// for bursts under a sliding-window ceiling, created on a key's first
// charge. State is in memory, so a restart refills every key. It is safe
// for concurrent use.
type KeyedBudget struct {
	clock clock.Clock
	cfg   limiter.BudgetConfig

	mu   sync.Mutex
	keys map[string]*limiter.Budget
}

// NewKeyedBudget returns a KeyedBudget giving every key cfg on clock c.
func NewKeyedBudget(c clock.Clock, cfg limiter.BudgetConfig) (*KeyedBudget, error) {
	if _, err := limiter.NewBudget(c, cfg); err != nil {
		return nil, err
	}
	return &KeyedBudget{clock: c, cfg: cfg, keys: make(map[string]*limiter.Budget)}, nil
}

// mustKeyedBudget is NewKeyedBudget for the package's own constant configs.
func mustKeyedBudget(c clock.Clock, cfg limiter.BudgetConfig) *KeyedBudget {
	b, err := NewKeyedBudget(c, cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// Admit implements Budget.
func (b *KeyedBudget) Admit(key string, cost float64) time.Duration {
	d, err := b.budget(key).Allow(units(cost))
	if err != nil {
		return waitOf(err)
	} else if d.Admitted {
		return 0
	}
	return max(d.RetryAfter, 1)
}

// Delay implements Budget.
func (b *KeyedBudget) Delay(key string, cost float64) time.Duration {
	d, err := b.budget(key).Delay(units(cost))
	if err != nil {
		return waitOf(err)
	}
	return d
}

func (b *KeyedBudget) budget(key string) *limiter.Budget {
	b.mu.Lock()
	defer b.mu.Unlock()
	if lb := b.keys[key]; lb != nil {
		return lb
	}
	if len(b.keys) >= pruneAt {
		b.prune()
	}
	lb, _ := limiter.NewBudget(b.clock, b.cfg) // cfg was checked by NewKeyedBudget
	b.keys[key] = lb
	return lb
}

// prune forgets keys whose bucket is full again. Their window may still hold
// recent spends, so pruning can let such a key exceed its ceiling once; it
// only happens past pruneAt keys, where memory matters more.
func (b *KeyedBudget) prune() {
	for k, lb := range b.keys {
		if lb.Tokens() >= float64(max(b.cfg.Burst, limiter.DefaultBurst)) { // a bucket holds Burst, however it compares with the ceiling
			delete(b.keys, k)
		}
	}
}

func units(cost float64) int { return max(1, int(math.Ceil(cost))) }

func waitOf(err error) time.Duration {
	if errors.Is(err, limiter.ErrCostExceedsCapacity) {
		return Never
	}
	// ErrInvalidCost cannot happen: units is at least 1.
	return Never
}
