package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/reports"
)

// The budget test's reading of the nodes' ledgers against nginx's log:
// which slot each request nginx saw was handed, when its dispatch was
// recorded, and when it arrived.

// fleetLedger is what a stopped node's ledger holds of the shared budget.
type fleetLedger struct {
	events     []auditd.Event // its fleet events
	throttles  []time.Time
	slots      []time.Time    // every slot of its grants, in time order
	dispatches []auditd.Event // its dispatch records of source "up", in order
	// sent are those of dispatches not closed as not sent: what nginx can
	// have seen of the node.
	sent   []auditd.Event
	grants int
	// late counts the grants recorded once their first slot's grace had
	// passed: the node holds a grant's slots only once its record is
	// durable, so that slot at least was wasted.
	late int
}

// readFleetLedgers reads each stopped node's ledger.
func readFleetLedgers(t *testing.T, datas []string) []fleetLedger {
	t.Helper()
	var out []fleetLedger
	for _, data := range datas {
		var l fleetLedger
		l.events, l.throttles = fleetEvents(t, data)
		var sent reports.SentScan
		scanLedger(t, data, func(e *auditd.Event) {
			if e.SourceID != "up" || e.RunID == "" {
				return
			}
			sent.See(e)
			if e.Type == auditd.EventDispatch {
				l.dispatches = append(l.dispatches, *e)
			}
		})
		l.sent = reports.Sent(slices.Clone(l.dispatches), &sent)
		for _, e := range l.events {
			var d fleetDetail
			if e.Type != auditd.EventFleetReserved || json.Unmarshal([]byte(e.Detail), &d) != nil || d.First == nil {
				continue
			}
			iv, _ := time.ParseDuration(d.Interval)
			for k := range d.Count {
				l.slots = append(l.slots, d.First.Add(time.Duration(k)*iv))
			}
			l.grants++
			if !e.Time.Before(d.First.Add(fleet.DefaultGrace)) {
				l.late++
			}
		}
		slices.SortFunc(l.slots, time.Time.Compare)
		out = append(out, l)
	}
	return out
}

// slotBefore is the latest of the node's slots at or before at (zero when
// none): a request recorded at at took that slot or an earlier one.
func (l *fleetLedger) slotBefore(at time.Time) time.Time {
	i := sort.Search(len(l.slots), func(i int) bool { return l.slots[i].After(at) })
	if i == 0 {
		return time.Time{}
	}
	return l.slots[i-1]
}

// tracedArrival is a request nginx logged, with its dispatch record's
// time and the latest slot its node held by then: its own slot, or an
// earlier one, so the times from it are the least the request took.
type tracedArrival struct {
	fleetArrival
	recorded, slot time.Time
}

func (a tracedArrival) String() string {
	return fmt.Sprintf("node %d %s: latest slot by its record %s, recorded +%v, at nginx +%v", a.node, a.path,
		a.slot.Format("15:04:05.000"), a.recorded.Sub(a.slot).Round(time.Millisecond), a.at.Sub(a.slot).Round(time.Millisecond))
}

// traceArrivals matches each request nginx logged with its node's
// dispatch record of the same path (in order, for a path sent again).
func traceArrivals(t *testing.T, all []fleetArrival, ledgers []fleetLedger) []tracedArrival {
	t.Helper()
	records := make([]map[string][]time.Time, len(ledgers))
	for i, l := range ledgers {
		records[i] = map[string][]time.Time{}
		for _, e := range l.sent {
			records[i][e.Path] = append(records[i][e.Path], e.Time)
		}
	}
	var out []tracedArrival
	for _, a := range all {
		byPath := records[a.node-1]
		if len(byPath[a.path]) == 0 {
			t.Errorf("nginx logged %s from node %d at %s, which no dispatch record of that node holds", a.path, a.node, a.at.Format("15:04:05.000"))
			continue
		}
		rec := byPath[a.path][0]
		byPath[a.path] = byPath[a.path][1:]
		out = append(out, tracedArrival{fleetArrival: a, recorded: rec, slot: ledgers[a.node-1].slotBefore(rec)})
	}
	return out
}

