package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"slices"
	"time"

	"gopkg.in/yaml.v3"
)

// Scenario defaults and bounds. The bounds keep the enforcers' integer
// arithmetic far from overflow and a hostile file from asking for gigabytes.
const (
	DefaultWindow       = time.Second
	DefaultRejectStatus = 429
	DefaultOutageStatus = 503
	DefaultAuthStatus   = 401
	DefaultMaxPage      = 1000

	MaxRequests      = 1_000_000
	MaxBurst         = 100_000
	MaxWindow        = 24 * time.Hour
	MinWindow        = time.Millisecond
	MaxUpstreams     = 256
	MaxRecords       = 1_000_000
	MaxPage          = 100_000
	MaxResponseBytes = 16 << 20
	MaxLatency       = 10 * time.Minute
	MaxDateSkew      = 24 * time.Hour
	MaxRetryAfter    = 7 * 24 * time.Hour // retry_after_fixed: a week is absurd enough
)

// Shape is how a hidden limit counts requests.
type Shape string

// Shapes. The exact number of requests each admits is in the package doc.
const (
	ShapeLeakyBucket   Shape = "leaky_bucket"
	ShapeFixedWindow   Shape = "fixed_window"
	ShapeSlidingWindow Shape = "sliding_window"
	ShapeTokenBucket   Shape = "token_bucket"
	ShapeNone          Shape = "none"
)

// RetryAfterForm is how a rejection writes its Retry-After header.
type RetryAfterForm string

// Retry-After forms (RFC 9110 section 10.2.3 allows delta-seconds and
// HTTP-date; HTTP-date has three historical spellings a client must read).
const (
	RetryAfterDelta      RetryAfterForm = "delta"       // "30"
	RetryAfterIMFFixdate RetryAfterForm = "imf_fixdate" // "Thu, 01 Jan 2026 00:00:30 GMT"
	RetryAfterRFC850     RetryAfterForm = "rfc850"      // "Thursday, 01-Jan-26 00:00:30 GMT"
	RetryAfterASCTime    RetryAfterForm = "asctime"     // "Thu Jan  1 00:00:30 2026"
	RetryAfterNone       RetryAfterForm = "none"        // header absent
)

// Advertise is which rate-limit headers an upstream sends with every
// response that passed its limiter.
type Advertise string

// Advertised header sets.
const (
	AdvertiseNone      Advertise = "none"
	AdvertiseXRate     Advertise = "x_ratelimit"      // X-RateLimit-Limit/-Remaining/-Reset, reset in seconds
	AdvertiseXRateUnix Advertise = "x_ratelimit_unix" // the same, reset as a unix timestamp
	AdvertiseIETF      Advertise = "ietf"             // RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers)
)

// BodyStyle is the dialect of an error carried inside a 200 body.
type BodyStyle string

// Body error styles.
const (
	BodyGrantsGov BodyStyle = "grants_gov" // {"errorcode": 1, "msg": "..."}
	BodyArcGIS    BodyStyle = "arcgis"     // {"error": {"code": 498, "message": "..."}}
)

// CollectionKind is the paging protocol of a collection.
type CollectionKind string

// Collection kinds.
const (
	CollectionArcGIS    CollectionKind = "arcgis"     // FeatureServer query: resultOffset, resultRecordCount
	CollectionWFS       CollectionKind = "wfs"        // WFS 2.0 GetFeature as GeoJSON: startIndex, count
	CollectionGrantsGov CollectionKind = "grants_gov" // search2: POST JSON startRecordNum, rows
)

// Scenario is a set of simulated upstreams. Build one with ParseScenario or
// LoadScenario, or in Go; New validates it either way.
type Scenario struct {
	Name        string `yaml:"name"`
	Description string `yaml:"description"`
	// Seed makes generated content (collections, padding, jitter)
	// reproducible: the same seed gives byte-identical payloads.
	Seed      int64      `yaml:"seed"`
	Groups    []Group    `yaml:"groups"`
	Upstreams []Upstream `yaml:"upstreams"`
}

// Group is a shared gateway: every upstream naming it draws on one enforcer.
type Group struct {
	Name  string `yaml:"name"`
	Limit Limit  `yaml:"limit"`
}

