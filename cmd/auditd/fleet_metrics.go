package main

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"
)

// The fleet's metrics, per shared key (a source id or a gateway group's
// name) and node: what the node's Slots hold and have done (fleet.Stats).
// Summed over the nodes, reserved is the fleet's share of the key's rate.
var (
	descFleetBlocks = prometheus.NewDesc("auditd_fleet_reservations_total",
		"Blocks of slots granted to this node: its etcd writes.", []string{"key", "node"}, nil)
	descFleetReserved = prometheus.NewDesc("auditd_fleet_slots_reserved_total",
		"Slots granted to this node.", []string{"key", "node"}, nil)
	descFleetUsed = prometheus.NewDesc("auditd_fleet_slots_used_total",
		"Slots this node handed to requests.", []string{"key", "node"}, nil)
	descFleetWasted = prometheus.NewDesc("auditd_fleet_slots_wasted_total",
		"Slots that expired unused here, or were dropped for a pause.", []string{"key", "node"}, nil)
	descFleetHeld = prometheus.NewDesc("auditd_fleet_slots_held",
		"Slots granted and still usable.", []string{"key", "node"}, nil)
	descFleetCutOff = prometheus.NewDesc("auditd_fleet_cut_off",
		"1 while the node's last reservation failed (it hands out what it holds, then nothing), else 0.", []string{"key", "node"}, nil)
	descFleetTrip = prometheus.NewDesc("auditd_fleet_reservation_seconds",
		"The last granted reservation's round trip to etcd.", []string{"key", "node"}, nil)
	descFleetLearner = prometheus.NewDesc("auditd_fleet_learner",
		"1 while this node is the key's elected learner (it raises and probes the key's limit), else 0.", []string{"key", "node"}, nil)
	descFleetLearned = prometheus.NewDesc("auditd_fleet_learned_requests_per_second",
		"The key's limit the fleet learned, which this node reserves its slots at (capped at the ceiling); absent until read.", []string{"key", "node"}, nil)
	descFleetLag = prometheus.NewDesc("auditd_fleet_lag_allowance_seconds",
		"The lag from a slot to the wire the slots are spaced for (--fleet-lag).", []string{"node"}, nil)
)

// Describe implements prometheus.Collector.
func (n *fleetNode) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descFleetBlocks, descFleetReserved, descFleetUsed, descFleetWasted,
		descFleetHeld, descFleetCutOff, descFleetTrip, descFleetLearner, descFleetLearned, descFleetLag} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: the stats of every key the node
// shares now.
func (n *fleetNode) Collect(ch chan<- prometheus.Metric) {
	n.mu.Lock()
	shares := maps.Clone(n.shares)
	n.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(descFleetLag, prometheus.GaugeValue, n.lag.Seconds(), n.node)
	for key, s := range shares {
		st := s.Stats()
		cut, learner := 0.0, 0.0
		if st.CutOff {
			cut = 1
		}
		if s.learning.Leading() {
			learner = 1
		}
		if l, r := s.learning.Limit(); l.Revision != 0 {
			ch <- prometheus.MustNewConstMetric(descFleetLearned, prometheus.GaugeValue, r.PerSecond(), key, n.node)
		}
		for _, m := range []struct {
			d *prometheus.Desc
			t prometheus.ValueType
			v float64
		}{
			{descFleetBlocks, prometheus.CounterValue, float64(st.Blocks)},
			{descFleetReserved, prometheus.CounterValue, float64(st.Reserved)},
			{descFleetUsed, prometheus.CounterValue, float64(st.Used)},
			{descFleetWasted, prometheus.CounterValue, float64(st.Wasted)},
			{descFleetHeld, prometheus.GaugeValue, float64(st.Held)},
			{descFleetCutOff, prometheus.GaugeValue, cut},
			{descFleetTrip, prometheus.GaugeValue, st.Trip.Seconds()},
			{descFleetLearner, prometheus.GaugeValue, learner},
		} {
			ch <- prometheus.MustNewConstMetric(m.d, m.t, m.v, key, n.node)
		}
	}
}