// checkBudgetWindows checks nginx's log with a sliding window of a second:
// never more than limit in one. It checks the grants and dispatches on
// record: no two slots of the fleet closer than interval (no grant
// overlaps another), and no node with more dispatches recorded by any time
// than slots granted by then. It logs how late requests reached nginx
// after their slot, and in an over-limit window every request's slot,
// record and arrival.
func checkBudgetWindows(t *testing.T, all []fleetArrival, ledgers []fleetLedger, limit int, interval time.Duration, start time.Time) {
	t.Helper()
	at := make([]time.Time, len(all))
	for i, a := range all {
		at[i] = a.at
	}
	most, first := busiestWindow(at, time.Second)
	traced := traceArrivals(t, all, ledgers)
	// Past the guard: later after its slot than the slots' spacing allows
	// for (a window of the limit's intervals less the window itself).
	guard := time.Duration(limit)*interval - time.Second
	// A batch run's items and proxied requests take different ways from
	// their slot to the wire: each is shown on its own.
	for _, kind := range []string{"batch", "proxied"} {
		var toRecord, toNginx []time.Duration
		var late []string
		for _, a := range traced {
			if strings.HasPrefix(a.path, "/batch-") != (kind == "batch") {
				continue
			}
			toRecord, toNginx = append(toRecord, a.recorded.Sub(a.slot)), append(toNginx, a.at.Sub(a.slot))
			if a.at.Sub(a.slot) >= guard {
				late = append(late, a.String())
			}
		}
		t.Logf("%s, from the slot (the latest its node held at its record) to the dispatch record: %s; to nginx: %s; %d of %d past the guard's %v",
			kind, quantiles(toRecord), quantiles(toNginx), len(late), len(toNginx), guard)
		for _, a := range late[:min(len(late), 5)] {
			t.Logf("  past the guard: %s", a)
		}
	}
	t.Logf("nginx's busiest second held %d requests (the limit %d)", most, limit)
	if most > limit {
		t.Errorf("nginx saw %d requests in one second from %v into the load: over the fleet's limit of %d", most, all[first].at.Sub(start), limit)
		for _, a := range traced {
			if !a.at.Before(all[first].at) && a.at.Before(all[first].at.Add(time.Second)) {
				t.Logf("  %s", a)
			}
		}
	}
	checkGrants(t, ledgers, interval)
}

// checkGrants checks that no two slots of the fleet's grants are closer
// than interval, and that each node recorded no more dispatches by any
// time than it had slots by then.
func checkGrants(t *testing.T, ledgers []fleetLedger, interval time.Duration) {
	t.Helper()
	type owned struct {
		at   time.Time
		node int
	}
	var slots []owned
	var late []string
	for i, l := range ledgers {
		late = append(late, fmt.Sprintf("node%d %d of %d", i+1, l.late, l.grants))
		for _, s := range l.slots {
			slots = append(slots, owned{s, i + 1})
		}
		for k, e := range l.dispatches {
			if held := sort.Search(len(l.slots), func(j int) bool { return l.slots[j].After(e.Time) }); held < k+1 {
				t.Errorf("node %d recorded %d dispatches by %s, but held only %d slots by then", i+1, k+1, e.Time.Format("15:04:05.000"), held)
				break
			}
		}
	}
	sort.Slice(slots, func(i, j int) bool { return slots[i].at.Before(slots[j].at) })
	for i := 1; i < len(slots); i++ {
		if gap := slots[i].at.Sub(slots[i-1].at); gap < interval {
			t.Errorf("slots of node %d and node %d are %v apart, under the interval %v: grants overlap", slots[i-1].node, slots[i].node, gap, interval)
		}
	}
	t.Logf("%d slots granted to the fleet, none closer than %v; grants recorded past their first slot's grace: %s", len(slots), interval, strings.Join(late, ", "))
}

// checkSentInTime checks that each node sent no request whose dispatch
// record is later after the latest slot the node held by then than a
// slot's grace and the lag allowance: such a request left outside the time
// its slot was spaced for (the check at the wire closes it as not sent
// instead). It logs how many each node closed so, of its dispatches.
func checkSentInTime(t *testing.T, ledgers []fleetLedger, lag time.Duration) {
	t.Helper()
	var shares []string
	for i, l := range ledgers {
		for _, e := range l.sent {
			if slot := l.slotBefore(e.Time); e.Time.Sub(slot) > fleet.DefaultGrace+lag {
				t.Errorf("node %d sent %s recorded at %s, %v after the latest slot it held: past the grace and the lag allowance (%v)",
					i+1, e.Path, e.Time.Format("15:04:05.000"), e.Time.Sub(slot), fleet.DefaultGrace+lag)
			}
		}
		notSent := len(l.dispatches) - len(l.sent)
		shares = append(shares, fmt.Sprintf("node%d %d of %d (%.1f%%)", i+1, notSent, len(l.dispatches), 100*float64(notSent)/float64(max(1, len(l.dispatches)))))
	}
	t.Logf("dispatches closed as not sent, their fleet slot passed before they could leave (at the record or at the wire): %s", strings.Join(shares, ", "))
}

// quantiles is "p50 a, p99 b, max c" of ds.
func quantiles(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	slices.Sort(ds)
	q := func(p float64) time.Duration { return ds[int(p*float64(len(ds)-1))].Round(time.Millisecond) }
	return fmt.Sprintf("p50 %v, p99 %v, max %v", q(0.5), q(0.99), q(1))
}

