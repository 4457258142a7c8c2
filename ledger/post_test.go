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

// outcome is what a Post's then learned.
type outcome struct {
	events []auditd.Event
	err    error
}

// A posted event is stored before whatever is appended after Post returns,
// with its puts, and then learns it as stored.
func TestPostIsOrderedBeforeLaterAppends(t *testing.T) {
	db := MustOpenDB(t)
	mustCreateBucket(t, db, side)
	l := MustOpen(t, db, ledger.Options{})

	told := make(chan outcome, 1)
	err := l.Post([]auditd.Event{sampleEvent("r", 1)}, []ledger.Put{{Bucket: side, Key: []byte("k"), Value: []byte("v")}},
		func(got []auditd.Event, err error) { told <- outcome{slices.Clone(got), err} })
	if err != nil {
		t.Fatal(err)
	}
	after, err := l.Append(context.Background(), sampleEvent("r", 2))
	if err != nil {
		t.Fatal(err)
	}
	// The Append returned, so the posted event's group was decided before
	// it: then has been called already.
	var o outcome
	select {
	case o = <-told:
	default:
		t.Fatal("then not called by the time a later Append returned")
	}
	if o.err != nil || len(o.events) != 1 || o.events[0].Seq != 1 || after.Seq != 2 {
		t.Fatalf("posted event came back as %+v, %v; the append after it is %d", o.events, o.err, after.Seq)
	}
	stored, err := l.Event(1)
	if err != nil || stored != o.events[0] {
		t.Fatalf("event 1 stored as %+v, %v; then was told %+v", stored, err, o.events[0])
	}
	if v := get(t, db, side, "k"); v != "v" {
		t.Fatalf("posted put stored as %q", v)
	}
	mustVerify(t, db, l.PublicKey(), nil)
}

// Many posters and appenders at once: every posted event is stored once,
// and each poster's events are in the order it posted them.
func TestPostConcurrent(t *testing.T) {
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
				outcomes.Add(1)
				if err := l.Post([]auditd.Event{e}, nil, func(got []auditd.Event, err error) {
					defer outcomes.Done()
					if err != nil {
						t.Errorf("post: %v", err)
						return
					}
					mu.Lock()
					told[got[0].Seq] = got[0]
					mu.Unlock()
				}); err != nil {
					outcomes.Done()
					t.Error(err)
				}
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
		t.Fatalf("%d posted events told stored, want %d", len(told), posters*each)
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

// Post refuses what AppendWith refuses, before anything is queued, and
// then is never called for it.
func TestPostRefusesBadInput(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	never := func([]auditd.Event, error) { t.Error("then called for a refused post") }
	bad := sampleEvent("r", 1)
	bad.Type = ""
	for name, post := range map[string]func() error{
		"no events":     func() error { return l.Post(nil, nil, never) },
		"no then":       func() error { return l.Post([]auditd.Event{sampleEvent("r", 1)}, nil, nil) },
		"invalid event": func() error { return l.Post([]auditd.Event{bad}, nil, never) },
		"missing bucket": func() error {
			return l.Post([]auditd.Event{sampleEvent("r", 1)}, []ledger.Put{{Bucket: []byte("nope"), Key: []byte("k")}}, never)
		},
	} {
		if err := post(); auditd.ErrorCode(err) != auditd.EINVALID {
			t.Errorf("%s: %v, want EINVALID", name, err)
		}
	}
	if head, _ := l.Head(); head != 0 {
		t.Fatalf("head %d after refused posts", head)
	}
	if err := l.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := l.Post([]auditd.Event{sampleEvent("r", 1)}, nil, never); !errors.Is(err, ledger.ErrClosed) {
		t.Fatalf("post after close: %v, want ErrClosed", err)
	}
}

// A posted event whose group fails is told the error, and is not stored.
func TestPostToldOfFailedGroup(t *testing.T) {
	db := MustOpenDB(t)
	l := MustOpen(t, db, ledger.Options{})
	bad := sampleEvent("r", 0)
	bad.IdempotencyKey = strings.Repeat("k", bolt.MaxKeySize+1) // bbolt refuses the key
	told := make(chan outcome, 1)
	if err := l.Post([]auditd.Event{bad}, nil, func(got []auditd.Event, err error) { told <- outcome{slices.Clone(got), err} }); err != nil {
		t.Fatal(err)
	}
	o := <-told
	if o.err == nil || o.events != nil {
		t.Fatalf("then told %+v, %v; want an error", o.events, o.err)
	}
	if head, _ := l.Head(); head != 0 {
		t.Fatalf("head %d after a failed post", head)
	}
}
