package pack

import (
	"fmt"

	"github.com/auditd/auditd"
)

// leafFeed hands the events verifyLeaves decodes to the workbook's check,
// which would otherwise read and decode every leaf a second time (a third
// of a verification's work for a million events). The workbook's reads
// of the runs' ranges come in increasing order for one run, and for runs
// that do not overlap; a read that starts before what the feed has
// already passed reads the leaves itself.
type leafFeed struct {
	ch    chan []auditd.Event
	stop  chan struct{} // closed by the consumer: nothing more is wanted
	batch []auditd.Event
	buf   []auditd.Event // the consumer's current batch, unread part
	pos   uint64         // the seq of the next event the feed gives
}

const feedBatch = 512

func newLeafFeed(first uint64) *leafFeed {
	return &leafFeed{ch: make(chan []auditd.Event, 4), stop: make(chan struct{}), pos: first}
}

// publish is the producer's: it adds e (copied) to the feed, and reports
// false once the consumer wants no more.
func (f *leafFeed) publish(e *auditd.Event) bool {
	f.batch = append(f.batch, *e)
	if len(f.batch) < feedBatch {
		return true
	}
	return f.flush()
}

func (f *leafFeed) flush() bool {
	if len(f.batch) == 0 {
		return true
	}
	select {
	case f.ch <- f.batch:
		f.batch = make([]auditd.Event, 0, feedBatch)
		return true
	case <-f.stop:
		return false
	}
}

// end is the producer's last call: the feed has no more events.
func (f *leafFeed) end() {
	f.flush()
	close(f.ch)
}

// done is the consumer's last call.
func (f *leafFeed) done() { close(f.stop) }

// scan gives fn the events from..to (to 0: to the end) from the feed; ok
// is false when the feed has already passed from.
func (f *leafFeed) scan(from, to uint64, fn func(*auditd.Event) error) (ok bool, err error) {
	if from < f.pos {
		return false, nil
	}
	for {
		if len(f.buf) == 0 {
			b, more := <-f.ch
			if !more {
				if to != 0 && f.pos <= to {
					return true, fmt.Errorf("%s: the leaves end before event %d", FileLeaves, f.pos)
				}
				return true, nil
			}
			f.buf = b
		}
		e := &f.buf[0]
		if to != 0 && e.Seq > to {
			return true, nil
		}
		f.buf, f.pos = f.buf[1:], e.Seq+1
		if e.Seq < from {
			continue
		}
		if err := fn(e); err != nil {
			return true, err
		}
	}
}
