package runs

import (
	"slices"

	"github.com/auditd/auditd"
)

// proxiedItems are the items of a proxy-mode run, in the order their
// requests came. A batch run's items are stored when it is submitted; a
// proxy run's arrive one request at a time, so they are kept here, with the
// live run, and stored with its end (Store.End), as its results are. The
// ledger's item.queued events hold the same facts, and the fetch loop adds
// them back from there when it resumes the run.
type proxiedItems struct {
	items []auditd.Item
	index map[string]int // key -> position in items
}

// AddItem adds an item to a proxy-mode run, as its request arrives. A key
// the run already has is ECONFLICT; a batch run takes no items (EINVALID).
func (r *Live) AddItem(it auditd.Item) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proxied == nil {
		return auditd.Errorf(auditd.EINVALID, "run %s is not a proxy-mode run", r.id)
	}
	if _, dup := r.proxied.index[it.Key]; dup {
		return auditd.Errorf(auditd.ECONFLICT, "run %s already has an item %q", r.id, it.Key)
	}
	r.proxied.index[it.Key] = len(r.proxied.items)
	r.proxied.items = append(r.proxied.items, it)
	r.rec.ItemCount++
	return nil
}

// HasItem reports whether the run has an item with key.
func (r *Live) HasItem(key string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proxied == nil {
		return false
	}
	_, ok := r.proxied.index[key]
	return ok
}

// proxiedItems returns a proxy-mode run's items, for its end; nil for a
// batch run, whose items were stored when it was submitted.
func (r *Live) proxiedItems() []auditd.Item {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.proxied == nil {
		return nil
	}
	return slices.Clone(r.proxied.items)
}

// listItems is Store.Items for a live proxy-mode run.
func (r *Live) listItems(after string, limit int) ([]auditd.ItemView, string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	from := 0
	if after != "" {
		i, ok := r.proxied.index[after]
		if !ok {
			return nil, "", &auditd.Error{Code: auditd.EINVALID, Field: "cursor", Message: "cursor names no item of this run"}
		}
		from = i + 1
	}
	var out []auditd.ItemView
	next := ""
	for _, it := range r.proxied.items[from:] {
		if len(out) == limit {
			next = out[len(out)-1].Key
			break
		}
		out = append(out, r.viewLocked(it))
	}
	return out, next, nil
}

// item is Store.Item for a live proxy-mode run.
func (r *Live) item(key string) (auditd.ItemView, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, ok := r.proxied.index[key]
	if !ok {
		return auditd.ItemView{}, auditd.Errorf(auditd.ENOTFOUND, "item %q not found in run %q", key, r.id)
	}
	return r.viewLocked(r.proxied.items[i]), nil
}

func (r *Live) viewLocked(it auditd.Item) auditd.ItemView {
	v := auditd.ItemView{Item: it}
	if res, ok := r.results[it.Key]; ok {
		c := *res
		v.Result = &c
	}
	return v
}
