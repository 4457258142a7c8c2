package sim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/auditd/auditd/clock"
)

// Defaults for the loopback servers Start runs.
const (
	DefaultHost              = "127.0.0.1"
	DefaultReadHeaderTimeout = 10 * time.Second
)

var (
	// ErrClosed is returned by Start after Close, and ends latency waits
	// that Close interrupts.
	ErrClosed = errors.New("sim: closed")
	// ErrStarted is returned by a second Start.
	ErrStarted = errors.New("sim: already started")
)

// Sim serves the upstreams of one scenario. Time, for limits, outages,
// latency and Date headers, is read from its clock and measured from New.
type Sim struct {
	// Host is the address Start listens on. Default DefaultHost.
	Host string

	clk       clock.Clock
	start     time.Time
	upstreams []*upstream // in scenario order
	byName    map[string]*upstream

	done      chan struct{} // closed by Close
	closeOnce sync.Once

	mu      sync.Mutex // guards servers
	servers []*http.Server
	wg      sync.WaitGroup // one per serving goroutine
}

// Stats counts what one upstream received and answered. Received is counted
// on arrival; the rest when the response (after any latency) is sent, so
// Received = sum(ByStatus) + Dropped + requests still in flight.
type Stats struct {
	Received int
	ByStatus map[int]int // responses sent, by status code
	Dropped  int         // connections closed without a response (outage drop, client gone, Close)
	// BodyErrors counts 200 responses whose body carried an error: the
	// configured body_errors, ArcGIS token errors and ArcGIS bad parameters.
	BodyErrors int
}

// upstream is one simulated server; it is the http.Handler Handler returns.
type upstream struct {
	cfg  Upstream
	sim  *Sim
	enf  *enforcer // nil: unlimited; shared by the upstreams of a group
	seed uint64    // scenario seed mixed with the name: content differs per upstream

	mu     sync.Mutex // guards the fields below
	seq    uint64     // requests received, numbering them for latency jitter
	passed int        // requests that reached the content stage (every-Nth body errors)
	stats  Stats
}

// New returns a simulator for sc on clk. It validates sc and fills its
// defaults in place, so a Scenario built in Go gets the same checks as a
// parsed one. Time zero for every offset in sc is clk.Now() at this call.
func New(sc *Scenario, clk clock.Clock) (*Sim, error) {
	if err := sc.check(nil); err != nil {
		return nil, err
	}
	s := &Sim{
		Host:   DefaultHost,
		clk:    clk,
		start:  clk.Now(),
		byName: make(map[string]*upstream, len(sc.Upstreams)),
		done:   make(chan struct{}),
	}
	groups := make(map[string]*enforcer, len(sc.Groups))
	for i := range sc.Groups {
		groups[sc.Groups[i].Name] = newEnforcer(&sc.Groups[i].Limit)
	}
	for _, cfg := range sc.Upstreams {
		u := &upstream{
			cfg:   cfg,
			sim:   s,
			enf:   newEnforcer(cfg.Limit),
			seed:  mix(uint64(sc.Seed) ^ hashName(cfg.Name)),
			stats: Stats{ByStatus: make(map[int]int)},
		}
		if cfg.Group != "" {
			u.enf = groups[cfg.Group]
		}
		s.upstreams = append(s.upstreams, u)
		s.byName[cfg.Name] = u
	}
	return s, nil
}

// Upstreams returns the upstream names in scenario order.
func (s *Sim) Upstreams() []string {
	names := make([]string, len(s.upstreams))
	for i, u := range s.upstreams {
		names[i] = u.cfg.Name
	}
	return names
}

// Handler returns the handler of the named upstream, for httptest.NewServer.
// Give each upstream its own server: a client tells hostnames apart by
// host:port. It panics when the scenario has no such upstream, as the names
// come from the scenario the caller wrote.
func (s *Sim) Handler(name string) http.Handler { return s.upstream(name) }

// Path returns the named upstream's configured path, for building its base
// URL from an httptest server's URL. It panics like Handler.
func (s *Sim) Path(name string) string { return s.upstream(name).cfg.Path }

// Stats returns a snapshot of what the named upstream received. It panics
// like Handler.
func (s *Sim) Stats(name string) Stats {
	u := s.upstream(name)
	u.mu.Lock()
	defer u.mu.Unlock()
	st := u.stats
	st.ByStatus = make(map[int]int, len(u.stats.ByStatus))
	for code, n := range u.stats.ByStatus {
		st.ByStatus[code] = n
	}
	return st
}

func (s *Sim) upstream(name string) *upstream {
	u, ok := s.byName[name]
	if !ok {
		panic(fmt.Sprintf("sim: the scenario has no upstream %q", name))
	}
	return u
}