// Upstream is one simulated server: its own listener, so its own hostname as
// far as a client can tell.
type Upstream struct {
	Name string `yaml:"name"`
	// Group names the shared gateway whose limit this upstream obeys. An
	// upstream has a Group or its own Limit, not both; neither means unlimited.
	Group string `yaml:"group"`
	Limit *Limit `yaml:"limit"`
	// Path is appended to the printed base URL so URLs look like the real
	// service's; the simulator answers every path the same way.
	Path string `yaml:"path"`
	// Port pins the loopback port in Start; 0 picks a free one.
	Port   int    `yaml:"port"`
	Reject Reject `yaml:"reject"`
	// DateSkew shifts the upstream's clock as seen in Date, HTTP-date
	// Retry-After values and unix resets, to exercise clock skew.
	DateSkew       time.Duration   `yaml:"date_skew"`
	Outages        []Outage        `yaml:"outages"`
	BodyErrors     []BodyError     `yaml:"body_errors"`
	Collection     *Collection     `yaml:"collection"`
	Latency        Latency         `yaml:"latency"`
	ResponseBytes  int             `yaml:"response_bytes"`
	RequiredHeader *RequiredHeader `yaml:"required_header"`
}

// Limit is a hidden limit: Requests per Window, counted the way Shape says.
type Limit struct {
	Shape    Shape         `yaml:"shape"`
	Requests int           `yaml:"requests"`
	Window   time.Duration `yaml:"window"` // default DefaultWindow
	// Burst is the leaky bucket's nginx burst (default 0) or the token
	// bucket's capacity (default Requests). Other shapes have none.
	Burst   int      `yaml:"burst"`
	Changes []Change `yaml:"changes"`
}

// Change replaces a limit's numbers After the simulator started. Window and
// Burst keep their previous values when omitted.
type Change struct {
	After    time.Duration  `yaml:"after"`
	Requests int            `yaml:"requests"`
	Window   *time.Duration `yaml:"window"`
	Burst    *int           `yaml:"burst"`
}

// Reject is what a request over the limit gets back.
type Reject struct {
	Status     int            `yaml:"status"`      // 429 (default) or 503
	RetryAfter RetryAfterForm `yaml:"retry_after"` // default delta
	// RetryAfterFixed, when set, is sent instead of the true wait: a gateway
	// whose hint is wrong (Retry-After: 86400, or always 1).
	RetryAfterFixed time.Duration `yaml:"retry_after_fixed"`
	Advertise       Advertise     `yaml:"advertise"` // default none
}

// Outage makes the upstream fail during [From, To) after the start: answer
// Status (500, 502 or 503; default 503) or, with Drop, close the connection
// without a response.
type Outage struct {
	From   time.Duration `yaml:"from"`
	To     time.Duration `yaml:"to"`
	Status int           `yaml:"status"`
	Drop   bool          `yaml:"drop"`
}

// BodyError puts an error inside a 200 body: on every Every-th request that
// would have succeeded, or on all of them during [From, To), or on every
// Every-th during [From, To) when both are given.
type BodyError struct {
	Style   BodyStyle     `yaml:"style"`
	Every   int           `yaml:"every"`
	From    time.Duration `yaml:"from"`
	To      time.Duration `yaml:"to"`
	Code    int           `yaml:"code"`    // default 1 (grants_gov) or 498 (arcgis)
	Message string        `yaml:"message"` // default per style
}

// Collection is a paged data set generated from the scenario seed.
type Collection struct {
	Kind    CollectionKind `yaml:"kind"`
	Records int            `yaml:"records"`
	// MaxPage caps one page (ArcGIS maxRecordCount); it is also the page
	// size when a request does not ask for one. Default DefaultMaxPage.
	MaxPage int    `yaml:"max_page"`
	Layer   string `yaml:"layer"` // default the upstream's name
}

// Latency delays every response by Fixed plus a deterministic pseudo-random
// part in [0, Jitter), measured on the simulator's clock.
type Latency struct {
	Fixed  time.Duration `yaml:"fixed"`
	Jitter time.Duration `yaml:"jitter"`
}

// RequiredHeader is a credential the upstream insists on. A request without
// it, or with another value, gets Status: 401 (default) or 403, or with 498
// the ArcGIS form, a 200 whose body says {"error":{"code":499}} when the
// header is missing and 498 when it is wrong.
type RequiredHeader struct {
	Name   string `yaml:"name"`
	Value  string `yaml:"value"`
	Status int    `yaml:"status"`
}

