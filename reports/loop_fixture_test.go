package reports_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/reports"
)

// loop.ndjson is a run of the real fetch loop (written by the fetch
// package's TestLoopFixture, go test ./fetch -run TestLoopFixture -update):
// a paged item, throttled and retried requests, the breaker opening on
// 503s and probing, items served from another run's copies and one failed. Its reconciliation balances and is
// golden.
func TestReconcile_LoopFixture(t *testing.T) {
	r := reports.NewReconciler(newMemLedger(loadFixture(t, "loop.ndjson")))
	r.Hash = testHash
	rep, err := r.Reconcile(context.Background(), fixtureRun, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Balanced {
		t.Errorf("a run of the loop does not balance: failed %v", rep.Failed())
	}
	c := rep.Counts
	if c.Queued != 8 || c.Succeeded != 1 || c.Cached != 6 || c.Failed != 1 || c.Throttles == 0 || c.Retries == 0 || c.BreakerOpens == 0 || rep.Run.Status != "partial" {
		t.Errorf("run %s, counts %+v: not the scenario's", rep.Run.Status, c)
	}
	if len(rep.Cached) != 6 {
		t.Fatalf("%d items served from cache, want 6", len(rep.Cached))
	}
	for _, ci := range rep.Cached {
		if ci.OriginRun != "01JQ8Z6X0RUN00000000000009" || !ci.AgeKnown() || ci.Age <= 0 {
			t.Errorf("cached item %+v: want the first run's copy, of known age", ci)
		}
	}
	var buf bytes.Buffer
	if err := reports.WriteJSON(&buf, rep); err != nil {
		t.Fatal(err)
	}
	goldenCompare(t, "loop.reconciliation.json", buf.Bytes())
}

// fixtureFields reads a fixture's lines and returns, per event type, the
// fields its lines set.
func fixtureFields(t *testing.T, name string) map[string]map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(testdataDir(), name))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var line map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &line); err != nil {
			t.Fatal(err)
		}
		var typ string
		json.Unmarshal(line["type"], &typ)
		if out[typ] == nil {
			out[typ] = map[string]bool{}
		}
		for k := range line {
			out[typ][k] = true
		}
	}
	return out
}

// The hand-written clean fixture holds only what the loop writes: for each
// type the loop's fixture has, every field clean.ndjson sets on it is one
// the loop set on it too, but for the fields a run on a fake clock against
// this scenario cannot show (latency is zero on a fake clock; no gateway
// group, no body error). Fixtures may not invent records the loop never
// makes (waits without the attempt they held back, say).
func TestCleanFixtureHoldsWhatTheLoopWrites(t *testing.T) {
	loop, clean := fixtureFields(t, "loop.ndjson"), fixtureFields(t, "clean.ndjson")
	unseen := map[string]bool{"latency": true, "group": true, "body_error": true, "run": true}
	unseenOf := map[string]string{"throttle": "page"} // the scenario throttles no page after the first
	for typ, fields := range clean {
		got, ok := loop[typ]
		if !ok {
			continue // a type the scenario does not reach (shed, run.resumed, ...)
		}
		var extra []string
		for f := range fields {
			if !got[f] && !unseen[f] && unseenOf[typ] != f {
				extra = append(extra, f)
			}
		}
		sort.Strings(extra)
		if len(extra) > 0 {
			t.Errorf("clean.ndjson sets %v on %s, which the loop never does", extra, typ)
		}
	}
	for _, typ := range []string{"wait", "dispatch", "throttle", "response", "cache.served", "item.finished", "breaker", "registry.changed"} {
		if loop[typ] == nil {
			t.Errorf("the loop's fixture has no %s: the comparison misses it", typ)
		}
	}
	if !loop["wait"]["attempt"] || !clean["wait"]["attempt"] {
		t.Error("waits carry no attempt in one of the fixtures")
	}
}

// In both fixtures every wait carries the attempt of the dispatch it held
// back: the next dispatch of its item and page.
func TestFixtureWaitsCarryTheirAttempt(t *testing.T) {
	for _, name := range []string{"loop.ndjson", "clean.ndjson"} {
		t.Run(name, func(t *testing.T) {
			evs := loadFixture(t, name)
			waits := 0
			for i, e := range evs {
				if e.Type != auditd.EventWait {
					continue
				}
				waits++
				next := -1
				for j := i + 1; j < len(evs); j++ {
					if evs[j].Type == auditd.EventDispatch && evs[j].ItemKey == e.ItemKey && evs[j].Page == e.Page {
						next = j
						break
					}
				}
				switch {
				case next < 0:
					t.Errorf("wait %d (%s page %d) held back no dispatch", e.Seq, e.ItemKey, e.Page)
				case e.Attempt == 0 || evs[next].Attempt != e.Attempt:
					t.Errorf("wait %d (%s page %d) carries attempt %d; the dispatch it held back, %d, is attempt %d", e.Seq, e.ItemKey, e.Page, e.Attempt, evs[next].Seq, evs[next].Attempt)
				}
			}
			if waits == 0 {
				t.Fatal("no waits to check")
			}
		})
	}
}
