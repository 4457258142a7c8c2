package main

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/api"
	"github.com/auditd/auditd/fleet"
)

// The fleet view (GET /v1/fleet/sources): each node counts its use of every
// key it shares over the last minute and publishes it to etcd, so that any
// node can show every node's slots. One etcd write per node every
// fleetViewEvery, whatever the number of keys: off the request path, apart
// from the budget's own keys, and a small part of the etcd load of a busy
// fleet (each busy node reserves a block about every second per key).
const (
	fleetViewEvery = 5 * time.Second
	fleetViewSpan  = time.Minute
	// fleetViewTTL is the lease of a node's report, in seconds: a node that
	// dies stays in the view, its report ageing, this long. One that stops
	// revokes it. The lease is renewed every third of it.
	fleetViewTTL    = 60
	fleetViewPrefix = fleet.DefaultPrefix + "view/"
	// fleetViewTimeout bounds each etcd call of the view.
	fleetViewTimeout = time.Second
)

// fleetView counts this node's use of its shared keys and reads the other
// nodes' from etcd.
type fleetView struct {
	fl  *fleetNode
	now func() time.Time

	mu      sync.Mutex
	samples fleetSamples
	// lease holds the node's report in etcd: 0 until granted, or after it
	// expired; renewed when it was last. The run goroutine's.
	lease   clientv3.LeaseID
	renewed time.Time

	cancel context.CancelFunc
	done   chan struct{}
}

// fleetSample is a key's counters at one time.
type fleetSample struct {
	at time.Time
	st fleet.Stats
}

// fleetReport is what a node publishes: its use of each key it shares.
type fleetReport struct {
	Node string                      `json:"node"`
	Keys map[string]api.FleetNodeUse `json:"keys"`
}

// startFleetView starts counting fl's use and publishing it.
func startFleetView(fl *fleetNode) *fleetView {
	v := &fleetView{fl: fl, now: time.Now, samples: fleetSamples{}, done: make(chan struct{})}
	ctx, cancel := context.WithCancel(context.Background())
	v.cancel = cancel
	v.sample()
	go v.run(ctx)
	return v
}

func (v *fleetView) run(ctx context.Context) {
	defer close(v.done)
	tick := time.NewTicker(fleetViewEvery)
	defer tick.Stop()
	for {
		if err := v.publish(ctx); err != nil && ctx.Err() == nil {
			v.fl.log.Debug("fleet view: publish", "err", err) // cut off: the view says so itself
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			v.sample()
		}
	}
}

// shared returns the keys the node shares now.
func (v *fleetView) shared() map[string]*fleetShare {
	v.fl.mu.Lock()
	defer v.fl.mu.Unlock()
	return maps.Clone(v.fl.shares)
}

// stats returns the counters of every key the node shares now.
func (v *fleetView) stats() map[string]fleet.Stats {
	out := map[string]fleet.Stats{}
	for key, s := range v.shared() {
		out[key] = s.Stats()
	}
	return out
}

// sample records every shared key's counters.
func (v *fleetView) sample() {
	now, stats := v.now(), v.stats()
	v.mu.Lock()
	defer v.mu.Unlock()
	v.samples.record(now, stats)
}

// report is the node's use of every key it shares now, counted from the
// start of each key's span.
func (v *fleetView) report() fleetReport {
	now, shares := v.now(), v.shared()
	rep := fleetReport{Node: v.fl.node, Keys: map[string]api.FleetNodeUse{}}
	v.mu.Lock()
	defer v.mu.Unlock()
	for key, s := range shares {
		u := v.samples.use(key, now, s.Stats())
		u.Node, u.Learner = v.fl.node, s.learning.Leading()
		rep.Keys[key] = u
	}
	return rep
}

// fleetSamples are a node's counters of each key it shares, oldest first,
// over the last fleetViewSpan: the first is the span's start.
type fleetSamples map[string][]fleetSample

// record adds the counters of every key shared at now, drops the keys no
// longer shared, and keeps what the last span needs: the newest sample at
// or before its start, and all after.
func (c fleetSamples) record(now time.Time, stats map[string]fleet.Stats) {
	for key := range c {
		if _, ok := stats[key]; !ok {
			delete(c, key)
		}
	}
	for key, st := range stats {
		ss := c[key]
		if len(ss) == 0 || st.Reserved < ss[len(ss)-1].st.Reserved {
			// First seen, or its Slots made again (a new ceiling): counted
			// from zero now.
			ss = []fleetSample{{at: now}}
		}
		ss = append(ss, fleetSample{at: now, st: st})
		for len(ss) > 1 && !ss[1].at.After(now.Add(-fleetViewSpan)) {
			ss = ss[1:]
		}
		c[key] = ss
	}
}

