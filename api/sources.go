package api

import (
	"net/http"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/redact"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerSourceRoutes(g *echo.Group) {
	g.GET("/sources", s.handleListSources, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/sources/:id", s.handleGetSource, s.allow(auth.RoleAuditor, costRequest))
	g.PUT("/sources/:id", s.handlePutSource, s.allow(auth.RoleAdmin, costRequest))
}

// redacted replaces every header value of a source in responses: they are
// credentials.
const redacted = "[redacted]"

// sourceJSON is a source as the API shows it.
type sourceJSON struct {
	auditd.Source
	Learned      learnedJSON `json:"learned"`
	BreakerState breakerJSON `json:"breaker_state"`
	PausedUntil  time.Time   `json:"paused_until,omitzero"`
}

type learnedJSON struct {
	Limit     int             `json:"limit"`
	Window    auditd.Duration `json:"window"`
	Cause     string          `json:"cause,omitempty"`
	ChangedAt time.Time       `json:"changed_at,omitzero"`
	// Concurrency is the requests in flight the source may have, learned.
	Concurrency int `json:"concurrency,omitempty"`
}

type breakerJSON struct {
	State    string    `json:"state"`
	Failures int       `json:"failures"`
	Until    time.Time `json:"until,omitzero"`
}

func newSourceJSON(st SourceState) sourceJSON {
	src := st.Config
	// Credentials in a base URL are refused when a source is put; one
	// stored before that rule is still never shown.
	src.BaseURL = redact.New(src.SecretQuery).URL(src.BaseURL)
	if len(src.Headers) > 0 {
		h := make(map[string]string, len(src.Headers))
		for k := range src.Headers {
			h[k] = redacted
		}
		src.Headers = h
	}
	state := st.Breaker.State
	if state == "" {
		state = "closed"
	}
	return sourceJSON{
		Source:       src,
		Learned:      learnedJSON{Limit: st.Learned.Limit, Window: auditd.Duration(st.Learned.Window), Cause: st.Learned.Cause, ChangedAt: st.Learned.ChangedAt, Concurrency: st.Learned.Concurrency},
		BreakerState: breakerJSON{State: state, Failures: st.Breaker.Failures, Until: st.Breaker.Until},
		PausedUntil:  st.PausedUntil,
	}
}

func (s *Server) handleListSources(c echo.Context) error {
	states, err := s.Sources.Sources(c.Request().Context())
	if err != nil {
		return err
	}
	out := struct {
		Sources []sourceJSON `json:"sources"`
		Fleet   *fleetRef    `json:"fleet,omitempty"` // only in a fleet: the UI asks for its view then
	}{Sources: make([]sourceJSON, 0, len(states))}
	for _, st := range states {
		out.Sources = append(out.Sources, newSourceJSON(st))
	}
	if s.FleetView != nil {
		out.Fleet = &fleetRef{Node: s.FleetView.Node(), View: "/v1/fleet/sources"}
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) handleGetSource(c echo.Context) error {
	st, err := s.Sources.Source(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, newSourceJSON(st))
}

// handlePutSource creates or replaces a source. The id in the body may be
// left out; when present it must match the path.
func (s *Server) handlePutSource(c echo.Context) error {
	id := c.Param("id")
	var src auditd.Source
	if err := s.bindSource(c, id, &src); err != nil {
		return err
	}
	ctx := c.Request().Context()
	created, err := s.Sources.PutSource(ctx, src, token(c).Principal())
	if err != nil {
		return err
	}
	st, err := s.Sources.Source(ctx, id)
	if err != nil {
		return err
	}
	code := http.StatusOK
	if created {
		code = http.StatusCreated
		c.Response().Header().Set(echo.HeaderLocation, "/v1/sources/"+id)
	}
	return c.JSON(code, newSourceJSON(st))
}

func (s *Server) bindSource(c echo.Context, id string, src *auditd.Source) error {
	if err := s.validate.Var(id, "required,max=100,printascii,excludes=/"); err != nil {
		return invalid("id", "The source id in the path must be 1 to 100 printable ASCII characters without '/', and without a leading or trailing space.")
	}
	// Validation runs after the path id is filled in, so decode first.
	if err := s.decode(c, src, s.MaxBodyBytes); err != nil {
		return err
	}
	if src.ID == "" {
		src.ID = id
	} else if src.ID != id {
		return invalid("id", "The body's id %q differs from the path's %q.", src.ID, id)
	}
	if err := s.validate.Struct(src); err != nil {
		return validationError(err)
	}
	return nil // the rest of a source's rules are the registry's (Registry.Put)
}
