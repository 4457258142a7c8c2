package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/ledger"
	bolt "go.etcd.io/bbolt"
)

// outcome is what a Future's Then learned.
type outcome struct {
	events []auditd.Event
	err    error
}

// post adds events with puts and has Then tell the outcome on told.
func post(tb testing.TB, l *ledger.Ledger, events []auditd.Event, puts []auditd.Put, told chan<- outcome) {
	tb.Helper()
	f, err := l.Add(events, puts...)
	if err != nil {
		tb.Fatal(err)
	}
	f.Then(func(got []auditd.Event, err error) { told <- outcome{slices.Clone(got), err} })
}

// An event added without waiting is stored before whatever is appended
// after Add returns, with its puts, and Then learns it as stored.
func TestThenIsOrderedBeforeLaterAppends(t *testing.T) {
	db := MustOpenDB(t)
	mustCreateBucket(t, db, side)
	l := MustOpen(t, db, ledger.Options{})

	told := make(chan outcome, 1)
	post(t, l, []auditd.Event{sampleEvent("r", 1)}, []auditd.Put{{Bucket: side, Key: []byte("k"), Value: []byte("v")}}, told)
	after, err := l.Append(context.Background(), sampleEvent("r", 2))
	if err != nil {
		t.Fatal(err)
	}
	// The Append returned, so the added event's group was decided before
	// it: Then's function has been called already.
	var o outcome
	select {
	case o = <-told:
	default:
		t.Fatal("Then's function not called by the time a later Append returned")
	}
	if o.err != nil || len(o.events) != 1 || o.events[0].Seq != 1 || after.Seq != 2 {
		t.Fatalf("posted event came back as %+v, %v; the append after it is %d", o.events, o.err, after.Seq)
	}
	stored, err := l.Event(1)
	if err != nil || stored != o.events[0] {
		t.Fatalf("event 1 stored as %+v, %v; Then was told %+v", stored, err, o.events[0])
	}
	if v := get(t, db, side, "k"); v != "v" {
		t.Fatalf("added put stored as %q", v)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// Many adders that do not wait, and appenders, at once: every added event
// is stored once, and each adder's events are in the order it added them.
func TestThenConcurrent(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	const posters, each = 8, 50
	var mu sync.Mutex
	told := map[uint64]auditd.Event{}
	var wg, outcomes sync.WaitGroup
	for w := range posters {
		wg.Go(func() {
			for i := range each {
				e := sampleEvent("r", w*each+i)
				f, err := l.Add([]auditd.Event{e})
				if err != nil {
					t.Error(err)
					continue
				}
				outcomes.Add(1)
				f.Then(func(got []auditd.Event, err error) {
					defer outcomes.Done()
					if err != nil {
						t.Errorf("add: %v", err)
						return
					}
					mu.Lock()
					told[got[0].Seq] = got[0]
					mu.Unlock()
				})
				if i%10 == 9 {
					if _, err := l.Append(context.Background(), sampleEvent("sync", i)); err != nil {
						t.Error(err)
					}
				}
			}
		})
	}
	wg.Wait()
	outcomes.Wait()
	if len(told) != posters*each {
		t.Fatalf("%d added events told stored, want %d", len(told), posters*each)
	}
	last := map[string]int{} // per poster (its item keys' range), the last index seen
	head, _ := l.Head()
	for seq := uint64(1); seq <= head; seq++ {
		e, err := l.Event(seq)
		if err != nil {
			t.Fatal(err)
		}
		if e.RunID != "r" {
			continue
		}
		if told[seq] != e {
			t.Fatalf("event %d stored as %+v, told %+v", seq, e, told[seq])
		}
		var i int
		if _, err := fmt.Sscanf(e.ItemKey, "parcels-%d", &i); err != nil {
			t.Fatal(err)
		}
		poster := fmt.Sprint(i / each)
		if prev, ok := last[poster]; ok && i <= prev {
			t.Fatalf("poster %s: item %d stored after %d", poster, i, prev)
		}
		last[poster] = i
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// Add refuses what would fail a commit group, before anything is queued,
// and after Close.
func TestAddRefusesBadInput(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	bad := sampleEvent("r", 1)
	bad.Type = ""
	for name, add := range map[string]func() error{
		"no events":     func() error { _, err := l.Add(nil); return err },
		"invalid event": func() error { _, err := l.Add([]auditd.Event{bad}); return err },
		"field of another type": func() error {
			_, err := l.Add([]auditd.Event{{Type: auditd.EventWait, Reason: "a wait has a gate"}})
			return err
		},
		"missing bucket": func() error {
			_, err := l.Add([]auditd.Event{sampleEvent("r", 1)}, auditd.Put{Bucket: []byte("nope"), Key: []byte("k")})
			return err
		},
	} {
		if err := add(); auditd.ErrorCode(err) != auditd.EINVALID {
			t.Errorf("%s: %v, want EINVALID", name, err)
		}
	}
	if head, _ := l.Head(); head != 0 {
		t.Fatalf("head %d after refused adds", head)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Add([]auditd.Event{sampleEvent("r", 1)}); !errors.Is(err, ledger.ErrClosed) {
		t.Fatalf("add after close: %v, want ErrClosed", err)
	}
}

// An added event whose group fails: Then is told the error, Wait returns
// it, and the event is not stored.
func TestThenToldOfFailedGroup(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	bad := sampleEvent("r", 0)
	bad.IdempotencyKey = strings.Repeat("k", bolt.MaxKeySize+1) // bbolt refuses the key
	told := make(chan outcome, 1)
	post(t, l, []auditd.Event{bad}, nil, told)
	o := <-told
	if o.err == nil || o.events != nil {
		t.Fatalf("Then told %+v, %v; want an error", o.events, o.err)
	}
	f, err := l.Add([]auditd.Event{bad})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Wait(context.Background()); err == nil {
		t.Fatal("Wait on a failed group returned no error")
	}
	if head, _ := l.Head(); head != 0 {
		t.Fatalf("head %d after a failed add", head)
	}
}
