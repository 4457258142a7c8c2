package auditd

import "time"

// Source is one upstream endpoint (a jurisdiction's GIS server, Grants.gov, a
// geocoder) as configured by an operator. What auditd has learned about it
// lives in the registry, next to this configuration.
type Source struct {
	ID string `json:"id" yaml:"id" validate:"required,max=100,printascii"`
	// BaseURL is http or https with a host, no query and no credentials
	// (registry.checkBaseURL says why each is refused).
	BaseURL string `json:"base_url" yaml:"base_url" validate:"required,max=2048,url,startswith=http"`
	// Group names a gateway group: members share one budget and one pause.
	Group string `json:"group,omitempty" yaml:"group" validate:"omitempty,max=100,printascii"`
	// Limit per Window is the configured ceiling, in cost units (requests,
	// or the records each carries when items and proxied requests say their
	// cost): the most auditd will ever send in any window, whatever it
	// learns. Zero means the registry default.
	Limit  int      `json:"limit,omitempty" yaml:"limit" validate:"omitempty,min=1,max=1000000"`
	Window Duration `json:"window,omitempty" yaml:"window" validate:"omitempty"`
	// Rate is the token bucket's refill in cost units per second: the
	// sustained pace. Zero means Limit per Window.
	Rate float64 `json:"rate,omitempty" yaml:"rate" validate:"omitempty,gt=0,max=1000000"`
	// Burst is the token bucket's capacity: how many cost units may leave
	// back to back after an idle spell. It may exceed Limit; the window
	// still holds every Window to Limit.
	Burst int `json:"burst,omitempty" yaml:"burst" validate:"omitempty,min=1,max=100000"`
	// Count says what the server's own limits count, and so what auditd's
	// learned limits count: CountRequests (the default) or CountRecords
	// (cost units). The configured Limit, Rate and Burst always count cost
	// units.
	Count       CostUnit      `json:"count,omitempty" yaml:"count" validate:"omitempty,oneof=requests records"`
	Concurrency int           `json:"concurrency,omitempty" yaml:"concurrency" validate:"omitempty,min=1,max=1000"`
	RetryCap    Duration      `json:"retry_after_cap,omitempty" yaml:"retry_after_cap"`
	MaxAttempts int           `json:"max_attempts,omitempty" yaml:"max_attempts" validate:"omitempty,min=1,max=100"`
	Breaker     BreakerPolicy `json:"breaker,omitzero" yaml:"breaker"`
	Tier        string        `json:"tier,omitempty" yaml:"tier" validate:"omitempty,oneof=strict standard relaxed"`
	// BodyError is the rule that finds an error inside a 2xx body.
	BodyError BodyErrorRule `json:"body_error,omitempty" yaml:"body_error" validate:"omitempty,oneof=grants_gov arcgis none"`
	// Headers are added to every request (API keys). They are stored apart from
	// the ledger, never recorded, and redacted from API responses.
	// A value holding CR, LF or NUL is refused: no request could carry it.
	Headers map[string]string `json:"headers,omitempty" yaml:"headers" validate:"omitempty,max=20,dive,max=8192,excludesall=\r\n\x00"`
	// SecretQuery names query parameters whose values are credentials
	// beyond the built-in names (package redact); they are redacted before
	// an item is stored and from every recorded path.
	SecretQuery []string `json:"secret_query,omitempty" yaml:"secret_query" validate:"omitempty,max=20,dive,required,max=100"`
	// Query are query parameters (name and value) that auditd adds to
	// every request it proxies to the source: credentials passed in the
	// URL, kept in auditd rather than in pipeline code. Like Headers they
	// are stored apart from the ledger, never recorded and never shown;
	// their names are redacted from every recorded path.
	Query map[string]string `json:"query,omitempty" yaml:"query" validate:"omitempty,max=20"`
	// Proxy is how the proxy route treats the source's requests.
	Proxy ProxyPolicy `json:"proxy,omitzero" yaml:"proxy"`
}

// DefaultProxyDeadline is how long a proxied request may wait for
// admission and retries when neither its source nor the request says.
const DefaultProxyDeadline = 30 * time.Second

// ProxyPolicy is how the proxy route treats one source's requests.
type ProxyPolicy struct {
	// Deadline bounds a proxied request's waits and retries; a request may
	// ask for less or more with its Auditd-Deadline header. Default
	// DefaultProxyDeadline.
	Deadline Duration `json:"deadline,omitempty" yaml:"deadline"`
	// ServeStale answers a request that cannot be fetched by its deadline
	// (or whose source is down) with the last good copy, when there is one.
	ServeStale bool `json:"serve_stale,omitempty" yaml:"serve_stale"`
	// RetryPost retries a POST after a 429, 5xx or transport error even
	// without an Idempotency-Key (the source's POSTs are searches that
	// change nothing, as Grants.gov's search2).
	RetryPost bool `json:"retry_post,omitempty" yaml:"retry_post"`
	// KeyOnBody keys a POST sent without an Idempotency-Key by its body's
	// SHA-256, as a gateway that deduplicates batches by their document
	// hash does: the POST may be retried, and an attempt the upstream
	// refused is not charged beside its retry.
	KeyOnBody bool `json:"key_on_body,omitempty" yaml:"key_on_body"`
	// RewriteURLs rewrites the source's base URL, wherever a proxied text
	// response (XML, JSON, HTML) names it, into the source's proxy URL on
	// auditd, so that a client following the links a service document
	// names (OGC capabilities, ArcGIS service JSON, next links) stays on
	// the proxy. What is staged and hashed is the upstream's body. Nil
	// means true; false passes bodies through as sent.
	RewriteURLs *bool `json:"rewrite_urls,omitempty" yaml:"rewrite_urls"`
}

// Rewrites reports whether proxied responses have the source's URLs
// rewritten (RewriteURLs, default true).
func (p ProxyPolicy) Rewrites() bool { return p.RewriteURLs == nil || *p.RewriteURLs }

// BreakerPolicy configures a source's circuit breaker.
type BreakerPolicy struct {
	Threshold int      `json:"threshold,omitempty" yaml:"threshold" validate:"omitempty,min=1,max=1000"` // consecutive failures that open it
	Cooldown  Duration `json:"cooldown,omitempty" yaml:"cooldown"`                                       // open this long before a probe
	Probes    int      `json:"probes,omitempty" yaml:"probes" validate:"omitempty,min=1,max=100"`        // half-open probes allowed at once
}

// CostUnit is what a server's limits count.
type CostUnit string

// Cost units.
const (
	CountRequests CostUnit = "requests" // every request counts one, whatever it carries
	CountRecords  CostUnit = "records"  // a request counts its cost (the records it carries)
)

// BodyErrorRule names how a 2xx body is checked for an error.
type BodyErrorRule string

// Body error rules.
const (
	BodyErrorNone      BodyErrorRule = ""
	BodyErrorGrantsGov BodyErrorRule = "grants_gov" // {"errorcode": n} with n != 0
	BodyErrorArcGIS    BodyErrorRule = "arcgis"     // {"error": {"code": n}}
)

// Duration is a time.Duration that reads and writes as a Go duration string
// ("1m30s") in JSON and YAML.
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(time.Duration(d).String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return Errorf(EINVALID, "invalid duration %q", b)
	}
	if v < 0 {
		return Errorf(EINVALID, "negative duration %q", b)
	}
	*d = Duration(v)
	return nil
}
