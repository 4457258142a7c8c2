package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/redact"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerRunRoutes(g *echo.Group) {
	g.POST("/runs", s.handleCreateRun, s.allow(auth.RoleOperator, costInline))
	g.GET("/runs", s.handleListRuns, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/runs/:id", s.handleGetRun, s.allow(auth.RoleAuditor, costRequest))
	g.POST("/runs/:id/cancel", s.handleCancelRun, s.allow(auth.RoleOperator, costRequest))
	g.POST("/runs/:id/finish", s.handleFinishRun, s.allow(auth.RoleOperator, costRequest))
	g.POST("/runs/:id/acknowledgements", s.handleAcknowledge, s.allow(auth.RoleOperator, costRequest))
}

// createRunRequest is the body of POST /v1/runs.
type createRunRequest struct {
	Name  string       `json:"name" validate:"required,max=200"`
	Award auditd.Award `json:"award"`
	// Mode "proxy" makes a run without items, which the requests sent
	// through the proxy route become; "batch" (the default) takes items.
	Mode string `json:"mode,omitempty" validate:"omitempty,oneof=batch proxy"`
	// Items are a batch run's, or, when Open, its first page (maybe none);
	// a larger run comes in pages (POST /v1/runs/{id}/items).
	Items    []auditd.Item `json:"items" validate:"max=100000,dive"`
	Open     bool          `json:"open,omitempty"`
	Deadline time.Time     `json:"deadline,omitzero"`
	Replay   bool          `json:"replay,omitempty"`
	// IdleTimeout ends a proxy-mode run after this long without a request,
	// and finishes an open batch run after this long without a page.
	IdleTimeout auditd.Duration `json:"idle_timeout,omitempty"`
}

// maxIdleTimeout bounds a run's idle timeout.
const maxIdleTimeout = 7 * 24 * time.Hour

// IdempotencyKeyHeader makes a retried POST /v1/runs return the first run.
const IdempotencyKeyHeader = "Idempotency-Key"

// handleCreateRun validates the whole run, then answers a retry from the
// run its key already made (charging nothing), then charges the token one
// unit per item, then creates the run.
func (s *Server) handleCreateRun(c echo.Context) error {
	key, ok := idHeader(c.Request().Header, IdempotencyKeyHeader)
	if ok {
		if err := s.validate.Var(key, "required,max=200,printascii"); err != nil {
			return invalid(IdempotencyKeyHeader, "%s must be 1 to 200 printable ASCII characters, without a leading or trailing space.", IdempotencyKeyHeader)
		}
	}
	var req createRunRequest
	if err := s.bind(c, &req, s.MaxRunBodyBytes); err != nil {
		return err
	}
	ctx := c.Request().Context()
	err := s.checkRun(c, &req)
	if err != nil {
		return err
	}

	tok := token(c)
	nr := auditd.NewRun{
		Name:        req.Name,
		Award:       req.Award,
		Items:       req.Items,
		Deadline:    req.Deadline,
		Replay:      req.Replay,
		Principal:   tok.Principal(),
		IdleTimeout: req.IdleTimeout.D(),
		Open:        req.Open,
	}
	if req.Mode == string(auditd.RunProxy) {
		nr.Mode = auditd.RunProxy
	}
	if key != "" {
		// Keys are the client's; scoping them to the token keeps one
		// client from replaying (or squatting on) another's.
		nr.IdempotencyKey = tok.ID + ":" + key
		lookup := nr
		if lookup.Items, err = s.redactedItems(ctx, req.Items); err != nil {
			return err
		}
		st, err := s.Runs.RunByIdempotencyKey(ctx, lookup)
		if err == nil {
			return s.renderCreated(c, st, true)
		} else if auditd.ErrorCode(err) != auditd.ENOTFOUND {
			return err // ECONFLICT: the key made a different run
		}
	}
	if err := s.charge(c, tok, float64(costRequest+len(req.Items))); err != nil {
		return err
	}
	st, created, err := s.Runs.CreateRun(ctx, nr)
	if err != nil {
		return err
	}
	return s.renderCreated(c, st, !created)
}

