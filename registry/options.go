package registry

import (
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
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
