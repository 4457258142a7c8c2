package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/fleetlog"
	"github.com/auditd/auditd/hints"
	"github.com/auditd/auditd/limiter"
	"github.com/auditd/auditd/registry"
)

// fleetOptions are serve's fleet flags (or the config file's fleet:
// section). Without endpoints the node runs alone, with no etcd.
type fleetOptions struct {
	Etcd []string `yaml:"etcd"` // etcd client URLs
	Node string   `yaml:"node"` // this node's name in its fleet events
	// Lag is the most a request's time on the wire may trail the slot it
	// was handed (the dispatch record's commit, the connection): slots are
	// spaced to absorb it, as they absorb clock skew, and a request whose
	// dispatch record commits later is not sent (fetch). Default
	// defaultFleetLag.
	Lag time.Duration `yaml:"lag"`
	// Advertise is the URL the other nodes reach this node's API at, for
	// their calls about fleet runs; default the listen address, which must
	// then be one they can reach (advertiseURL).
	Advertise string `yaml:"advertise"`
}

// check refuses fleet options that name no fleet or a bad one: a node
// name, an advertised URL or a lag without etcd endpoints (the node would
// run alone beside a fleet that counts on it), endpoints without a valid
// node name, a negative lag. serve checks them before it creates anything.
func (o fleetOptions) check() error {
	if len(o.Etcd) == 0 {
		var given []string
		for name, set := range map[string]bool{"--node": o.Node != "", "--fleet-advertise": o.Advertise != "", "--fleet-lag": o.Lag != 0} {
			if set {
				given = append(given, name)
			}
		}
		if len(given) > 0 {
			slices.Sort(given)
			return fmt.Errorf("fleet: %s without --fleet-etcd (fleet.etcd): a node that never joined must not run as if alone", strings.Join(given, ", "))
		}
		return nil
	}
	if o.Node == "" {
		return errors.New("fleet: --node is required with --fleet-etcd")
	}
	if !validNodeName(o.Node) {
		return fmt.Errorf("fleet: --node %q: want 1 to 64 letters, digits, '.', '_' or '-'", o.Node)
	}
	if o.Lag < 0 {
		return fmt.Errorf("fleet: --fleet-lag %v: want a duration of 0 or more", o.Lag)
	}
	return nil
}

// checkNodeName refuses a node name the fleet log knows under another
// ledger key: another node holds it (a second node started under a name in
// use would take over its published address and its etcd keys), or this
// node's data directory was replaced, which the fleet log could never
// accept posts from under that name.
func checkNodeName(ctx context.Context, client *clientv3.Client, node, key string) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	held, ok, err := fleetlog.New(client, fleetlog.Config{}).NodeKey(ctx, node)
	if err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	if ok && held != key {
		return fmt.Errorf("fleet: --node %s is taken in this fleet by a ledger whose key is %s (this node's is %s): choose another name; a node whose data directory was replaced joins under a new one", node, held, key)
	}
	return nil
}

// advertiseURL returns the API base URL a node publishes to the fleet:
// advertise when set (an http or https URL naming a host), else listen,
// the listener's own URL. A listener on every address (0.0.0.0, ::) names
// no host another node could reach, and is refused without advertise; so
// is a loopback one when some etcd endpoint is not on loopback (the fleet
// spans machines, and a peer's call to it would reach the caller itself).
func advertiseURL(advertise, listen string, etcd []string) (string, error) {
	if advertise != "" {
		u, err := url.Parse(advertise)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || unspecifiedHost(u.Hostname()) ||
			(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return "", fmt.Errorf("fleet: --fleet-advertise %q: want the http or https URL of this node's API, such as http://east-1.internal:8080", advertise)
		}
		return strings.TrimSuffix(advertise, "/"), nil
	}
	u, err := url.Parse(listen)
	if err != nil {
		return "", fmt.Errorf("fleet: listen address %q: %w", listen, err)
	}
	if unspecifiedHost(u.Hostname()) {
		return "", fmt.Errorf("fleet: the API listens on every address (%s): set --fleet-advertise (fleet.advertise) to the URL the other nodes reach it at", u.Host)
	}
	if loopbackHost(u.Hostname()) && !slices.ContainsFunc(etcd, func(e string) bool { return loopbackHost(endpointHost(e)) }) {
		return "", fmt.Errorf("fleet: the API listens on loopback (%s) and etcd is elsewhere: set --fleet-advertise (fleet.advertise) to the URL the other nodes reach this node at", u.Host)
	}
	return listen, nil
}

