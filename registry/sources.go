package registry

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
)

// setConfig sets the entry's configuration and headers, and the view of
// them the lock-free readers see. Callers hold mu, or own e alone.
func (e *entry) setConfig(src auditd.Source, headers map[string]string) {
	e.src, e.headers = src, headers
	names := slices.Sorted(maps.Keys(headers))
	e.config.Store(&configView{src: src, headerNames: names})
}

// GetSource returns the configuration of source id without its secret
// headers (Headers is nil).
func (r *Registry) GetSource(id string) (auditd.Source, error) {
	e := r.lookup(id)
	if e == nil {
		return auditd.Source{}, ErrSourceNotFound
	}
	return e.config.Load().src, nil
}

// lookup returns source id's entry, or nil when there is none.
func (r *Registry) lookup(id string) *entry {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.sources[id]
}

// ListSources returns every source's configuration, without secret headers,
// sorted by ID.
func (r *Registry) ListSources() []auditd.Source {
	r.mu.RLock()
	entries := make([]*entry, 0, len(r.sources))
	for _, e := range r.sources {
		entries = append(entries, e)
	}
	r.mu.RUnlock()
	out := make([]auditd.Source, 0, len(entries))
	for _, e := range entries {
		out = append(out, e.config.Load().src)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// PutSource creates or replaces the configuration of src.ID, on behalf of
// principal. It validates src, appends a source.changed event whose Detail
// is the configuration without its headers, then stores the headers apart.
// What was learned about the source is kept, clamped to a lowered ceiling
// (a registry.changed event with Cause "operator" when that moves it).
func (r *Registry) PutSource(ctx context.Context, principal string, src auditd.Source) error {
	_, err := r.Put(ctx, principal, src)
	return err
}

// Put is PutSource, and reports whether it created the source: of
// concurrent puts of one new id, exactly one creates it.
func (r *Registry) Put(ctx context.Context, principal string, src auditd.Source) (created bool, err error) {
	if err := r.validateSource(src); err != nil {
		return false, err
	}
	secrets, query := src.Headers, src.Query
	src.Headers, src.Query = nil, nil
	if src.Group == src.ID {
		// A group and a source sharing a name would be indistinguishable in
		// the ledger's Group field; nothing is lost by forbidding it.
		return false, &auditd.Error{Code: auditd.EINVALID, Field: "group", Message: "Group must differ from the source id."}
	}
	cfg, err := json.Marshal(src)
	if err != nil {
		return false, fmt.Errorf("encode source %q: %w", src.ID, err)
	}
	sec, qry, err := r.sealSecrets(src.ID, secrets, query)
	if err != nil {
		return false, err
	}

	// Registry.mu is held for the whole put: membership and ceilings of
	// groups change here, and puts are rare.
	r.mu.Lock()
	defer r.mu.Unlock()
	created = r.sources[src.ID] == nil

	if _, err := r.opts.Ledger.Append(ctx, auditd.Event{
		Type:      auditd.EventSourceChanged,
		SourceID:  src.ID,
		Group:     src.Group,
		Principal: principal,
		Detail:    string(cfg),
	}); err != nil {
		return false, fmt.Errorf("append source.changed for %q: %w", src.ID, err)
	}
	if err := r.storeSource(src.ID, cfg, sec, qry); err != nil {
		return false, err
	}

	e := r.sources[src.ID]
	if e == nil {
		e = &entry{id: src.ID}
		e.ceil = r.sourceCeiling(src)
		e.st = r.initialState(e.ceil)
		r.startLearning(e)
		r.sources[src.ID] = e
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	oldGroup := e.src.Group
	e.ceil = r.sourceCeiling(src)
	e.setConfig(src, maps.Clone(secrets))
	delete(r.unopened, src.ID)
	if len(query) > 0 {
		r.queries[src.ID] = maps.Clone(query)
	} else {
		delete(r.queries, src.ID)
	}
	touched := r.join(e, oldGroup)
	if err := r.clampOperator(ctx, e, principal, src.Group); err != nil {
		return created, err
	}
	return created, r.clampGroups(ctx, e, touched, principal)
}

// storeSource writes a source's configuration and its sealed secrets (nil:
// none) in one transaction.
func (r *Registry) storeSource(id string, cfg, sec, qry []byte) error {
	err := r.db.Update(func(tx *bolt.Tx) error {
		if err := bucket(tx, bucketSources).Put([]byte(id), cfg); err != nil {
			return err
		}
		if qry == nil {
			if err := bucket(tx, bucketQuery).Delete([]byte(id)); err != nil {
				return err
			}
		} else if err := bucket(tx, bucketQuery).Put([]byte(id), qry); err != nil {
			return err
		}
		if sec == nil {
			return bucket(tx, bucketSecrets).Delete([]byte(id))
		}
		return bucket(tx, bucketSecrets).Put([]byte(id), sec)
	})
	if err != nil {
		return fmt.Errorf("store source %q: %w", id, err)
	}
	return nil
}

// join moves source e into the group its configuration names (none when
// empty), out of oldGroup, and returns the groups whose membership or
// ceiling may have moved. Callers hold r.mu and e.mu.
func (r *Registry) join(e *entry, oldGroup string) (touched []string) {
	name := e.src.Group
	if name != "" {
		g := r.groups[name]
		if g == nil {
			g = &entry{id: name, group: true}
			r.startLearning(g)
			r.groups[name] = g
		}
		e.grp = g
	} else {
		e.grp = nil
	}
	touched = []string{name}
	if oldGroup != "" && oldGroup != name {
		touched = append(touched, oldGroup)
		if r.groupCeiling(oldGroup).limit == 0 {
			delete(r.groups, oldGroup) // no members left; its stored state stays for a comeback
			touched = touched[:1]
		}
	}
	return touched
}

// clampGroups brings the touched groups within their ceilings after a put
// of source e, and records e's membership in them. Callers hold r.mu and
// e.mu.
func (r *Registry) clampGroups(ctx context.Context, e *entry, touched []string, principal string) error {
	name := e.src.Group
	for _, gn := range touched {
		if gn == "" {
			continue
		}
		g := r.groups[gn]
		g.mu.Lock()
		g.ceil = r.groupCeiling(gn)
		if g.st.Limit == 0 {
			if err := r.loadGroup(g); err != nil {
				g.mu.Unlock()
				return err
			}
		}
		err := r.clampOperator(ctx, g, principal, e.id)
		if gn == name {
			g.setMember(e.id, e.rate())
		} else {
			g.dropMember(e.id)
		}
		g.mu.Unlock()
		if err != nil {
			return err
		}
	}
	return nil
}

// loadGroup reads a group's stored state, or starts it at the default.
// Callers hold g.mu.
func (r *Registry) loadGroup(g *entry) error {
	err := r.db.View(func(tx *bolt.Tx) error {
		v := bucket(tx, bucketGroups).Get([]byte(g.id))
		if v == nil {
			return nil
		}
		return json.Unmarshal(v, &g.st)
	})
	if err != nil {
		return fmt.Errorf("load group %q: %w", g.id, err)
	}
	if g.st.Limit == 0 {
		g.st = r.initialState(g.ceil)
	}
	r.startLearning(g)
	return nil
}

// clampOperator brings e within its (possibly new) ceiling, recording the
// move as an operator change. For a source, other is its group; for a group,
// the source whose put moved it. Callers hold e.mu.
func (r *Registry) clampOperator(ctx context.Context, e *entry, principal, other string) error {
	l, w := clamp(e.st.Limit, e.st.Window.D(), e.ceil)
	if l == e.st.Limit && w == e.st.Window.D() {
		return nil
	}
	c := change{cause: CauseOperator, principal: principal}
	if e.group {
		c.sourceID = other
	} else {
		c.sourceID = e.id
	}
	old := e.st
	e.set(l, w, c, r.opts.Clock.Now())
	return r.commit(ctx, e, old, c)
}

// SetLimit sets the learned limit of source id by hand, on behalf of
// principal (Cause "operator"), within the source's ceiling. It returns the
// limits now in force.
func (r *Registry) SetLimit(ctx context.Context, principal, id string, limit int, window time.Duration) (Limits, error) {
	if limit < 1 {
		return Limits{}, &auditd.Error{Code: auditd.EINVALID, Field: "limit", Message: "Limit must be at least 1."}
	} else if window <= 0 {
		return Limits{}, &auditd.Error{Code: auditd.EINVALID, Field: "window", Message: "Window must be positive."}
	}
	e := r.lookup(id)
	if e == nil {
		return Limits{}, ErrSourceNotFound
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	l, w := clamp(limit, window, e.ceil)
	if l != e.st.Limit || w != e.st.Window.D() {
		c := change{cause: CauseOperator, principal: principal, sourceID: id}
		old := e.st
		e.set(l, w, c, r.opts.Clock.Now())
		// The operator's word replaces what refusals taught: hold at it, then
		// probe past it.
		e.st.Refused, e.st.Phase, e.probing, e.held = 0, PhaseSteady, false, 0
		if err := r.commit(ctx, e, old, c); err != nil {
			return Limits{}, err
		}
		if g := e.grp; g != nil {
			g.mu.Lock()
			g.setMember(e.id, e.rate())
			g.mu.Unlock()
		}
	}
	return e.limits(), nil
}
