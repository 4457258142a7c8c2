package fetch

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/redact"
	"github.com/auditd/auditd/registry"
	"github.com/auditd/auditd/runs"
)

// Submitting a run: its items checked and their credentials redacted
// before anything is stored, the run created, started and launched.

// Submit validates and stores a run and starts it, and reports whether it
// is new: a submit with the idempotency key of an earlier one, and the
// same contents, returns that run. Nothing is stored or recorded when the
// request is refused: an unknown source or a duplicate item key fails
// before anything is queued.
//
// Credentials in item paths are redacted here, before anything else sees
// them (redactItems): the run store, the ledger, the idempotency
// fingerprint and every view hold only the redacted path.
func (l *Loop) Submit(ctx context.Context, nr auditd.NewRun) (auditd.RunView, bool, error) {
	redactItems(l.cfg.Registry, nr.Items)
	if nr.IdempotencyKey != "" {
		v, err := l.cfg.Runs.RunByIdempotencyKey(ctx, nr)
		if err == nil {
			return v, false, nil
		} else if auditd.ErrorCode(err) != auditd.ENOTFOUND {
			return auditd.RunView{}, false, err
		}
	}
	if err := validateRun(&l.gates, nr); err != nil {
		return auditd.RunView{}, false, err
	}
	l.mu.Lock()
	closed := l.closed
	l.mu.Unlock()
	if closed {
		return auditd.RunView{}, false, auditd.Errorf(auditd.EUNAVAILABLE, "shutting down")
	}

	for i := range nr.Items {
		nr.Items[i].Method = itemMethod(nr.Items[i].Method)
	}
	now := l.cfg.Clock.Now()
	run := auditd.Run{
		ID:          nr.ID,
		Name:        nr.Name,
		Award:       nr.Award,
		Status:      auditd.RunRunning,
		InitiatedBy: nr.Principal,
		ConfigHash:  runConfigHash(&l.cfg, nr.Items),
		CodeVersion: l.cfg.CodeVersion,
		CreatedAt:   now.UTC(),
		Deadline:    nr.Deadline,
		Mode:        nr.Mode,
	}
	if nr.Mode == auditd.RunProxy {
		run.IdleTimeout = auditd.Duration(nr.IdleTimeout)
	} else {
		run.Replay, run.ItemCount, run.Open = nr.Replay, len(nr.Items), nr.Open
		if nr.Open {
			run.IdleTimeout = auditd.Duration(cmp.Or(nr.IdleTimeout, l.cfg.OpenIdleTimeout))
		}
	}
	live, err := l.cfg.Runs.Create(run, nr)
	if errors.Is(err, runs.ErrKeyTaken) {
		return l.Submit(ctx, nr)
	} else if err != nil {
		return auditd.RunView{}, false, err
	}

	ar := newActiveRun(live)
	if nr.Mode == auditd.RunProxy {
		ar.proxy = newProxyRun(live.Run(), now)
	}
	if err := l.begin(ctx, ar, nr.Items); err != nil {
		return auditd.RunView{}, false, err
	}
	if ar.proxy != nil {
		l.launchProxy(ar)
	} else {
		l.launch(ar, sourcesOf(nr.Items))
	}
	v, err := l.cfg.Runs.Run(ctx, live.ID())
	return v, true, err
}

// redactItems redacts, under each item's source's rule, the credentials
// in its path: Path becomes the redacted path, and SendPath keeps the path
// as sent, which the run store keeps sealed until the run ends. An item
// whose path holds none is left as it is. A source that is not known has
// the built-in names only (validateRun refuses the item anyway).
func redactItems(reg *registry.Registry, items []auditd.Item) {
	rules := map[string]redact.Rule{}
	for i := range items {
		it := &items[i]
		rule, ok := rules[it.SourceID]
		if !ok {
			src, _ := reg.GetSource(it.SourceID)
			rule = redact.New(src.SecretQuery)
			rules[it.SourceID] = rule
		}
		if red := rule.URL(it.Path); red != it.Path {
			it.SendPath, it.Path = it.Path, red
		}
	}
}

// itemMethod is an item's method: GET when it names none.
func itemMethod(m string) string {
	if m == "" {
		return http.MethodGet
	}
	return m
}

// validateRun checks a run's request before anything is stored: a proxy-mode
// run has no items, a batch run's items each name a known source, a
// sendable path and a key no other item of the run has.
func validateRun(g *gates, req auditd.NewRun) error {
	if req.Mode == auditd.RunProxy && len(req.Items) > 0 {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: "A proxy-mode run takes no items: each proxied request becomes one."}
	}
	if req.Mode == auditd.RunProxy {
		return nil
	}
	if len(req.Items) == 0 && !req.Open {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: "a run needs at least one item"}
	}
	if len(req.Items) > MaxItemsPerSubmit {
		return &auditd.Error{Code: auditd.EINVALID, Field: "items", Message: fmt.Sprintf("a submit holds at most %d items; submit a larger run in pages (open, then POST /v1/runs/{id}/items)", MaxItemsPerSubmit)}
	}
	seen := make(map[string]bool, len(req.Items))
	checked := map[string]bool{}
	for i, it := range req.Items {
		if it.Key == "" {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".key"), Message: "key is required"}
		}
		if seen[it.Key] {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".key"), Message: fmt.Sprintf("duplicate item key %q", it.Key)}
		}
		seen[it.Key] = true
		if !checked[it.SourceID] {
			if _, err := g.registry.GetSource(it.SourceID); err != nil {
				return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".source"), Message: fmt.Sprintf("unknown source %q", it.SourceID)}
			}
			checked[it.SourceID] = true
		}
		sent := it.Path
		if it.SendPath != "" {
			sent = it.SendPath
		}
		if !auditd.ValidPath(sent) {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".path"), Message: "path must start with / and hold no space, control character or fragment"}
		}
		if _, err := pageRequest(&req.Items[i], 0); err != nil {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ""), Message: auditd.ErrorMessage(err)}
		}
		if msg := g.costRefusal(it.SourceID, it.Cost, "item"); msg != "" {
			return &auditd.Error{Code: auditd.EINVALID, Field: itemField(i, ".cost"), Message: msg}
		}
	}
	return nil
}

// itemField names a field of the i-th item in a validation error, such as
// "items[3].key". It is built only for an error: a submit can hold
// 100,000 items.
func itemField(i int, field string) string {
	return fmt.Sprintf("items[%d]%s", i, field)
}

// runConfigHash is the hash recorded with a run of the configuration it
// runs under: the sources it uses as the registry holds them (secret
// headers are never part of it) and the loop's own limits. Two runs with
// the same hash were paced under the same terms.
func runConfigHash(cfg *Config, items []auditd.Item) string {
	ids := sourcesOf(items)
	sort.Strings(ids)
	srcs := make([]auditd.Source, 0, len(ids))
	for _, id := range ids {
		src, _ := cfg.Registry.GetSource(id)
		srcs = append(srcs, src)
	}
	b, _ := json.Marshal(struct {
		Sources      []auditd.Source `json:"sources"`
		MaxAttempts  int             `json:"max_attempts"`
		Concurrency  int             `json:"concurrency"`
		MaxBodyBytes int64           `json:"max_body_bytes"`
	}{srcs, cfg.MaxAttempts, cfg.Concurrency, cfg.MaxBodyBytes})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