// unspecifiedHost reports whether h is the unspecified address (0.0.0.0,
// ::) or empty.
func unspecifiedHost(h string) bool {
	ip := net.ParseIP(h)
	return h == "" || (ip != nil && ip.IsUnspecified())
}

// loopbackHost reports whether h is localhost or a loopback address.
func loopbackHost(h string) bool {
	ip := net.ParseIP(h)
	return h == "localhost" || (ip != nil && ip.IsLoopback())
}

// endpointHost is the host of an etcd endpoint, a URL or a bare host:port.
func endpointHost(e string) string {
	if u, err := url.Parse(e); err == nil && u.Host != "" {
		return u.Hostname()
	}
	if h, _, err := net.SplitHostPort(e); err == nil {
		return h
	}
	return e
}

// defaultFleetLag covers most dispatch-record commits of a busy ledger;
// a request whose commit takes longer is not sent but takes a new slot.
// With the default grace (20ms) and skew (10ms) it spaces a second's slots
// for 93.5% of its limit.
const defaultFleetLag = 40 * time.Millisecond

// fleetResync is how often the node looks for sources added, changed or
// removed, to share their budgets.
const fleetResync = time.Second

// fleetNode shares the budget of every source (or gateway group) through
// etcd: per key it keeps a fleet.Slots at the budget's ceiling, attached to
// the limiter (limiter.Share), and writes every grant, pause, cut-off and
// rejoin it acts on to the ledger.
type fleetNode struct {
	node   string
	lag    time.Duration
	client *clientv3.Client
	store  *fleet.Store
	lim    *limiter.Limiter
	reg    *registry.Registry
	led    auditd.Appender
	log    *slog.Logger

	mu     sync.Mutex
	shares map[string]*fleetShare // by key
	// groups are the keys known to be gateway groups', kept after their
	// share goes: what a share writes as it closes (a pause on its way)
	// is recorded after it is gone.
	groups map[string]bool
	queue  []fleet.Event // events for the ledger, in order
	// writing is held while queued events are written, so that two
	// writers (run, and notify of a grant) keep their order.
	writing sync.Mutex
	wake    chan struct{}
	cancel  context.CancelFunc
	done    chan struct{}
}

// fleetShare is one key's Slots with the rate it was made at, a member
// source whose budget is the key's, and the lag allowance its slots are
// spaced for.
type fleetShare struct {
	*fleet.Slots
	rate   fleet.Rate
	member string // read and written under fleetNode.mu: sync refreshes it
	group  bool   // the key is a gateway group's, member one of its sources
	node   string // this node's name
	lag    time.Duration
	told   bool // the operator told the rate: learning starts at it
	// learning is the key's learned rate on this node, which its slots
	// are reserved at.
	learning *fleetLearning
}

// SetByHand makes an operator's limit the fleet's (limiter.Learner).
func (s *fleetShare) SetByHand(limit int, window time.Duration) {
	s.learning.setByHand(fleet.Rate{Limit: limit, Window: window})
}

// Observed tells the key's learning of a response (limiter.Learner): the
// fleet, not this node alone, learns the key's rate.
func (s *fleetShare) Observed(admitted time.Time, c limiter.Class, h hints.Hint) {
	s.learning.observed(admitted, c, h)
}

// Lag is how long after a slot is taken its request may still leave
// (limiter.Shared): the node's lag allowance. A request whose dispatch
// record commits later is not sent (fetch).
func (s *fleetShare) Lag() time.Duration { return s.lag }

// Pause tells the fleet of a pause this node saw, without holding up the
// caller (limiter.Shared): etcd may be slow or cut off, and the pause holds
// here in any case.
func (s *fleetShare) Pause(until time.Time) {
	s.tell(func() {
		_, _ = s.Slots.Pause(context.Background(), until) // a failure is recorded as a local pause (revision 0)
	})
}

// tell runs write, a pause for the fleet, among the key's calls; on a share
// already stopping (replaced, or the node closing) it runs all the same,
// untracked: the other nodes must still hear of the pause, though its
// record may go with the share.
func (s *fleetShare) tell(write func()) {
	if !s.learning.calls.Go(write) {
		go write()
	}
}

// BreakerOpened tells the fleet that this node's breaker of the key's
// source opened until until (limiter.Shared): every node pauses the key
// until then, and the others BreakerGrace longer (applyPause), so that
// this node's half-open probe decides whether the upstream is back. A
// gateway group's key is not paused for one member's breaker: the others
// behind the gateway may be well; each node's breaker of that source
// opens on its own failures.
func (s *fleetShare) BreakerOpened(until time.Time) {
	if s.group {
		return
	}
	s.tell(func() {
		_, _ = s.Slots.PauseFor(context.Background(), until, s.node) // a failure is recorded as a local pause (revision 0)
	})
}

