package registry

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/seal"
)

// RequestHeaders returns a copy of the secret headers to add to every
// request to source id. It is meant for the fetch loop only: nothing it
// returns may be recorded.
func (r *Registry) RequestHeaders(id string) (map[string]string, error) {
	r.mu.RLock()
	e, unopened := r.sources[id], r.unopened[id] // Put changes both under r.mu
	r.mu.RUnlock()
	if e == nil {
		return nil, ErrSourceNotFound
	}
	if unopened {
		return nil, fmt.Errorf("the stored request headers of source %q do not open under the sealing key (%s changed?); put the source again", id, seal.KeyFile)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.headers), nil
}

// HeaderNames returns the names of source id's request headers, sorted,
// without their values: what the API shows of them.
func (r *Registry) HeaderNames(id string) ([]string, error) {
	e := r.lookup(id)
	if e == nil {
		return nil, ErrSourceNotFound
	}
	return slices.Clone(e.config.Load().headerNames), nil
}

// secretsContext binds a source's sealed headers to its id.
func secretsContext(id string) []byte { return []byte("registry.secrets/" + id) }

// queryContext binds a source's sealed secret query parameters to its id.
func queryContext(id string) []byte { return []byte("registry.query/" + id) }

// RequestQuery returns a copy of the secret query parameters to add to
// every request proxied to source id (Source.Query). Like RequestHeaders
// it is for the fetch loop only: nothing it returns may be recorded.
func (r *Registry) RequestQuery(id string) (map[string]string, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if r.sources[id] == nil {
		return nil, ErrSourceNotFound
	}
	return maps.Clone(r.queries[id]), nil
}

// SecretQueries reads, from a registry's bbolt file opened read-only (a
// stopped service's, for an offline export), each source's declared
// secret query parameter names. A file without a registry has none.
func SecretQueries(db *bolt.DB) (map[string][]string, error) {
	out := map[string][]string{}
	err := db.View(func(tx *bolt.Tx) error {
		root := tx.Bucket([]byte(bucketRoot))
		if root == nil || root.Bucket([]byte(bucketSources)) == nil {
			return nil
		}
		return root.Bucket([]byte(bucketSources)).ForEach(func(k, v []byte) error {
			var src auditd.Source
			if err := json.Unmarshal(v, &src); err != nil {
				return fmt.Errorf("source %q: %w", k, err)
			}
			if len(src.SecretQuery) > 0 {
				out[string(k)] = src.SecretQuery
			}
			return nil
		})
	})
	return out, err
}

// loadSecrets reads source e's stored request headers and secret query
// parameters.
func (r *Registry) loadSecrets(tx *bolt.Tx, e *entry) error {
	k := []byte(e.id)
	if v := r.openStored(e.id, bucket(tx, bucketSecrets).Get(k), secretsContext(e.id)); v != nil {
		if err := json.Unmarshal(v, &e.headers); err != nil {
			return fmt.Errorf("request headers of %q: %w", e.id, err)
		}
	}
	if v := r.openStored(e.id, bucket(tx, bucketQuery).Get(k), queryContext(e.id)); v != nil {
		var q map[string]string
		if err := json.Unmarshal(v, &q); err != nil {
			return fmt.Errorf("secret query of %q: %w", e.id, err)
		}
		r.queries[e.id] = q
	}
	return nil
}

// openStored returns secrets v of source id as stored: opened under
// Options.Seal with context when sealed, as they are when stored in the
// clear. Sealed secrets that do not open (no Seal, or another key) give
// nil, and mark the source unopened: its requests fail until it is put
// again, rather than leave without their credentials.
func (r *Registry) openStored(id string, v, context []byte) []byte {
	if v == nil || !seal.IsSealed(v) {
		return v
	}
	if r.opts.Seal != nil {
		if opened, err := r.opts.Seal.Open(v, context); err == nil {
			return opened
		}
	}
	r.unopened[id] = true
	return nil
}

// sealSecrets encodes and seals a source's request headers and secret
// query parameters for storage; nil for none.
func (r *Registry) sealSecrets(id string, headers, query map[string]string) (sec, qry []byte, err error) {
	if len(headers) > 0 {
		if sec, err = json.Marshal(headers); err != nil {
			return nil, nil, fmt.Errorf("encode request headers of %q: %w", id, err)
		}
		if r.opts.Seal != nil {
			sec = r.opts.Seal.Seal(sec, secretsContext(id))
		}
	}
	if len(query) > 0 {
		if qry, err = json.Marshal(query); err != nil {
			return nil, nil, fmt.Errorf("encode secret query of %q: %w", id, err)
		}
		if r.opts.Seal != nil {
			qry = r.opts.Seal.Seal(qry, queryContext(id))
		}
	}
	return sec, qry, nil
}
