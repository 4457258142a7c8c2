package limiter_test

import (
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
)

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func mustBudget(tb testing.TB, c clock.Clock, cfg limiter.BudgetConfig) *limiter.Budget {
	tb.Helper()
	b, err := limiter.NewBudget(c, cfg)
	if err != nil {
		tb.Fatalf("NewBudget: %v", err)
	}
	return b
}

func allow(tb testing.TB, b *limiter.Budget, cost int) limiter.Decision {
	tb.Helper()
	d, err := b.Allow(cost)
	if err != nil {
		tb.Fatalf("Allow(%d): %v", cost, err)
	}
	return d
}

func TestBudgetPacesBurstThenRate(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 3})
	for i := range 3 {
		if d := allow(t, b, 1); !d.Admitted {
			t.Fatalf("burst request %d refused: %+v", i, d)
		}
	}
	d := allow(t, b, 1)
	if d.Admitted || d.Gate != limiter.GateRate || d.RetryAfter != 100*time.Millisecond {
		t.Fatalf("4th request: %+v, want refused at rate for 100ms", d)
	}
	c.Advance(d.RetryAfter - time.Microsecond)
	if allow(t, b, 1).Admitted {
		t.Fatal("admitted a microsecond before its slot")
	}
	c.Advance(time.Microsecond)
	if !allow(t, b, 1).Admitted {
		t.Fatal("refused at its slot")
	}
}

// TestBudgetNoBoundaryBurst is the municipal failure: a fixed window lets 30
// at 11:59:59 and 30 at 12:00:00 through. The sliding window does not.
func TestBudgetNoBoundaryBurst(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 30, Window: time.Minute, Burst: 30})
	c.Advance(59 * time.Second)
	for range 30 {
		if !allow(t, b, 1).Admitted {
			t.Fatal("first 30 refused")
		}
	}
	c.Advance(time.Second) // a fixed window would reset here
	d := allow(t, b, 1)
	if d.Admitted || d.RetryAfter != 59*time.Second {
		t.Fatalf("after the boundary: %+v, want refused for 59s", d)
	}
}

func TestBudgetCost(t *testing.T) {
	for _, tt := range []struct {
		name string
		cost int
		err  error
	}{
		{"AboveBurstErrorsAtOnce", 6, limiter.ErrCostExceedsCapacity},
		{"Zero", 0, limiter.ErrInvalidCost},
		{"Negative", -1, limiter.ErrInvalidCost},
	} {
		t.Run(tt.name, func(t *testing.T) {
			b := mustBudget(t, clock.NewFake(epoch), limiter.BudgetConfig{Limit: 100, Window: time.Second, Burst: 5})
			if _, err := b.Allow(tt.cost); !errors.Is(err, tt.err) {
				t.Fatalf("Allow(%d) = %v, want %v", tt.cost, err, tt.err)
			}
			if _, err := b.Delay(tt.cost); !errors.Is(err, tt.err) {
				t.Fatalf("Delay(%d) = %v, want %v", tt.cost, err, tt.err)
			}
		})
	}
	t.Run("CostChargesTokens", func(t *testing.T) {
		c := clock.NewFake(epoch)
		b := mustBudget(t, c, limiter.BudgetConfig{Limit: 100, Window: time.Second, Burst: 5})
		if !allow(t, b, 5).Admitted {
			t.Fatal("full-capacity cost refused")
		}
		d := allow(t, b, 2)
		if d.Admitted || d.RetryAfter != 20*time.Millisecond {
			t.Fatalf("%+v, want refused for 2 tokens at 10ms each", d)
		}
	})
}