// validNodeName reports whether name may name a node: it is part of etcd
// keys (learn/<key>/obs/<node>, view/<node>) and of values other nodes
// parse, so 1 to 64 letters, digits, '.', '_' or '-'.
func validNodeName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// startFleet connects to etcd and shares every source's budget. It fails
// when etcd cannot be reached at start: a node that never joined must not
// run as if alone.
// The options are checked first (fleetOptions.check); key is the node
// ledger's note verifier key (checkNodeName).
func startFleet(ctx context.Context, o fleetOptions, key string, lim *limiter.Limiter, reg *registry.Registry, led auditd.Appender, log *slog.Logger) (*fleetNode, error) {
	client, err := clientv3.New(clientv3.Config{
		Endpoints: o.Etcd, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		// Reconnect within a fraction of a second of etcd coming back, so
		// that a node cut off rejoins soon after the cut heals.
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second,
		})},
	})
	if err != nil {
		return nil, fmt.Errorf("fleet: etcd %s: %w", strings.Join(o.Etcd, ","), err)
	}
	probe, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = client.Get(probe, fleet.DefaultPrefix+"probe")
	cancel()
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("fleet: etcd %s does not answer: %w", strings.Join(o.Etcd, ","), err)
	}
	if err := checkNodeName(ctx, client, o.Node, key); err != nil {
		client.Close()
		return nil, err
	}
	if o.Lag == 0 {
		o.Lag = defaultFleetLag
	}
	n := &fleetNode{node: o.Node, lag: o.Lag, client: client, store: fleet.NewStore(client, clock.Real{}, ""),
		lim: lim, reg: reg, led: led, log: log, shares: map[string]*fleetShare{}, groups: map[string]bool{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
	n.sync()
	rctx, stop := context.WithCancel(context.Background())
	n.cancel = stop
	go n.run(rctx)
	log.Info("fleet joined", "etcd", strings.Join(o.Etcd, ","))
	return n, nil
}

// sync shares the budget of every source the registry holds at its
// ceiling, makes again a key's Slots whose ceiling changed, and drops those
// of keys no source uses any more. A key's new share replaces its old one
// in one step, so that no request is admitted without a fleet slot
// between them.
func (n *fleetNode) sync() {
	want := map[string]*fleetShare{}
	for _, src := range n.reg.ListSources() {
		st, err := n.reg.State(src.ID)
		if err != nil {
			continue // removed meanwhile
		}
		// The ceiling the limiter is configured at (fetch's configureGates).
		key, rate := src.ID, fleet.Rate{Limit: st.CeilingLimit, Window: st.CeilingWindow}
		if st.Group != "" {
			key, rate = st.Group, fleet.Rate{Limit: st.GroupCeilingLimit, Window: st.GroupCeilingWindow}
		}
		if _, ok := want[key]; !ok {
			want[key] = &fleetShare{rate: rate, member: src.ID, group: st.Group != "", node: n.node, lag: n.lag, told: src.Limit > 0}
		}
	}
	gone := map[string]*fleetShare{}
	n.mu.Lock()
	for key, old := range n.shares {
		w, ok := want[key]
		if ok && w.rate == old.rate {
			// A gateway group's member may have left it: the budget its
			// pauses go to is that of a member now (applyPause).
			old.member = w.member
			continue
		}
		if !ok {
			n.lim.Share(key, nil)
		} // else the new share replaces it in one step below: no waiter is admitted unshared between the two
		gone[key] = old
		delete(n.shares, key)
	}
	for key, w := range want {
		if _, ok := n.shares[key]; ok {
			continue
		}
		slots, err := fleet.NewSlots(n.store, clock.Real{}, fleet.Config{Key: key, Node: n.node, Rate: w.rate, MaxSkew: fleet.DefaultMaxSkew + n.lag, Notify: n.notify})
		if err != nil {
			// A key whose share was to be remade keeps the old one, still
			// attached to the limiter: it holds, and the next sync tries
			// again.
			n.log.Error("fleet: share budget", "key", key, "err", err)
			if old, ok := gone[key]; ok {
				n.shares[key] = old
				delete(gone, key)
			}
			continue
		}
		w.Slots = slots
		if w.group {
			n.groups[key] = true
		}
		w.learning = startLearning(n.store, slots, clock.Real{}, key, n.node, n.startRate(w), w.rate, n.notify)
		slots.Open()
		n.shares[key] = w
		n.lim.Share(key, w)
	}
	n.mu.Unlock()
	for _, s := range gone { // outside n.mu: their goroutines may be notifying
		n.closeShare(s)
	}
}

// startRate is where a key's learning starts on this node when the fleet
// has learned nothing of it yet: the ceiling the operator told, else the
// pace the node's registry would start the source at alone.
func (n *fleetNode) startRate(w *fleetShare) fleet.Rate {
	if w.told {
		return w.rate
	}
	lim, err := n.reg.Limits(w.member)
	if err != nil {
		return w.rate
	}
	if l, win := lim.Pace(); l > 0 && win > 0 {
		return fleet.Rate{Limit: l, Window: win}
	}
	return w.rate
}

// closeShare stops a key's learning on this node, with its writes on their
// way, and its slots. Without a quorum its learning's campaign does not
// resign (fleetLearning.stop): closeShare gives it up to 5 s, and the
// slots' goroutines, which end at once, a second of their own.
func (n *fleetNode) closeShare(s *fleetShare) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.learning.stop(ctx)
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	_ = s.Close(sctx) // its held slots are wasted, never given back
}

