package limiter_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/auditd/auditd/limiter"
)

// A request's dispatch is recorded after the gates admit it. Counted where
// the record puts it, a request admitted 30 ms before its record holds its
// slot of the window until 30 ms after the admission would have: the
// request admitted as that slot frees must not share a window with it.
func TestSentCountsTheRequestAtItsRecord(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 10, Window: time.Second, Burst: 10, Concurrency: 100}})
	b, err := l.Budget("s")
	if err != nil {
		t.Fatal(err)
	}
	first := mustAcquire(t, l, "s")
	c.Advance(30 * time.Millisecond)
	first.Sent(c.Now())
	for range 9 {
		mustAcquire(t, l, "s").Sent(c.Now())
	}
	c.Advance(970 * time.Millisecond) // a second after the first admission
	if d, _ := b.Delay(1); d != 30*time.Millisecond {
		t.Fatalf("a second after the first admission: wait %v, want 30ms (a second after its record)", d)
	}
	c.Advance(30 * time.Millisecond)
	if d, _ := b.Delay(1); d != 0 {
		t.Fatalf("a second after the first record: wait %v, want none", d)
	}
}

// Sent never counts a request before its admission nor after now, and a
// second call moves it on from where the first left it.
func TestSentClampsToAdmissionAndNow(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 1, Window: time.Second, Burst: 1, Concurrency: 100}})
	b, err := l.Budget("s")
	if err != nil {
		t.Fatal(err)
	}
	p := mustAcquire(t, l, "s")
	p.Sent(c.Now().Add(-time.Hour)) // before the admission: stays where it is
	c.Advance(100 * time.Millisecond)
	p.Sent(c.Now().Add(time.Hour)) // after now: counted at now, 100 ms
	c.Advance(900 * time.Millisecond)
	if d, _ := b.Delay(1); d != 100*time.Millisecond {
		t.Fatalf("wait %v, want 100ms: a record in the future counts from now", d)
	}
	c.Advance(50 * time.Millisecond)
	p.Sent(c.Now()) // moved again, to 1.05 s
	c.Advance(50 * time.Millisecond)
	if d, _ := b.Delay(1); d != 950*time.Millisecond {
		t.Fatalf("wait %v, want 950ms: the request counts from its second move", d)
	}
}

// Requests whose records lag their admissions by anything short of the
// window, as a busy commit group or a slow disk make them, never put more
// than the limit in force into any window of recorded times: the property
// reconciliation's R9 checks. Without Sent, a lag that shrinks from one
// request to the next breaks it at every turn of the window. (With lags up
// to two windows it breaks: an admission whose slot freed while an older
// one was still unrecorded; limiter/doc.go.)
func TestSentKeepsEveryWindowOfRecordsWithinTheLimit(t *testing.T) {
	const ceiling, learned, window = 20, 15, time.Second
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: ceiling, Window: window, Burst: 5, Concurrency: 1000}})
	if err := l.SetLimit("s", learned, window); err != nil {
		t.Fatal(err)
	}
	b, err := l.Budget("s")
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(7, 11))
	type unsent struct {
		p  *limiter.Permit
		at time.Time // when its record is made
	}
	var waiting []unsent
	var records []time.Time
	n := 20_000
	if testing.Short() {
		n = 5_000
	}
	for len(records) < n {
		now := c.Now()
		waiting = slices.DeleteFunc(waiting, func(u unsent) bool {
			if u.at.After(now) {
				return false
			}
			u.p.Sent(u.at)
			u.p.Release()
			records = append(records, u.at)
			return true
		})
		if d, _ := b.Delay(1); d == 0 && r.IntN(3) != 0 {
			lag := time.Duration(r.Int64N(int64(window)))
			waiting = append(waiting, unsent{mustAcquire(t, l, "s"), now.Add(lag)})
			continue
		}
		step := time.Duration(1 + r.Int64N(int64(window/learned)))
		if d, _ := b.Delay(1); d > 0 && r.IntN(2) == 0 {
			step = d // exactly when the next slot frees
		}
		for _, u := range waiting {
			step = min(step, u.at.Sub(now))
		}
		c.Advance(max(step, time.Nanosecond))
	}
	slices.SortFunc(records, func(a, b time.Time) int { return a.Compare(b) })
	for i, lo := 0, 0; i < len(records); i++ {
		for !records[lo].After(records[i].Add(-window)) {
			lo++
		}
		if in := i - lo + 1; in > learned {
			t.Fatalf("record %d: %d records in the window ending %v, limit %d", i, in, records[i].Sub(epoch), learned)
		}
	}
}

// An admission at the very instant of a slower retune is counted by the
// learned window from the cut, and leaves it a window later: the cut does
// not keep a unit of it for good.
func TestSlowerRetuneAtTheAdmissionsInstantLeavesNoCount(t *testing.T) {
	l, c := newLimiter(t, map[string]limiter.Config{"s": {Limit: 10, Window: time.Second, Burst: 10, Concurrency: 100}})
	b, err := l.Budget("s")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetLimit("s", 8, time.Second); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, l, "s").Release()
	if err := l.SetLimit("s", 5, time.Second); err != nil { // slower: counts from the cut
		t.Fatal(err)
	}
	mustAcquire(t, l, "s").Release() // the same instant as the first
	c.Advance(2 * time.Second)
	admitted := 0
	for range 5 {
		if d, _ := b.Allow(1); d.Admitted {
			admitted++
		}
	}
	if admitted != 5 {
		t.Fatalf("admitted %d of 5 two windows after the cut, want all: the learned window kept a count", admitted)
	}
}
