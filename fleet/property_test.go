package fleet_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/fleet"
	"github.com/auditd/auditd/internal/etcdtest"
)

// demand is one node's takers: how many, how long each rests after a take,
// and when they start.
type demand struct {
	takers int
	rest   time.Duration
	start  time.Duration
}

// TestFleetNeverExceedsTheLimit runs nodes, each with its own etcd client
// (on its own member) and Slots, whose takers take slots as they come, and
// checks the union of every take against the told limit in every sliding
// window. It reports utilisation: takes over what the limit allowed.
func TestFleetNeverExceedsTheLimit(t *testing.T) {
	c := etcdtest.Start(t, 3)
	for _, tc := range []struct {
		name  string
		nodes []demand
	}{
		{"EveryNodeAtFullPace", []demand{{takers: 4}, {takers: 4}, {takers: 4}}},
		{"UnevenDemand", []demand{{takers: 4}, {takers: 1, rest: 20 * time.Millisecond}, {takers: 2, start: time.Second}}},
	} {
		t.Run(tc.name, func(t *testing.T) { checkFleet(t, c, tc.name, tc.nodes) })
	}
}

func checkFleet(t *testing.T, c *etcdtest.Cluster, key string, nodes []demand) {
	rate := fleet.Rate{Limit: 200, Window: time.Second}
	const run = 3 * time.Second

	var (
		mu     sync.Mutex
		takes  []time.Time
		blocks []fleet.Block
	)
	record := func(e fleet.Event) {
		if e.Kind == fleet.EventReserved {
			mu.Lock()
			blocks = append(blocks, e.Block)
			mu.Unlock()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), run)
	defer cancel()
	var wg sync.WaitGroup
	var all []*fleet.Slots
	for n, d := range nodes {
		st := fleet.NewStore(etcdtest.NewClient(t, c.Endpoints()[n%len(c.Members)]), clock.Real{}, "")
		s, err := fleet.NewSlots(st, clock.Real{}, fleet.Config{Key: key, Rate: rate, Notify: record})
		if err != nil {
			t.Fatal(err)
		}
		s.Open()
		all = append(all, s)
		for range d.takers {
			wg.Go(func() {
				_ = clock.Sleep(ctx, clock.Real{}, d.start)
				for ctx.Err() == nil {
					if at, ok := take(ctx, s); ok {
						mu.Lock()
						takes = append(takes, at)
						mu.Unlock()
						_ = clock.Sleep(ctx, clock.Real{}, d.rest)
					}
				}
			})
		}
	}
	wg.Wait()
	for _, s := range all {
		if err := s.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}

	assertDisjoint(t, blocks)
	slices.SortFunc(takes, time.Time.Compare)
	if most, at := busiestWindow(takes, rate.Window); most > rate.Limit {
		t.Fatalf("%d takes in the window from %v, limit %d", most, at, rate.Limit)
	}
	var used, reserved, wasted int64
	for i, s := range all {
		st := s.Stats()
		if st.Used > st.Reserved {
			t.Fatalf("node %d used %d of %d reserved", i, st.Used, st.Reserved)
		}
		used, reserved, wasted = used+st.Used, reserved+st.Reserved, wasted+st.Wasted
	}
	if len(takes) < 2 {
		t.Fatalf("%d takes: the fleet handed out nothing", len(takes))
	}
	if int64(len(takes)) != used {
		t.Fatalf("%d takes recorded, %d counted", len(takes), used)
	}
	span := takes[len(takes)-1].Sub(takes[0])
	allowed := float64(rate.Limit) * span.Seconds() / rate.Window.Seconds()
	guarded := rate.Window.Seconds() / (rate.Window + fleet.DefaultGrace + fleet.DefaultMaxSkew).Seconds()
	t.Logf("utilisation %.1f%% of the limit (the guard caps it at %.1f%%): %d takes in %v; reserved %d, wasted %d, %d blocks",
		100*float64(len(takes)-1)/allowed, 100*guarded, len(takes), span.Round(time.Millisecond), reserved, wasted, len(blocks))
}

// take waits for a slot of s and takes it, returning the time it was taken
// at; false when ctx ended or another taker got there first.
func take(ctx context.Context, s *fleet.Slots) (time.Time, bool) {
	now := time.Now()
	at, ok := s.Earliest(now, 1)
	if !ok {
		select {
		case <-s.Changed():
		case <-ctx.Done():
		}
		return time.Time{}, false
	}
	if d := at.Sub(now); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		return time.Time{}, false
	}
	return now, s.Take(now, 1)
}

// busiestWindow returns the most of sorted times in any half-open window
// [t, t+w), and where that window starts.
func busiestWindow(times []time.Time, w time.Duration) (int, time.Time) {
	most, at, j := 0, time.Time{}, 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) < w {
			j++
		}
		if j-i > most {
			most, at = j-i, times[i]
		}
	}
	return most, at
}