// notify queues e for the ledger (fleet.Config.Notify). A grant is handed
// to the ledger before notify returns, with what was queued before it:
// Slots hands out none of its slots until then, and the ledger stores its
// adds in order (a later one is never durable before an earlier), so the
// dispatch record of a request using one of the block's slots commits with
// the grant's record or after it, never before. A SIGKILL cannot leave a
// dispatch on record outside every recorded block, and a sparse node's
// request waits for one commit, not two. Other events are written by run
// without holding up the Slots.
func (n *fleetNode) notify(e fleet.Event) {
	n.mu.Lock()
	n.queue = append(n.queue, e)
	n.mu.Unlock()
	if e.Kind == fleet.EventReserved {
		n.drain()
		return
	}
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

// run writes the queued events to the ledger, applies learned pauses to
// the local budget, and resyncs the shared keys, until ctx ends.
func (n *fleetNode) run(ctx context.Context) {
	defer close(n.done)
	tick := time.NewTicker(fleetResync)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			n.drain()
			return
		case <-tick.C:
			n.sync()
		case <-n.wake:
		}
		n.drain()
	}
}

// eventAdder is the ledger's ordered add (ledger.Ledger.Add): events are
// queued in the order added and stored in that order, without waiting.
type eventAdder interface {
	Add(events []auditd.Event, puts ...auditd.Put) (auditd.Future, error)
}

// drain hands the queued events to the ledger and applies the pauses among
// them, without waiting for their commit: a failure is logged when the
// ledger decides it.
func (n *fleetNode) drain() {
	f, count := n.hand()
	if f == nil {
		return
	}
	f.Then(func(_ []auditd.Event, err error) {
		if err != nil {
			n.log.Error("fleet: record events", "events", count, "err", err)
		}
	})
}

// hand gives the queued events to the ledger in one add, in order, applies
// the pauses among them, and returns the add's Future (nil when nothing
// was queued or the add was refused) and how many events it holds. A
// ledger without an ordered add (tests' fakes) gets each event appended,
// waited for.
func (n *fleetNode) hand() (auditd.Future, int) {
	n.writing.Lock()
	defer n.writing.Unlock()
	n.mu.Lock()
	q := n.queue
	n.queue = nil
	n.mu.Unlock()
	if len(q) == 0 {
		return nil, 0
	}
	events := make([]auditd.Event, len(q))
	for i, e := range q {
		if e.Kind == fleet.EventPaused {
			n.applyPause(e)
		}
		events[i] = n.event(e)
	}
	add, ok := n.led.(eventAdder)
	if !ok {
		for _, e := range events {
			if _, err := n.led.Append(context.Background(), e); err != nil {
				n.log.Error("fleet: record event", "type", e.Type, "err", err)
			}
		}
		return nil, 0
	}
	f, err := add.Add(events)
	if err != nil {
		n.log.Error("fleet: record events", "events", len(events), "err", err)
		return nil, 0
	}
	return f, len(events)
}

