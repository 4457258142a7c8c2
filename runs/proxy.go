package runs

import (
	"github.com/auditd/auditd"
)

// proxiedItems are the items of a proxy-mode run that are not stored yet.
// A batch run's items are stored as they are submitted; a proxy run's
// arrive one request at a time, and each is stored with its item.queued,
// in the ledger's commit (QueuedPuts). Until then it is kept here.
type proxiedItems struct {
	pending map[string]pendingItem
	// restored are items a resume found in the ledger and not in the
	// store (a run an earlier build kept its items of in memory): Start
	// stores them.
	restored []string
}

// pendingItem is an item of a proxy-mode run, with its index.
type pendingItem struct {
	idx uint32
	it  auditd.Item
}

// AddItem adds an item to a proxy-mode run, as its request arrives. A key
// the run already has is ECONFLICT; a batch run takes no items (EINVALID).
func (r *Live) AddItem(it auditd.Item) error {
	if r.proxied == nil {
		return auditd.Errorf(auditd.EINVALID, "run %s is not a proxy-mode run", r.id)
	}
	_, stored, err := r.store.pagedItem(r.id, it.Key)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.proxied.pending[it.Key]; dup || stored {
		return auditd.Errorf(auditd.ECONFLICT, "run %s already has an item %q", r.id, it.Key)
	}
	if r.rec.ItemCount >= MaxItemsInRun {
		// Not ECONFLICT, which would mean the key is taken (a repeated
		// request's derived key then tries the next " #n").
		return auditd.Errorf(auditd.EINVALID, "Run %s holds %d items, the most a run may; finish it and create another.", r.id, MaxItemsInRun)
	}
	r.proxied.pending[it.Key] = pendingItem{idx: uint32(r.rec.ItemCount), it: it}
	r.rec.ItemCount++
	return nil
}

// RestoreItem adds to a proxy-mode run being resumed an item its ledger
// has queued: nothing when the store has it, as it has every item stored
// with its item.queued. (It reads nothing from the store: the resume
// calls it while it reads the ledger.)
func (r *Live) RestoreItem(it auditd.Item) error {
	if !r.legacy {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.proxied.pending[it.Key]; dup {
		return auditd.Errorf(auditd.ECONFLICT, "run %s already has an item %q", r.id, it.Key)
	}
	r.proxied.pending[it.Key] = pendingItem{idx: uint32(r.rec.ItemCount), it: it}
	r.rec.ItemCount++
	r.proxied.restored = append(r.proxied.restored, it.Key)
	return nil
}

// HasItem reports whether the run has an item with key.
func (r *Live) HasItem(key string) bool {
	if _, ok := r.pendingItem(key); ok {
		return true
	}
	_, stored, err := r.store.pagedItem(r.id, key)
	return err == nil && stored
}

// QueuedPuts are what store the item with key of a proxy-mode run, for
// the ledger's commit of its item.queued; nil when it is not pending.
func (r *Live) QueuedPuts(key string) []auditd.Put {
	p, ok := r.pendingItem(key)
	if !ok {
		return nil
	}
	return itemPuts(r.id, p.idx, &p.it)
}

func (r *Live) pendingItem(key string) (pendingItem, bool) {
	if r.proxied == nil {
		return pendingItem{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	p, ok := r.proxied.pending[key]
	return p, ok
}