func TestBudgetSetLimitOnlySlows(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 10})
	// A server claiming 1000/s must not raise the configured 10/s.
	if err := b.SetLimit(1000, time.Second); err != nil {
		t.Fatal(err)
	}
	n := 0
	for allow(t, b, 1).Admitted {
		n++
	}
	if n != 10 {
		t.Fatalf("admitted %d in one instant, want the ceiling's 10", n)
	}
	// Tightening to 2 per second: the ceiling's window still holds the 10.
	if err := b.SetLimit(2, time.Second); err != nil {
		t.Fatal(err)
	}
	c.Advance(999 * time.Millisecond)
	if allow(t, b, 1).Admitted {
		t.Fatal("admitted inside the ceiling's window that already holds 10")
	}
	c.Advance(time.Millisecond)
	if d := allow(t, b, 1); !d.Admitted {
		t.Fatalf("refused after the window slid: %+v", d)
	}
	if d := allow(t, b, 1); !d.Admitted {
		t.Fatalf("second of the learned burst of 2 refused: %+v", d)
	}
	if d := allow(t, b, 1); d.Admitted || d.RetryAfter != time.Second {
		t.Fatalf("%+v, want held 1s by the learned window of 2 per second", d)
	}
	// A cost over the learned limit (a cut can come after the cost was
	// accepted) is no error: it goes alone in the learned window, at the
	// learned pace (one token beyond the learned bucket's 2, 500ms).
	d := allow(t, b, 3)
	if d.Admitted || d.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("cost 3 over a learned limit of 2: %+v, want held 1.5s", d)
	}
	c.Advance(d.RetryAfter - time.Microsecond)
	if allow(t, b, 3).Admitted {
		t.Fatal("cost 3 admitted before its slot")
	}
	c.Advance(time.Microsecond)
	if d := allow(t, b, 3); !d.Admitted {
		t.Fatalf("cost 3 refused at its slot: %+v", d)
	}
}

func TestBudgetSlowerLimitCountsFromTheCut(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 1000, Window: time.Second, Burst: 1})
	if err := b.SetLimit(20, time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 20 { // a full learned window at 20 a second
		if d := allow(t, b, 1); !d.Admitted {
			t.Fatalf("admission %d refused: %+v", i, d)
		}
		c.Advance(50 * time.Millisecond)
	}
	// A cut to 10 a second: the 20 admitted at the old pace were within the
	// limit then, so the new window does not hold them against the source;
	// the pace does: one interval of the new limit, then steady.
	if err := b.SetLimit(10, time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if d := allow(t, b, 1); !d.Admitted {
			t.Fatalf("admission %d after the cut refused: %+v", i, d)
		}
		if d := allow(t, b, 1); d.Admitted || d.RetryAfter != 100*time.Millisecond {
			t.Fatalf("%+v, want held one interval of 10 a second", d)
		}
		c.Advance(100 * time.Millisecond)
	}
	// A rise counts what the window already holds: no burst opens.
	if err := b.SetLimit(30, time.Second); err != nil {
		t.Fatal(err)
	}
	n := 0
	for allow(t, b, 1).Admitted {
		n++
	}
	if n != 1 {
		t.Fatalf("admitted %d at once after a rise, want 1 (burst 1)", n)
	}
}

func TestBudgetPauseTakesLater(t *testing.T) {
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 10})
	if got := b.Pause(epoch.Add(30 * time.Second)); !got.Equal(epoch.Add(30 * time.Second)) {
		t.Fatalf("pause = %v", got)
	}
	if got := b.Pause(epoch.Add(10 * time.Second)); !got.Equal(epoch.Add(30 * time.Second)) {
		t.Fatalf("a shorter pause shortened it to %v", got)
	}
	d := allow(t, b, 1)
	if d.Admitted || d.Gate != limiter.GatePause || d.RetryAfter != 30*time.Second {
		t.Fatalf("%+v, want refused at pause for 30s", d)
	}
}

func TestBudgetConstrain(t *testing.T) {
	t.Run("RemainingZeroPausesForReset", func(t *testing.T) {
		c := clock.NewFake(epoch)
		b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 10})
		b.Constrain(0, 7*time.Second)
		if d := allow(t, b, 1); d.Gate != limiter.GatePause || d.RetryAfter != 7*time.Second {
			t.Fatalf("%+v", d)
		}
	})
	t.Run("RemainingDrainsBucket", func(t *testing.T) {
		c := clock.NewFake(epoch)
		b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 10})
		b.Constrain(2, time.Second)
		n := 0
		for allow(t, b, 1).Admitted {
			n++
		}
		if n != 2 {
			t.Fatalf("admitted %d, want the server's remaining 2", n)
		}
	})
	t.Run("RemainingAboveCapacityChangesNothing", func(t *testing.T) {
		c := clock.NewFake(epoch)
		b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 4})
		b.Constrain(5000, time.Second)
		if got := b.Tokens(); got != 4 {
			t.Fatalf("tokens = %v, want 4", got)
		}
	})
}