// redactedItems are items as the run store keeps and fingerprints them:
// the credentials in their paths redacted under their sources' rules, as
// the fetch loop redacts them before it stores a run. A retry's items
// carry the credentials its first request did; compared unredacted with
// the stored run's they would never match.
func (s *Server) redactedItems(ctx context.Context, items []auditd.Item) ([]auditd.Item, error) {
	rules := map[string]redact.Rule{}
	out := slices.Clone(items)
	for i := range out {
		rule, ok := rules[out[i].SourceID]
		if !ok {
			st, err := s.Sources.Source(ctx, out[i].SourceID)
			if err != nil {
				return nil, err
			}
			rule = redact.New(st.Config.SecretQuery)
			rules[out[i].SourceID] = rule
		}
		out[i].Path = rule.URL(out[i].Path)
	}
	return out, nil
}

// checkRun checks what the tags cannot: unique item keys, known sources, a
// deadline in the future.
func (s *Server) checkRun(c echo.Context, req *createRunRequest) error {
	if !req.Deadline.IsZero() && !req.Deadline.After(s.Clock.Now()) {
		return invalid("deadline", "deadline must be in the future.")
	}
	if req.Mode == string(auditd.RunProxy) {
		switch {
		case len(req.Items) > 0:
			return invalid("items", "A proxy-mode run takes no items: each request sent through /proxy/{source}/ becomes one.")
		case req.Replay:
			return invalid("replay", "A proxy-mode run cannot replay: its requests come from the client.")
		case req.Open:
			return invalid("open", "A proxy-mode run takes requests until it is finished: open is for batch runs.")
		case req.IdleTimeout.D() > maxIdleTimeout:
			return invalid("idle_timeout", "idle_timeout is at most %v.", maxIdleTimeout)
		}
		return nil
	}
	if len(req.Items) == 0 && !req.Open {
		return invalid("items", "items must be at least 1 entries (or the run open, to take its items in pages).")
	}
	switch {
	case req.IdleTimeout != 0 && !req.Open:
		return invalid("idle_timeout", "idle_timeout is for proxy-mode runs and open batch runs.")
	case req.IdleTimeout.D() > maxIdleTimeout:
		return invalid("idle_timeout", "idle_timeout is at most %v.", maxIdleTimeout)
	}
	return s.checkItems(c, req.Items)
}

// checkItems checks what the tags cannot of a submit's items: keys unique
// among them, known sources.
func (s *Server) checkItems(c echo.Context, items []auditd.Item) error {
	seen := make(map[string]int, len(items))
	known := map[string]bool{}
	for i, it := range items {
		if j, dup := seen[it.Key]; dup {
			return invalid(fmt.Sprintf("items[%d].key", i), "Item key %q repeats items[%d].", it.Key, j)
		}
		seen[it.Key] = i
		if _, checked := known[it.SourceID]; !checked {
			_, err := s.Sources.Source(c.Request().Context(), it.SourceID)
			if auditd.ErrorCode(err) == auditd.ENOTFOUND {
				return invalid(fmt.Sprintf("items[%d].source", i), "Unknown source %q; PUT /v1/sources/{id} first.", it.SourceID)
			} else if err != nil {
				return err
			}
			known[it.SourceID] = true
		}
	}
	return nil
}

func (s *Server) renderCreated(c echo.Context, st auditd.RunView, replayed bool) error {
	h := c.Response().Header()
	h.Set(echo.HeaderLocation, "/v1/runs/"+st.Run.ID)
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	return c.JSON(http.StatusCreated, st)
}

func (s *Server) handleListRuns(c echo.Context) error {
	f, err := s.runFilter(c)
	if err != nil {
		return err
	}
	runs, next, err := s.Runs.Runs(c.Request().Context(), f)
	if err != nil {
		return err
	}
	// On a fleet node, each run that is a part of a fleet run says so.
	var parts map[string]FleetPartOf
	if s.Fleet != nil {
		ids := make([]string, len(runs))
		for i, r := range runs {
			ids[i] = r.ID
		}
		parts = s.Fleet.PartsOf(c.Request().Context(), ids)
	}
	marked := make([]runInFleet, len(runs))
	for i, r := range runs {
		marked[i].RunView = r
		if p, ok := parts[r.ID]; ok {
			marked[i].Fleet = &p
		}
	}
	return c.JSON(http.StatusOK, struct {
		Runs       []runInFleet `json:"runs"`
		NextCursor string       `json:"next_cursor,omitempty"`
	}{Runs: marked, NextCursor: encodeCursor(next)})
}

