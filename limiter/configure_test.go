package limiter_test

import (
	"math"
	"testing"
	"time"

	"github.com/auditd/auditd/limiter"
)

// A source configured again (its operator put it again, with the same
// limits or new ones) keeps what its gates hold: the admissions inside its
// window and a throttle's pause. Starting over would let a window's quota
// go a second time, and send into a pause the server asked for.
func TestConfigureAgainKeepsWindowAndPause(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  limiter.Config
	}{
		{"Same", limiter.Config{Limit: 2, Window: time.Second, Burst: 2}},
		{"Slower", limiter.Config{Limit: 3, Window: 2 * time.Second, Burst: 2}},
		{"Faster", limiter.Config{Limit: 4, Window: time.Second, Burst: 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 2, Window: time.Second, Burst: 2}})
			mustAcquire(t, l, "s").Release()
			mustAcquire(t, l, "s").Release()
			c.Advance(100 * time.Millisecond)
			if err := l.Configure("s", tt.cfg); err != nil {
				t.Fatal(err)
			}
			b, err := l.Budget("s")
			if err != nil {
				t.Fatal(err)
			}
			// Two admitted 100 ms ago, at 2 a second with a bucket of 2: 0.2
			// tokens left, and the window full until a second after them.
			// The tokens owed carry over in tokens, paid back at the new pace.
			if st, _ := l.State("s"); math.Abs(st.Tokens-0.2) > 1e-6 {
				t.Fatalf("%.6f tokens after configuring again, want 0.2", st.Tokens)
			}
			want := map[string]time.Duration{
				"Same":   900 * time.Millisecond, // the window: both leave at 1 s
				"Slower": 533333334,              // the bucket: 0.8 tokens at 1.5 a second (the window of 2 s holds 2 of 3)
				"Faster": 200 * time.Millisecond, // the bucket: 0.8 tokens at 4 a second
			}[tt.name]
			if d, _ := b.Delay(1); d != want {
				t.Fatalf("wait %v after configuring again, want %v", d, want)
			}
			l.Pause("s", c.Now().Add(time.Minute))
			if err := l.Configure("s", tt.cfg); err != nil {
				t.Fatal(err)
			}
			if st, _ := l.State("s"); !st.PausedUntil.Equal(c.Now().Add(time.Minute)) {
				t.Fatalf("paused until %v after configuring again, want a minute from now", st.PausedUntil)
			}
		})
	}
}