// LoadScenario reads and parses the scenario file at path.
func LoadScenario(path string) (*Scenario, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load scenario: %w", err)
	}
	sc, err := ParseScenario(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// ParseScenario parses and validates a YAML scenario. Unknown fields, values
// of the wrong type and values out of range are *ScenarioError naming the
// line and field. Omitted settings are filled with their defaults.
func ParseScenario(data []byte) (*Scenario, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
		return nil, &ScenarioError{Msg: "empty file"}
	} else if err != nil {
		return nil, &ScenarioError{Msg: err.Error()}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, &ScenarioError{Line: extra.Line, Msg: "want one YAML document"}
	}
	if len(doc.Content) != 1 {
		return nil, &ScenarioError{Line: doc.Line, Msg: "want one YAML document"}
	}
	d := decoder{lines: make(map[string]int)}
	var sc Scenario
	if err := d.decode(doc.Content[0], "", reflect.ValueOf(&sc).Elem()); err != nil {
		return nil, err
	}
	if err := sc.check(d.lines); err != nil {
		return nil, err
	}
	return &sc, nil
}

// PerSecond is the sustained rate l admits, in requests per second, before
// any Change: Requests / Window for every shape but none (0, no limit).
// Burst adds a one-off allowance on top; see the package doc.
func (l Limit) PerSecond() float64 {
	if l.Shape == ShapeNone || l.Window <= 0 {
		return 0
	}
	return float64(l.Requests) / l.Window.Seconds()
}

var namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$`)

// headerToken matches an HTTP field name (RFC 9110 token).
var headerToken = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// checker validates a decoded scenario and fills its defaults. lines maps
// field paths to the lines the decoder found them on (nil for a scenario
// built in Go).
type checker struct {
	lines map[string]int
}

// errorf returns a *ScenarioError for path, on the line of path or of its
// nearest recorded parent.
func (c checker) errorf(path, format string, args ...any) error {
	line := 0
	for p := path; p != "" && line == 0; p = parent(p) {
		line = c.lines[p]
	}
	return &ScenarioError{Line: line, Field: path, Msg: fmt.Sprintf(format, args...)}
}

// parent strips the last element of a field path: a.b[2].c -> a.b[2] -> a.b.
func parent(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '.' || p[i] == '[' {
			return p[:i]
		}
	}
	return ""
}

func (sc *Scenario) check(lines map[string]int) error {
	c := checker{lines: lines}
	if len(sc.Upstreams) == 0 {
		return c.errorf("upstreams", "want at least one upstream")
	} else if len(sc.Upstreams) > MaxUpstreams {
		return c.errorf("upstreams", "at most %d upstreams", MaxUpstreams)
	}
	groups := make(map[string]bool, len(sc.Groups))
	for i := range sc.Groups {
		g := &sc.Groups[i]
		p := fmt.Sprintf("groups[%d]", i)
		if !namePattern.MatchString(g.Name) {
			return c.errorf(p+".name", "want 1-64 letters, digits, '.', '_' or '-', got %q", g.Name)
		} else if groups[g.Name] {
			return c.errorf(p+".name", "group %q defined twice", g.Name)
		}
		groups[g.Name] = false
		if err := c.limit(p+".limit", &g.Limit); err != nil {
			return err
		}
	}
	names := make(map[string]bool, len(sc.Upstreams))
	ports := make(map[int]bool)
	for i := range sc.Upstreams {
		u := &sc.Upstreams[i]
		p := fmt.Sprintf("upstreams[%d]", i)
		if !namePattern.MatchString(u.Name) {
			return c.errorf(p+".name", "want 1-64 letters, digits, '.', '_' or '-', got %q", u.Name)
		} else if names[u.Name] {
			return c.errorf(p+".name", "upstream %q defined twice", u.Name)
		}
		names[u.Name] = true
		if u.Group != "" {
			if _, ok := groups[u.Group]; !ok {
				return c.errorf(p+".group", "no group named %q", u.Group)
			} else if u.Limit != nil {
				return c.errorf(p+".limit", "an upstream in a group obeys the group's limit; remove one of them")
			}
			groups[u.Group] = true
		}
		if u.Port < 0 || u.Port > 65535 {
			return c.errorf(p+".port", "want 0-65535, got %d", u.Port)
		} else if u.Port != 0 && ports[u.Port] {
			return c.errorf(p+".port", "port %d used twice", u.Port)
		}
		ports[u.Port] = true
		if err := c.upstream(p, u); err != nil {
			return err
		}
	}
	for i, g := range sc.Groups {
		if !groups[g.Name] {
			return c.errorf(fmt.Sprintf("groups[%d].name", i), "no upstream is in group %q", g.Name)
		}
	}
	return nil
}

func (c checker) limit(p string, l *Limit) error {
	switch l.Shape {
	case ShapeNone:
		if l.Requests != 0 || l.Burst != 0 || len(l.Changes) != 0 {
			return c.errorf(p+".shape", "shape none takes no requests, burst or changes")
		}
		return nil
	case ShapeLeakyBucket, ShapeTokenBucket, ShapeFixedWindow, ShapeSlidingWindow:
	case "":
		return c.errorf(p+".shape", "missing (want leaky_bucket, fixed_window, sliding_window, token_bucket or none)")
	default:
		return c.errorf(p+".shape", "unknown shape %q (want leaky_bucket, fixed_window, sliding_window, token_bucket or none)", l.Shape)
	}
	if l.Window == 0 {
		l.Window = DefaultWindow
	}
	if l.Shape == ShapeTokenBucket && l.Burst == 0 {
		l.Burst = l.Requests
	}
	if err := c.numbers(p, l.Shape, l.Requests, l.Window, l.Burst); err != nil {
		return err
	}
	window, burst := l.Window, l.Burst
	var after time.Duration
	for i, ch := range l.Changes {
		cp := fmt.Sprintf("%s.changes[%d]", p, i)
		if ch.After <= after {
			return c.errorf(cp+".after", "want a time after the start and after the previous change, got %s", ch.After)
		}
		after = ch.After
		if ch.Window != nil {
			window = *ch.Window
		}
		if ch.Burst != nil {
			burst = *ch.Burst
		}
		if err := c.numbers(cp, l.Shape, ch.Requests, window, burst); err != nil {
			return err
		}
	}
	return nil
}

// numbers checks one set of a limit's numbers; p is the path owning them.
func (c checker) numbers(p string, shape Shape, requests int, window time.Duration, burst int) error {
	if requests < 1 || requests > MaxRequests {
		return c.errorf(p+".requests", "want 1-%d, got %d", MaxRequests, requests)
	} else if window < MinWindow || window > MaxWindow {
		return c.errorf(p+".window", "want %s to %s, got %s", MinWindow, MaxWindow, window)
	} else if burst < 0 || burst > MaxBurst {
		return c.errorf(p+".burst", "want 0-%d, got %d", MaxBurst, burst)
	}
	switch shape {
	case ShapeTokenBucket:
		if burst < 1 {
			return c.errorf(p+".burst", "a token bucket holds at least 1 token")
		}
	case ShapeFixedWindow, ShapeSlidingWindow:
		if burst != 0 {
			return c.errorf(p+".burst", "burst applies to leaky_bucket and token_bucket only")
		}
	}
	return nil
}

func (c checker) upstream(p string, u *Upstream) error {
	if u.Path != "" && u.Path[0] != '/' {
		return c.errorf(p+".path", "want a path starting with /, got %q", u.Path)
	}
	if u.Limit != nil {
		if err := c.limit(p+".limit", u.Limit); err != nil {
			return err
		}
	}
	if err := c.reject(p+".reject", &u.Reject); err != nil {
		return err
	}
	if u.DateSkew < -MaxDateSkew || u.DateSkew > MaxDateSkew {
		return c.errorf(p+".date_skew", "want within ±%s, got %s", MaxDateSkew, u.DateSkew)
	}
	for i := range u.Outages {
		if err := c.outage(fmt.Sprintf("%s.outages[%d]", p, i), &u.Outages[i]); err != nil {
			return err
		}
	}
	for i := range u.BodyErrors {
		if err := c.bodyError(fmt.Sprintf("%s.body_errors[%d]", p, i), &u.BodyErrors[i]); err != nil {
			return err
		}
	}
	if u.Collection != nil {
		if err := c.collection(p+".collection", u.Collection, u.Name); err != nil {
			return err
		}
	}
	if u.Latency.Fixed < 0 || u.Latency.Fixed > MaxLatency {
		return c.errorf(p+".latency.fixed", "want 0 to %s, got %s", MaxLatency, u.Latency.Fixed)
	} else if u.Latency.Jitter < 0 || u.Latency.Jitter > MaxLatency {
		return c.errorf(p+".latency.jitter", "want 0 to %s, got %s", MaxLatency, u.Latency.Jitter)
	}
	if u.ResponseBytes < 0 || u.ResponseBytes > MaxResponseBytes {
		return c.errorf(p+".response_bytes", "want 0-%d, got %d", MaxResponseBytes, u.ResponseBytes)
	}
	if h := u.RequiredHeader; h != nil {
		hp := p + ".required_header"
		if !headerToken.MatchString(h.Name) {
			return c.errorf(hp+".name", "want an HTTP header name, got %q", h.Name)
		} else if h.Value == "" {
			return c.errorf(hp+".value", "missing")
		}
		if h.Status == 0 {
			h.Status = DefaultAuthStatus
		}
		if !slices.Contains([]int{401, 403, 498}, h.Status) {
			return c.errorf(hp+".status", "want 401, 403 or 498 (ArcGIS token error in a 200 body), got %d", h.Status)
		}
	}
	return nil
}

func (c checker) reject(p string, r *Reject) error {
	if r.Status == 0 {
		r.Status = DefaultRejectStatus
	}
	if r.RetryAfter == "" {
		r.RetryAfter = RetryAfterDelta
	}
	if r.Advertise == "" {
		r.Advertise = AdvertiseNone
	}
	if r.Status != 429 && r.Status != 503 {
		return c.errorf(p+".status", "want 429 or 503, got %d", r.Status)
	}
	switch r.RetryAfter {
	case RetryAfterDelta, RetryAfterIMFFixdate, RetryAfterRFC850, RetryAfterASCTime, RetryAfterNone:
	default:
		return c.errorf(p+".retry_after", "unknown form %q (want delta, imf_fixdate, rfc850, asctime or none)", r.RetryAfter)
	}
	if r.RetryAfterFixed < 0 || r.RetryAfterFixed > MaxRetryAfter {
		return c.errorf(p+".retry_after_fixed", "want 0 to %s, got %s", MaxRetryAfter, r.RetryAfterFixed)
	} else if r.RetryAfterFixed > 0 && r.RetryAfter == RetryAfterNone {
		return c.errorf(p+".retry_after_fixed", "set, but retry_after is none")
	}
	switch r.Advertise {
	case AdvertiseNone, AdvertiseXRate, AdvertiseXRateUnix, AdvertiseIETF:
	default:
		return c.errorf(p+".advertise", "unknown header set %q (want none, x_ratelimit, x_ratelimit_unix or ietf)", r.Advertise)
	}
	return nil
}

func (c checker) outage(p string, o *Outage) error {
	if o.From < 0 {
		return c.errorf(p+".from", "want a time after the start, got %s", o.From)
	} else if o.To <= o.From {
		return c.errorf(p+".to", "want a time after from (%s), got %s", o.From, o.To)
	}
	if o.Drop {
		if o.Status != 0 {
			return c.errorf(p+".status", "a dropped connection has no status; remove one of status and drop")
		}
		return nil
	}
	if o.Status == 0 {
		o.Status = DefaultOutageStatus
	}
	if o.Status != 500 && o.Status != 502 && o.Status != 503 {
		return c.errorf(p+".status", "want 500, 502 or 503, got %d", o.Status)
	}
	return nil
}

func (c checker) bodyError(p string, b *BodyError) error {
	switch b.Style {
	case BodyGrantsGov:
		if b.Code == 0 {
			b.Code = 1
		}
		if b.Message == "" {
			b.Message = "Webservice failed: search is temporarily unavailable"
		}
	case BodyArcGIS:
		if b.Code == 0 {
			b.Code = 498
		}
		if b.Message == "" {
			b.Message = "Invalid token."
		}
	case "":
		return c.errorf(p+".style", "missing (want grants_gov or arcgis)")
	default:
		return c.errorf(p+".style", "unknown style %q (want grants_gov or arcgis)", b.Style)
	}
	if b.Every < 0 {
		return c.errorf(p+".every", "want a positive count, got %d", b.Every)
	} else if b.From < 0 {
		return c.errorf(p+".from", "want a time after the start, got %s", b.From)
	} else if b.To != 0 && b.To <= b.From {
		return c.errorf(p+".to", "want a time after from (%s), got %s", b.From, b.To)
	} else if b.Every == 0 && b.To == 0 {
		return c.errorf(p+".every", "give every, or a period with from and to, or both")
	}
	return nil
}

func (c checker) collection(p string, col *Collection, upstream string) error {
	switch col.Kind {
	case CollectionArcGIS, CollectionWFS, CollectionGrantsGov:
	case "":
		return c.errorf(p+".kind", "missing (want arcgis, wfs or grants_gov)")
	default:
		return c.errorf(p+".kind", "unknown kind %q (want arcgis, wfs or grants_gov)", col.Kind)
	}
	if col.MaxPage == 0 {
		col.MaxPage = DefaultMaxPage
	}
	if col.Layer == "" {
		col.Layer = upstream
	}
	if col.Records < 0 || col.Records > MaxRecords {
		return c.errorf(p+".records", "want 0-%d, got %d", MaxRecords, col.Records)
	} else if col.MaxPage < 1 || col.MaxPage > MaxPage {
		return c.errorf(p+".max_page", "want 1-%d, got %d", MaxPage, col.MaxPage)
	} else if !namePattern.MatchString(col.Layer) {
		return c.errorf(p+".layer", "want 1-64 letters, digits, '.', '_' or '-', got %q", col.Layer)
	}
	return nil
}