// runInFleet is a run of a fleet node: Fleet is set on a part of a fleet
// run (FleetPartOf).
type runInFleet struct {
	auditd.RunView
	Fleet *FleetPartOf `json:"fleet,omitempty"`
}

func (s *Server) runFilter(c echo.Context) (auditd.RunFilter, error) {
	q := c.QueryParams()
	var f auditd.RunFilter
	var err error
	if f.After, err = cursorParam(c); err != nil {
		return f, err
	}
	if f.Limit, err = limitParam(c, DefaultPageLimit); err != nil {
		return f, err
	}
	if f.From, f.To, err = rangeParams(q); err != nil {
		return f, err
	}
	switch st := auditd.RunStatus(q.Get("status")); st {
	case "", auditd.RunQueued, auditd.RunRunning, auditd.RunSucceeded, auditd.RunPartial, auditd.RunCancelled:
		f.Status = st
	default:
		return f, invalid("status", "status must be one of queued, running, succeeded, partial, cancelled.")
	}
	f.Source, f.FAIN = q.Get("source"), q.Get("award")
	if len(f.Source) > 100 {
		return f, invalid("source", "source is at most 100 characters.")
	}
	if len(f.FAIN) > 64 {
		return f, invalid("award", "award (a FAIN) is at most 64 characters.")
	}
	return f, nil
}

// fleetHintTimeout bounds the read of etcd behind a 404's hint that the run
// is a fleet run held by other nodes.
const fleetHintTimeout = time.Second

func (s *Server) handleGetRun(c echo.Context) error {
	st, err := s.Runs.Run(c.Request().Context(), c.Param("id"))
	if auditd.ErrorCode(err) == auditd.ENOTFOUND && s.Fleet != nil && runIDPattern.MatchString(c.Param("id")) {
		// A fleet run this node holds no part of: say where it is, if
		// etcd answers within fleetHintTimeout (a node cut off from it
		// answers its 404 without the hint).
		ctx, cancel := context.WithTimeout(c.Request().Context(), fleetHintTimeout)
		fr, ferr := s.Fleet.Run(ctx, c.Param("id"))
		cancel()
		if ferr == nil {
			return auditd.Errorf(auditd.ENOTFOUND, "Run %s is a fleet run this node holds no part of (parts: %s): /v1/fleet/runs/%s.", fr.ID, strings.Join(fr.Parts, ", "), fr.ID)
		}
	}
	if err != nil {
		return err
	}
	if s.Fleet != nil {
		if part, ok := s.Fleet.PartOf(c.Request().Context(), st.ID); ok {
			return c.JSON(http.StatusOK, runInFleet{st, &part})
		}
	}
	return c.JSON(http.StatusOK, st)
}

// handleFinishRun ends a proxy-mode run once its requests in flight are
// answered.
func (s *Server) handleFinishRun(c echo.Context) error {
	st, err := s.Runs.FinishRun(c.Request().Context(), c.Param("id"), token(c).Principal())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) handleCancelRun(c echo.Context) error {
	st, err := s.Runs.CancelRun(c.Request().Context(), c.Param("id"), token(c).Principal())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

// acknowledgeRequest is the body of POST /v1/runs/{id}/acknowledgements.
type acknowledgeRequest struct {
	Items []string `json:"items" validate:"required,min=1,max=100000,dive,required,max=200"`
}

func (s *Server) handleAcknowledge(c echo.Context) error {
	var req acknowledgeRequest
	if err := s.bind(c, &req, s.MaxRunBodyBytes); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.Runs.Run(ctx, c.Param("id")); err != nil {
		return err
	}
	n, err := s.Runs.Acknowledge(ctx, c.Param("id"), req.Items, token(c).Principal())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]int{"acknowledged": n})
}