func TestNewBudgetRejects(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  limiter.BudgetConfig
	}{
		{"ZeroLimit", limiter.BudgetConfig{Window: time.Second}},
		{"ZeroWindow", limiter.BudgetConfig{Limit: 1}},
		{"HugeWindow", limiter.BudgetConfig{Limit: 1, Window: limiter.MaxWindow + 1}},
		{"NegativeBurst", limiter.BudgetConfig{Limit: 1, Window: time.Second, Burst: -1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := limiter.NewBudget(clock.NewFake(epoch), tt.cfg); !errors.Is(err, limiter.ErrInvalidConfig) {
				t.Fatalf("err = %v", err)
			}
		})
	}
}

// simulate drives n requests of random cost through a budget on a fake
// clock, moving time by random steps (sometimes to exactly the announced
// RetryAfter), and checks the two properties on every step:
//   - no window of length W holds more than L admitted units;
//   - a refused request is admitted at now+RetryAfter, and not 1ns before.
func simulate(t *testing.T, seed uint64, n int, cfg limiter.BudgetConfig) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	c := clock.NewFake(epoch)
	b := mustBudget(t, c, cfg)
	type adm struct {
		at   time.Time
		cost int
	}
	var log []adm // admissions inside the last window
	sum := 0
	maxCost := min(cfg.Burst, cfg.Limit)
	for i := 0; i < n; i++ {
		cost := 1 + r.IntN(maxCost)
		if r.IntN(4) == 0 {
			cost = 1
		}
		d := allow(t, b, cost)
		if !d.Admitted {
			if d.RetryAfter <= 0 {
				t.Fatalf("step %d: refused with RetryAfter %v", i, d.RetryAfter)
			}
			if r.IntN(2) == 0 {
				// Exactly the honest Retry-After: 1ns before is refused,
				// then it is admitted on the dot.
				c.Advance(d.RetryAfter - time.Nanosecond)
				if early := allow(t, b, cost); early.Admitted {
					t.Fatalf("step %d: admitted %v before its slot", i, time.Nanosecond)
				}
				c.Advance(time.Nanosecond)
				if d = allow(t, b, cost); !d.Admitted {
					t.Fatalf("step %d: refused at its announced slot: %+v", i, d)
				}
			} else {
				c.Advance(time.Duration(r.Int64N(int64(d.RetryAfter))))
				continue
			}
		}
		now := c.Now()
		log = append(log, adm{now, cost})
		sum += cost
		for len(log) > 0 && !log[0].at.After(now.Add(-cfg.Window)) {
			sum -= log[0].cost
			log = log[1:]
		}
		if sum > cfg.Limit {
			t.Fatalf("step %d: %d units in the window ending %v, limit %d", i, sum, now.Sub(epoch), cfg.Limit)
		}
		if r.IntN(3) == 0 {
			c.Advance(time.Duration(r.Int64N(int64(cfg.Window) / int64(cfg.Limit) * 2)))
		}
	}
}

// TestBudgetPropertyMillion runs 10^6 simulated requests (10^5 with -short,
// which the race build uses: go test -race -short). Run the full count
// under the race detector with: go test -race -run PropertyMillion ./limiter/
func TestBudgetPropertyMillion(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	simulate(t, 1, n, limiter.BudgetConfig{Limit: 100, Window: time.Second, Burst: 20})
}

// Admissions recorded from before a restart count against the windows: a
// budget rebuilt mid-window admits only what the window has left, and the
// rest once the recorded admissions have aged out.
func TestBudgetRecordCountsPastAdmissions(t *testing.T) {
	c := clock.NewFake(epoch)
	before := c.Now()
	c.Advance(400 * time.Millisecond) // the restart took 400 ms
	b := mustBudget(t, c, limiter.BudgetConfig{Limit: 10, Window: time.Second, Burst: 10})
	for i := range 8 {
		b.Record(before.Add(time.Duration(i)*time.Millisecond), 1)
	}
	b.Record(before.Add(-time.Hour), 1) // older than what it holds: not counted
	admitted := 0
	for allow(t, b, 1).Admitted {
		admitted++
	}
	if admitted != 2 {
		t.Fatalf("admitted %d in the window that already held 8 of 10", admitted)
	}
	d := allow(t, b, 1)
	if want := 600 * time.Millisecond; d.RetryAfter != want {
		t.Fatalf("retry after %v, want %v: when the first recorded admission leaves the window", d.RetryAfter, want)
	}
	c.Advance(d.RetryAfter)
	if !allow(t, b, 1).Admitted {
		t.Fatal("refused once the recorded admissions aged out")
	}
}
