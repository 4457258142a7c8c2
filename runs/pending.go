package runs

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/auditd/auditd"
	bolt "go.etcd.io/bbolt"
)

// A pending page: a page of an open batch run's items too large to hold
// in memory (an NDJSON body streamed in) is stored a chunk at a time, each
// in a transaction of its own, after the run's last item, and becomes the
// run's at once when it is committed; until then nothing reads it, and if
// it is aborted, or the service stops first, it is deleted.
//
// Its chunks are stored as a page's are (putPage: items, key index, sealed
// paths), so a key that repeats one of the run's or of an earlier chunk is
// refused as a page's would be. While it is pending the store records,
// in bucketPendingPages, the index of its first item: the views stop
// short of it (Store.hidden), and Resume deletes what a stop left from it
// on. Committing deletes that record; the run's item count, which the
// store counts from its pages (pagedCount), then includes the page.
var bucketPendingPages = []byte("runs.pendingpages") // run id -> index of the pending page's first item (uint32 BE)

// PendingPage is a page of items being added to an open batch run (see
// above). Its methods are for one goroutine; the run takes no other page
// until Commit or Abort.
type PendingPage struct {
	s     *Store
	r     *Live
	from  uint32 // the index of its first item
	n     int    // items stored so far
	ended bool
}

// BeginItems starts a pending page of r, an open batch run. The caller
// must end it with Commit or Abort.
func (s *Store) BeginItems(r *Live) (*PendingPage, error) {
	r.adding.Lock()
	run := r.Run()
	if err := checkAddable(r.id, run, 0); err != nil {
		r.adding.Unlock()
		return nil, err
	}
	if err := s.dropPending(r.id); err != nil { // what a failed Abort left
		r.adding.Unlock()
		return nil, err
	}
	p := &PendingPage{s: s, r: r, from: uint32(run.ItemCount)}
	s.mu.Lock()
	s.pending[r.id] = p.from
	s.mu.Unlock()
	return p, nil
}

// checkAddable says why run id, as run, cannot take n more items, if it
// cannot.
func checkAddable(id string, run auditd.Run, n int) error {
	switch {
	case run.Mode == auditd.RunProxy:
		return auditd.Errorf(auditd.ECONFLICT, "Run %s is a proxy-mode run: its items are the requests sent through the proxy route.", id)
	case !run.Open:
		return auditd.Errorf(auditd.ECONFLICT, "Run %s takes no more items: it was submitted whole, or finished.", id)
	case run.ItemCount+n > MaxItemsInRun:
		return auditd.Errorf(auditd.ECONFLICT, "Run %s would hold more than %d items, the most a run may; finish it and create another.", id, MaxItemsInRun)
	}
	return nil
}

// Add stores items, the page's next chunk, in one transaction. A key the
// run or the page has already is EINVALID naming the item as field
// "items[i].key", i its index in items; nothing of the chunk is stored
// then, and the page is to be aborted.
func (p *PendingPage) Add(items []auditd.Item) error {
	if p.ended {
		return fmt.Errorf("pending page of run %s has ended", p.r.id)
	}
	run := p.r.Run()
	if err := checkAddable(p.r.id, run, p.n+len(items)); err != nil {
		return err
	}
	at := p.from + uint32(p.n)
	err := p.s.db.Update(func(tx *bolt.Tx) error {
		if p.n == 0 {
			if err := tx.Bucket(bucketPendingPages).Put([]byte(p.r.id), binary.BigEndian.AppendUint32(nil, p.from)); err != nil {
				return err
			}
		}
		if err := putPage(tx, p.r.id, at, items, "items"); err != nil {
			return err
		}
		return p.s.putSendPaths(tx, p.r.id, items)
	})
	if auditd.ErrorCode(err) == auditd.EINVALID {
		return err
	} else if err != nil {
		return fmt.Errorf("store items of run %s: %w", p.r.id, err)
	}
	p.n += len(items)
	return nil
}

// Len is how many items the page holds so far.
func (p *PendingPage) Len() int { return p.n }

// From is the index of the page's first item in the run.
func (p *PendingPage) From() uint32 { return p.from }