// checkFleetRecords checks the nodes' fleet events (their own node name,
// grants with a revision; only node 3 cut off, and it rejoined), that node
// 3 sent nothing past its held slots while cut off, that nginx refused
// nothing but the request meant for it, and that its 429 paused every node
// with no request sent inside the pause.
func checkFleetRecords(t *testing.T, ledgers []fleetLedger, all []fleetArrival, cutAt, healAt time.Time) {
	t.Helper()
	var pausedAt [3]time.Time
	var throttled, held time.Time
	for i, l := range ledgers {
		if len(l.throttles) > 0 && (throttled.IsZero() || l.throttles[0].Before(throttled)) {
			throttled = l.throttles[0]
		}
		kinds := map[auditd.EventType]int{}
		for _, e := range l.events {
			kinds[e.Type]++
			var d fleetDetail
			if err := json.Unmarshal([]byte(e.Detail), &d); err != nil || d.Node != fmt.Sprintf("node%d", i+1) {
				t.Errorf("node %d: fleet event detail %q: %v", i+1, e.Detail, err)
			}
			switch {
			case e.Type == auditd.EventFleetReserved && d.Revision == 0:
				t.Errorf("node %d: a grant without its etcd revision: %+v", i+1, e)
			case e.Type == auditd.EventFleetReserved && i == 2 && e.Time.Before(healAt) && d.First != nil:
				iv, _ := time.ParseDuration(d.Interval)
				held = later(held, d.First.Add(time.Duration(d.Count)*iv))
			case e.Type == auditd.EventFleetPaused && d.Revision > 0 && pausedAt[i].IsZero() && e.Time.After(healAt):
				pausedAt[i] = e.Time
			case e.Type == auditd.EventFleetCutOff && i != 2:
				t.Errorf("node %d recorded a cut-off it never had: %+v", i+1, e)
			case e.Type == auditd.EventFleetLearned && (d.Revision == 0 || d.Limit*int(time.Second) != 20*int(mustDuration(t, d.Window))):
				// Told 20/s, the fleet starts there; nginx refused nothing
				// without a Retry-After, so nothing cut it.
				t.Errorf("node %d applied a learned limit other than the told 20/s: %+v", i+1, d)
			}
		}
		t.Logf("node %d fleet events: %v, dispatches %d", i+1, kinds, len(l.dispatches))
		if kinds[auditd.EventFleetReserved] == 0 || kinds[auditd.EventFleetLearned] == 0 {
			t.Errorf("node %d recorded %d grants and %d learned limits, want some of each", i+1, kinds[auditd.EventFleetReserved], kinds[auditd.EventFleetLearned])
		}
		if i == 2 && (kinds[auditd.EventFleetCutOff] == 0 || kinds[auditd.EventFleetRejoined] == 0) {
			t.Errorf("node 3 was cut off and healed, but recorded cut-offs %d, rejoins %d", kinds[auditd.EventFleetCutOff], kinds[auditd.EventFleetRejoined])
		}
	}
	// Node 3 stops within what it holds: after the end of the last block
	// it was granted before the heal (the lag allowed, and a slot's grace),
	// nginx hears nothing from it until the heal.
	var refused time.Time
	late := 0
	for _, a := range all {
		switch {
		case strings.Contains(a.path, "/refuse/"):
			refused = a.at
		case a.status != 200:
			t.Errorf("nginx answered %s from node %d %d: its own quota refused it", a.path, a.node, a.status)
		}
		if a.node == 3 && a.at.After(held.Add(100*time.Millisecond)) && a.at.Before(healAt) {
			late++
		}
	}
	t.Logf("node 3 held slots until %v into its cut", held.Sub(cutAt))
	if late > 0 {
		t.Errorf("node 3, cut off from etcd, sent %d requests past the slots it held", late)
	}
	checkPaused(t, all, pausedAt, throttled, refused)
}

// checkPaused checks that every node recorded the pause after the 429,
// and that past the requests already on their way no node sent inside it
// (Retry-After: 2).
func checkPaused(t *testing.T, all []fleetArrival, pausedAt [3]time.Time, throttled, refused time.Time) {
	t.Helper()
	if throttled.IsZero() || refused.IsZero() {
		t.Fatalf("no node recorded the 429 (nginx logged it: %v)", !refused.IsZero())
	}
	var last time.Time
	for i, at := range pausedAt {
		if at.IsZero() {
			t.Errorf("node %d recorded no pause after the 429", i+1)
		}
		last = later(last, at)
	}
	t.Logf("429 recorded at %s; last node's pause record %v later", throttled.Format(time.RFC3339Nano), last.Sub(throttled))
	inPause := 0
	for _, a := range all {
		if a.at.After(refused.Add(200*time.Millisecond)) && a.at.Before(refused.Add(2*time.Second)) {
			inPause++
		}
	}
	if inPause > 0 {
		t.Errorf("the fleet sent %d requests inside the pause a 429 asked for", inPause)
	}
}

func mustDuration(t *testing.T, s string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(s)
	if err != nil {
		t.Errorf("duration %q: %v", s, err)
	}
	return d
}
