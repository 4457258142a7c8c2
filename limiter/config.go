package limiter

import (
	"fmt"
	"time"

	"github.com/auditd/auditd"
)

// Defaults for every Config field left zero. They are conservative on
// purpose: an unknown municipal server is treated as a fragile one.
const (
	DefaultLimit            = 15 // per DefaultWindow: legacy GIS servers tolerate little more
	DefaultWindow           = time.Minute
	DefaultBurst            = 1 // leaky-bucket gateways reject bursts a window would allow
	DefaultConcurrency      = 4
	DefaultRetryCap         = 5 * time.Minute // a Retry-After: 86400 must not park a worker for a day
	DefaultBackoffBase      = time.Second
	DefaultBackoffMax       = time.Minute
	DefaultBreakerThreshold = 5
	// The first cooldown is short, so that a source that answers again
	// is probed soon after; it doubles after each failed probe, up to 16
	// times the first (2, 4, 8, 16, then every 32 seconds). How long an
	// outage may last before requests give up is its length
	// (Request.DownFor), not the number of probes that failed.
	DefaultBreakerCooldown = 2 * time.Second
	DefaultBreakerBackoff  = 16
	DefaultBreakerProbes   = 1
)

// Config is one source's gates. Zero fields take the Default... constants.
type Config struct {
	// Group names a gateway group: its members share one Budget (and so one
	// pause). Empty means the source has a budget of its own.
	Group string
	// Limit per Window is the configured ceiling; Rate (per second) and
	// Burst are the token bucket's refill and capacity, each in cost
	// units. Default DefaultLimit, DefaultWindow, Limit per Window,
	// DefaultBurst.
	Limit  int
	Window time.Duration
	Rate   float64
	Burst  int
	// CountRequests makes learned limits count requests rather than cost
	// units (BudgetConfig.CountRequests).
	CountRequests bool
	// Concurrency is how many requests to the source may be in flight.
	// Default DefaultConcurrency.
	Concurrency int
	// RetryCap clamps a server's Retry-After. Default DefaultRetryCap.
	RetryCap time.Duration
	// BackoffBase doubles with each attempt up to BackoffMax.
	// Default DefaultBackoffBase and DefaultBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Breaker: Threshold consecutive failures (5xx, transport) open it for
	// Cooldown, then up to Probes requests at once test the source. Each
	// failed probe doubles the cooldown, up to Backoff times Cooldown, so
	// the end of an outage is seen within one cooldown of it and a long one
	// costs a probe a cooldown; closing resets it.
	// Default DefaultBreakerThreshold, DefaultBreakerCooldown,
	// DefaultBreakerProbes, DefaultBreakerBackoff.
	BreakerThreshold int
	BreakerCooldown  time.Duration
	BreakerProbes    int
	BreakerBackoff   int
}

// ConfigFromSource maps an operator's source configuration to a Config.
// Fields the source leaves zero stay zero and take the defaults.
func ConfigFromSource(s auditd.Source) Config {
	return Config{
		Group:            s.Group,
		Limit:            s.Limit,
		Window:           s.Window.D(),
		Rate:             s.Rate,
		Burst:            s.Burst,
		CountRequests:    s.Count != auditd.CountRecords,
		Concurrency:      s.Concurrency,
		RetryCap:         s.RetryCap.D(),
		BreakerThreshold: s.Breaker.Threshold,
		BreakerCooldown:  s.Breaker.Cooldown.D(),
		BreakerProbes:    s.Breaker.Probes,
	}
}

// withDefaults returns c with every zero field set to its default.
func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.Limit, DefaultLimit)
	defD(&c.Window, DefaultWindow)
	def(&c.Burst, DefaultBurst)
	def(&c.Concurrency, DefaultConcurrency)
	defD(&c.RetryCap, DefaultRetryCap)
	defD(&c.BackoffBase, DefaultBackoffBase)
	defD(&c.BackoffMax, DefaultBackoffMax)
	def(&c.BreakerThreshold, DefaultBreakerThreshold)
	defD(&c.BreakerCooldown, DefaultBreakerCooldown)
	def(&c.BreakerProbes, DefaultBreakerProbes)
	def(&c.BreakerBackoff, DefaultBreakerBackoff)
	return c
}

func (c Config) validate() error {
	if err := c.budget().validate(); err != nil {
		return err
	}
	switch {
	case c.Concurrency < 1:
		return fmt.Errorf("concurrency %d: %w", c.Concurrency, ErrInvalidConfig)
	case c.RetryCap < 0, c.BackoffBase < 0, c.BackoffMax < c.BackoffBase:
		return fmt.Errorf("retry cap %v, backoff %v..%v: %w", c.RetryCap, c.BackoffBase, c.BackoffMax, ErrInvalidConfig)
	case c.BreakerThreshold < 1, c.BreakerCooldown < 0, c.BreakerProbes < 1, c.BreakerBackoff < 1:
		return fmt.Errorf("breaker %d/%v/%d: %w", c.BreakerThreshold, c.BreakerCooldown, c.BreakerProbes, ErrInvalidConfig)
	}
	return nil
}

func (c Config) budget() BudgetConfig {
	return BudgetConfig{Limit: c.Limit, Window: c.Window, Rate: c.Rate, Burst: c.Burst, CountRequests: c.CountRequests}
}