// applyPause makes a pause of the fleet (another node's, or this one's
// coming back) a pause of the local budget, so the requests waiting here
// wait at the pause gate with its end known. Budget.Pause, not
// Limiter.Pause: the fleet already has it. Another node's breaker's pause
// holds here BreakerGrace longer than there: its probe goes first.
func (n *fleetNode) applyPause(e fleet.Event) {
	n.mu.Lock()
	s, ok := n.shares[e.Key]
	var member string
	if ok {
		member = s.member
	}
	n.mu.Unlock()
	if !ok {
		return
	}
	until := e.Pause.Until
	if by := e.Pause.Breaker; by != "" && by != n.node {
		until = until.Add(fleet.BreakerGrace)
	}
	if b, err := n.lim.Budget(member); err == nil {
		b.Pause(until)
	}
}

// fleetDetail is the Detail of a fleet event.
type fleetDetail struct {
	Node     string     `json:"node"`
	Revision int64      `json:"revision,omitempty"`
	First    *time.Time `json:"first,omitempty"`
	Interval string     `json:"interval,omitempty"`
	Count    int        `json:"count,omitempty"`
	Until    *time.Time `json:"until,omitempty"`
	// Breaker names the node whose breaker opened the pause.
	Breaker string `json:"breaker,omitempty"`
	// A learned limit (fleet.learned): Limit per Window, written by By; the
	// rate a refusal was last seen at, and when, if remembered.
	Limit         int        `json:"limit,omitempty"`
	Window        string     `json:"window,omitempty"`
	By            string     `json:"by,omitempty"`
	Refused       int        `json:"refused,omitempty"`
	RefusedWindow string     `json:"refused_window,omitempty"`
	RefusedAt     *time.Time `json:"refused_at,omitempty"`
}

// event is e as a ledger event.
func (n *fleetNode) event(e fleet.Event) auditd.Event {
	d := fleetDetail{Node: n.node}
	ev := auditd.Event{}
	switch e.Kind {
	case fleet.EventReserved:
		ev.Type = auditd.EventFleetReserved
		first := e.Block.First.UTC()
		d.Revision, d.First, d.Interval, d.Count = e.Block.Revision, &first, e.Block.Interval.String(), e.Block.Count
	case fleet.EventPaused:
		ev.Type = auditd.EventFleetPaused
		until := e.Pause.Until.UTC()
		d.Revision, d.Until, d.Breaker = e.Pause.Revision, &until, e.Pause.Breaker
	case fleet.EventCutOff:
		ev.Type = auditd.EventFleetCutOff
		if e.Err != nil {
			ev.Reason = e.Err.Error()
		}
	case fleet.EventRejoined:
		ev.Type = auditd.EventFleetRejoined
	case fleet.EventLearned:
		ev.Type = auditd.EventFleetLearned
		l := e.Limit
		d.Revision, d.Limit, d.Window, d.By = l.Revision, l.Rate.Limit, l.Rate.Window.String(), l.By
		ev.Reason = l.Cause // the event's cause
		if l.Refused.Limit > 0 {
			at := l.RefusedAt.UTC()
			d.Refused, d.RefusedWindow, d.RefusedAt = l.Refused.Limit, l.Refused.Window.String(), &at
		}
	}
	n.mu.Lock()
	group := n.groups[e.Key]
	n.mu.Unlock()
	if group {
		ev.Group = e.Key
	} else {
		ev.SourceID = e.Key
	}
	detail, _ := json.Marshal(d)
	ev.Detail = string(detail)
	return ev
}

// releaseWithin bounds the revoke of a stopping node's lease: a round trip
// with a quorum, and not worth waiting for without one.
const releaseWithin = 500 * time.Millisecond

// close stops sharing, waits for the keys' writes on their way, writes
// what is queued, and closes the etcd client.
func (n *fleetNode) close(ctx context.Context) error {
	n.cancel()
	select {
	case <-n.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	n.mu.Lock()
	shares := n.shares
	n.shares = map[string]*fleetShare{}
	n.mu.Unlock()
	for key, s := range shares {
		n.lim.Share(key, nil)
		s.learning.cancel()
		// Its pauses, cuts and limits set by hand on their way, each within
		// fleet.DefaultTimeout: a pause is handed to the ledger below.
		s.learning.calls.wait(ctx)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_ = s.Close(sctx) // its held slots are wasted, never given back
		cancel()
	}
	if f, count := n.hand(); f != nil {
		if err := f.Wait(ctx); err != nil {
			n.log.Error("fleet: record events", "events", count, "err", err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, releaseWithin)
	_ = n.store.Release(rctx) // a failure: the campaigns end with the lease's TTL
	cancel()
	err := n.client.Close()
	for _, s := range shares {
		s.learning.stop(ctx) // a campaign without a quorum ends with the client
	}
	return err
}