// Start serves every upstream on its own loopback listener (Host and the
// upstream's port, or a free one) and returns each upstream's base URL by
// name. The servers run until Close.
func (s *Sim) Start(ctx context.Context) (map[string]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	select {
	case <-s.done:
		return nil, ErrClosed
	default:
	}
	if s.servers != nil {
		return nil, ErrStarted
	}
	var lc net.ListenConfig
	listeners := make([]net.Listener, 0, len(s.upstreams))
	for _, u := range s.upstreams {
		ln, err := lc.Listen(ctx, "tcp", net.JoinHostPort(s.Host, strconv.Itoa(u.cfg.Port)))
		if err != nil {
			for _, l := range listeners {
				l.Close()
			}
			return nil, fmt.Errorf("listen for upstream %s: %w", u.cfg.Name, err)
		}
		listeners = append(listeners, ln)
	}
	urls := make(map[string]string, len(s.upstreams))
	for i, u := range s.upstreams {
		srv := &http.Server{Handler: u, ReadHeaderTimeout: DefaultReadHeaderTimeout}
		s.servers = append(s.servers, srv)
		ln := listeners[i]
		urls[u.cfg.Name] = "http://" + ln.Addr().String() + u.cfg.Path
		s.wg.Go(func() { srv.Serve(ln) }) // returns ErrServerClosed after Shutdown
	}
	return urls, nil
}

// Close ends every latency wait (those requests are dropped), shuts the
// servers down gracefully until ctx ends and then forcibly, and waits for
// their goroutines.
func (s *Sim) Close(ctx context.Context) error {
	s.closeOnce.Do(func() { close(s.done) })
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, srv := range s.servers {
		if err := srv.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			srv.Close()
		}
	}
	s.wg.Wait()
	return errors.Join(errs...)
}

// sleep waits d on the simulator's clock. It fails when the request's
// context ends (the client went away) or the simulator closes.
func (s *Sim) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.done:
		return ErrClosed
	}
}

// reply is a decided response. A reply with drop set closes the connection.
type reply struct {
	status    int
	header    http.Header
	body      []byte
	drop      bool
	bodyError bool
}

// ServeHTTP decides the response at arrival, as of the clock then, waits the
// latency, and sends it. The order of checks is a gateway's: a dropping
// outage first (the network), then the credential, then the limit, then a
// failing backend, then body errors, then content.
func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := u.sim.clk.Now()
	u.mu.Lock()
	u.seq++
	seq := u.seq
	u.stats.Received++
	u.mu.Unlock()

	rep := u.decide(r, now)
	if err := u.sim.sleep(r.Context(), u.latency(seq)); err != nil {
		rep = reply{drop: true}
	}

	u.mu.Lock()
	switch {
	case rep.drop:
		u.stats.Dropped++
	default:
		u.stats.ByStatus[rep.status]++
		if rep.bodyError {
			u.stats.BodyErrors++
		}
	}
	u.mu.Unlock()

	if rep.drop {
		// net/http closes the connection without a response and without
		// logging: the client sees a transport error.
		panic(http.ErrAbortHandler)
	}
	h := w.Header()
	maps.Copy(h, rep.header)
	h.Set("Content-Length", strconv.Itoa(len(rep.body)))
	w.WriteHeader(rep.status)
	w.Write(rep.body)
}

func (u *upstream) decide(r *http.Request, now time.Time) reply {
	at := max(0, now.Sub(u.sim.start))
	out := u.outage(at)
	if out != nil && out.Drop {
		return reply{drop: true}
	}
	// The upstream's own idea of the time, which DateSkew may put wrong.
	local := now.Add(u.cfg.DateSkew).UTC()
	h := http.Header{"Date": {local.Format(http.TimeFormat)}}

	if rh := u.cfg.RequiredHeader; rh != nil {
		got := r.Header.Values(rh.Name)
		if len(got) != 1 || got[0] != rh.Value {
			return unauthorized(h, rh.Status, len(got) == 0)
		}
	}
	if u.enf != nil {
		v := u.enf.admit(at)
		advertise(h, u.cfg.Reject.Advertise, v, local)
		if !v.ok {
			return reject(h, u.cfg.Reject, v, local)
		}
	}
	if out != nil {
		return textReply(h, out.Status)
	}
	if be := u.bodyError(at); be != nil {
		return bodyErrorReply(h, be.Style, be.Code, be.Message)
	}
	if u.cfg.Collection != nil {
		return u.page(r, h)
	}
	return u.plain(r, h)
}

// outage returns the outage in force at offset at, if any.
func (u *upstream) outage(at time.Duration) *Outage {
	for i := range u.cfg.Outages {
		if o := &u.cfg.Outages[i]; o.From <= at && at < o.To {
			return o
		}
	}
	return nil
}

// bodyError counts a request that reached the content stage and returns the
// body error it gets, if any.
func (u *upstream) bodyError(at time.Duration) *BodyError {
	u.mu.Lock()
	u.passed++
	n := u.passed
	u.mu.Unlock()
	for i := range u.cfg.BodyErrors {
		b := &u.cfg.BodyErrors[i]
		if b.To != 0 && (at < b.From || at >= b.To) {
			continue
		}
		if b.Every == 0 || n%b.Every == 0 {
			return b
		}
	}
	return nil
}

// latency is the delay of request number seq: fixed plus a jitter drawn from
// the seed and seq, so a rerun waits the same.
func (u *upstream) latency(seq uint64) time.Duration {
	l := u.cfg.Latency
	if l.Jitter <= 0 {
		return l.Fixed
	}
	return l.Fixed + time.Duration(mix(u.seed^mix(seq))%uint64(l.Jitter))
}

// mix is splitmix64's finalizer: a bijection that spreads seeds and indexes
// into well-mixed bits without carrying any generator state.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

func hashName(name string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return h.Sum64()
}