// Commit makes the page's items the run's, after those it has, in one
// transaction, and ends the page.
func (p *PendingPage) Commit() error {
	if p.ended {
		return fmt.Errorf("pending page of run %s has ended", p.r.id)
	}
	p.ended = true
	defer p.r.adding.Unlock()
	err := p.s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketPendingPages).Delete([]byte(p.r.id)) })
	if err != nil {
		if derr := p.s.dropPending(p.r.id); derr != nil {
			return fmt.Errorf("commit items of run %s: %w (and deleting them: %v)", p.r.id, err, derr)
		}
		p.s.forgetPending(p.r.id) // else the views still stop short of them
		return fmt.Errorf("commit items of run %s: %w", p.r.id, err)
	}
	p.r.mu.Lock()
	p.r.rec.ItemCount += p.n
	p.r.mu.Unlock()
	p.s.forgetPending(p.r.id)
	return nil
}

// Abort deletes what the page stored and ends it; it does nothing once
// the page has ended.
func (p *PendingPage) Abort() error {
	if p.ended {
		return nil
	}
	p.ended = true
	defer p.r.adding.Unlock()
	err := p.s.dropPending(p.r.id)
	if err == nil {
		p.s.forgetPending(p.r.id) // else the views still stop short of it
	}
	return err
}

func (s *Store) forgetPending(runID string) {
	s.mu.Lock()
	delete(s.pending, runID)
	s.mu.Unlock()
}

// hidden is the index from which run runID's items are a pending page's,
// which no view shows; ok is false when it has none.
func (s *Store) hidden(runID string) (from uint32, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	from, ok = s.pending[runID]
	return from, ok
}

// dropChunk is how many chunks of items one transaction of dropPending
// deletes, with their key index entries and sealed paths.
const dropChunk = 64

// dropPending deletes run runID's pending page, if it has one, a few
// chunks to a transaction, and then its record.
func (s *Store) dropPending(runID string) error {
	for {
		done := false
		err := s.db.Update(func(tx *bolt.Tx) error {
			v := tx.Bucket(bucketPendingPages).Get([]byte(runID))
			if len(v) != 4 {
				done = true
				return nil
			}
			from := binary.BigEndian.Uint32(v)
			n, err := dropPages(tx, runID, from, dropChunk)
			if err != nil || n > 0 {
				return err
			}
			done = true
			return tx.Bucket(bucketPendingPages).Delete([]byte(runID))
		})
		if err != nil {
			return fmt.Errorf("delete the pending items of run %s: %w", runID, err)
		}
		if done {
			return nil
		}
	}
}

// dropPages deletes up to most of run runID's chunks of items from index
// from on, with their items' key index entries and sealed paths, and says
// how many it deleted.
func dropPages(tx *bolt.Tx, runID string, from uint32, most int) (int, error) {
	pages, index, sent := tx.Bucket(bucketItemPages), tx.Bucket(bucketItemIndex), tx.Bucket(bucketSendPaths)
	prefix := append([]byte(runID), 0)
	var chunks [][]byte
	var keys [][]byte
	c := pages.Cursor()
	for k, v := c.Seek(itemKey(runID, from)); k != nil && bytes.HasPrefix(k, prefix) && len(chunks) < most; k, v = c.Next() {
		chunks = append(chunks, bytes.Clone(k))
		r, err := openChunk(v)
		for err == nil && len(r.b) > 0 {
			var it auditd.Item
			if err = r.item(&it); err == nil {
				keys = append(keys, namedKey(runID, it.Key))
			}
		}
		if err != nil {
			return 0, fmt.Errorf("items of run %s: %w", runID, err)
		}
	}
	for _, k := range keys {
		if err := index.Delete(k); err != nil {
			return 0, err
		}
		if err := sent.Delete(k); err != nil {
			return 0, err
		}
	}
	for _, k := range chunks {
		if err := pages.Delete(k); err != nil {
			return 0, err
		}
	}
	return len(chunks), nil
}

// ItemsAt returns up to max of run id's items from index from on, in
// submission order, as stored (their paths redacted, without their paths
// as sent).
func (s *Store) ItemsAt(id string, from uint32, max int) ([]auditd.Item, error) {
	var items []auditd.Item
	err := s.db.View(func(tx *bolt.Tx) error {
		return scanPages(tx, id, from, func(_ uint32, it *auditd.Item) error {
			if len(items) == max {
				return errStop
			}
			items = append(items, *it)
			return nil
		})
	})
	return items, err
}