// use is key's use from the start of its span to now, when its counters
// are cur.
func (c fleetSamples) use(key string, now time.Time, cur fleet.Stats) api.FleetNodeUse {
	base := fleetSample{at: now}
	if ss := c[key]; len(ss) > 0 && cur.Reserved >= ss[0].st.Reserved {
		base = ss[0]
	}
	return api.FleetNodeUse{
		ReportedAt: now.UTC(), Span: auditd.Duration(now.Sub(base.at).Round(time.Millisecond)),
		Blocks: cur.Blocks - base.st.Blocks, Reserved: cur.Reserved - base.st.Reserved,
		Used: cur.Used - base.st.Used, Wasted: cur.Wasted - base.st.Wasted, Held: cur.Held,
		CutOff: cur.CutOff, PausedUntil: utc(cur.PausedUntil), Etcd: auditd.Duration(cur.Trip),
	}
}

func utc(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}

// publish writes the node's report under a lease, granting one first when
// it has none or its last expired (the node was cut off for longer), and
// renewing it every third of its time to live.
func (v *fleetView) publish(ctx context.Context) error {
	body, err := json.Marshal(v.report())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, fleetViewTimeout)
	defer cancel()
	c := v.fl.client
	now := v.now()
	switch {
	case v.lease == 0:
		l, err := c.Grant(ctx, fleetViewTTL)
		if err != nil {
			return err
		}
		v.lease, v.renewed = l.ID, now
	case now.Sub(v.renewed) >= fleetViewTTL*time.Second/3:
		if _, err := c.KeepAliveOnce(ctx, v.lease); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				v.lease = 0
			}
			return err
		}
		v.renewed = now
	}
	_, err = c.Put(ctx, fleetViewPrefix+v.fl.node, string(body), clientv3.WithLease(v.lease))
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		v.lease = 0
	}
	return err
}

// close stops publishing and takes the node's report out of the view.
func (v *fleetView) close(ctx context.Context) error {
	v.cancel()
	select {
	case <-v.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if v.lease == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, fleetViewTimeout)
	defer cancel()
	_, err := v.fl.client.Revoke(ctx, v.lease)
	return err
}

// Node implements api.FleetView.
func (v *fleetView) Node() string { return v.fl.node }

// FleetSources implements api.FleetView: this node's use, read now, with
// the other nodes' last reports; when etcd does not answer, this node's
// alone and why.
func (v *fleetView) FleetSources(ctx context.Context) (api.FleetSources, error) {
	own := v.report()
	reports := []fleetReport{own}
	out := api.FleetSources{Node: own.Node, Sources: []api.FleetSource{}}
	peers, err := v.peers(ctx)
	if err != nil {
		out.PeersError = "etcd did not answer this node: " + err.Error()
	}
	reports = append(reports, peers...)

	keys := map[string]bool{}
	for _, r := range reports {
		for key := range r.Keys {
			keys[key] = true
		}
	}
	shares := v.shared()
	for _, key := range slices.Sorted(maps.Keys(keys)) {
		src := v.source(key, shares[key])
		var total int64
		for _, r := range reports {
			if u, ok := r.Keys[key]; ok {
				src.Nodes = append(src.Nodes, u)
				total += u.Reserved
				if u.Learner {
					src.Learner = u.Node
				}
			}
		}
		for i := range src.Nodes {
			if total > 0 && out.PeersError == "" { // a share of what is not known is none
				src.Nodes[i].Share = float64(src.Nodes[i].Reserved) / float64(total)
			}
		}
		out.Sources = append(out.Sources, src)
	}
	return out, nil
}

// peers reads the other nodes' last reports, sorted by node.
func (v *fleetView) peers(ctx context.Context) ([]fleetReport, error) {
	ctx, cancel := context.WithTimeout(ctx, fleetViewTimeout)
	defer cancel()
	resp, err := v.fl.client.Get(ctx, fleetViewPrefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, err
	}
	var out []fleetReport
	for _, kv := range resp.Kvs {
		var r fleetReport
		if json.Unmarshal(kv.Value, &r) != nil || r.Node == v.fl.node || r.Node != strings.TrimPrefix(string(kv.Key), fleetViewPrefix) {
			continue // this node's own, read live instead; or not a report
		}
		out = append(out, r)
	}
	return out, nil
}

// source is key's shared budget as this node has it: the ceiling shared
// and the limit learned here. A key only other nodes share has neither.
func (v *fleetView) source(key string, s *fleetShare) api.FleetSource {
	src := api.FleetSource{Key: key, Members: []string{}}
	if s == nil {
		return src
	}
	src.Limit, src.Window = s.rate.Limit, auditd.Duration(s.rate.Window)
	src.Group = s.group
	for _, m := range v.fl.reg.ListSources() {
		st, err := v.fl.reg.State(m.ID)
		if err != nil {
			continue
		}
		switch {
		case src.Group && st.Group == key, !src.Group && m.ID == key:
			src.Members = append(src.Members, m.ID)
		}
	}
	// The fleet's learned limit as the node reserves its slots at it:
	// capped at the ceiling.
	if l, r := s.learning.Limit(); l.Revision != 0 {
		src.Learned, src.LearnedWindow, src.LearnedBy = r.Limit, auditd.Duration(r.Window), l.By
	}
	return src
}
