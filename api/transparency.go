package api

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

// Costs of the log routes.
const (
	costEventsPage = 2
)

// registerLogRoutes: the routes witnesses and auditors follow the log by.
// Those a witness needs are public when PublicLog is set.
func (s *Server) registerLogRoutes(g *echo.Group) {
	g.GET("/ledger/consistency", s.handleConsistency, s.allowPublic(auth.RoleAuditor, costRequest))
	g.GET("/ledger/checkpoints", s.handleCheckpoints, s.allowPublic(auth.RoleAuditor, costRequest))
	g.GET("/ledger/checkpoints/:size", s.handleCheckpointAt, s.allowPublic(auth.RoleAuditor, costRequest))
	g.POST("/ledger/cosignatures", s.handleCosign, s.allowPublic(auth.RoleAuditor, costRequest))
	g.GET("/ledger/inclusion", s.handleInclusion, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/ledger/events", s.handleLedgerEvents, s.allow(auth.RoleAuditor, costEventsPage))
}

// allowPublic is allow, except that with PublicLog set a request without
// a token is admitted too, charged to its client address.
func (s *Server) allowPublic(min auth.Role, cost float64) echo.MiddlewareFunc {
	authed := s.allow(min, cost)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		withToken := authed(next)
		return func(c echo.Context) error {
			if !s.PublicLog || c.Request().Header.Get(echo.HeaderAuthorization) != "" {
				return withToken(c)
			}
			switch wait := s.TokenBudget.Admit("addr:"+c.RealIP(), cost); wait {
			case 0:
				return next(c)
			default:
				s.metrics.throttled.WithLabelValues("budget").Inc()
				return tooMany(c, wait, "This address is over its budget for the public log")
			}
		}
	}
}

// sizeParam reads a tree size or sequence number query parameter: an
// integer from 1, def when absent (0: required).
func sizeParam(c echo.Context, name string, def uint64) (uint64, error) {
	raw := c.QueryParam(name)
	if raw == "" {
		if def == 0 {
			return 0, invalid(name, "%s is required: an integer from 1.", name)
		}
		return def, nil
	}
	n, err := strconv.ParseUint(raw, 10, 64)
	if err != nil || n == 0 || strconv.FormatUint(n, 10) != raw {
		return 0, invalid(name, "%s must be an integer from 1.", name)
	}
	return n, nil
}

func (s *Server) head() uint64 {
	h, _ := s.Ledger.Head()
	return h
}

func (s *Server) handleConsistency(c echo.Context) error {
	head := s.head()
	if head == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "The ledger holds no events yet.")
	}
	old, err := sizeParam(c, "old", 0)
	if err != nil {
		return err
	}
	nw, err := sizeParam(c, "new", head)
	if err != nil {
		return err
	}
	switch {
	case nw > head:
		return invalid("new", "new (%d) is past the ledger's head (%d).", nw, head)
	case old > nw:
		return invalid("old", "old (%d) must not be past new (%d).", old, nw)
	}
	p, err := s.Log.Consistency(c.Request().Context(), old, nw)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

func (s *Server) handleInclusion(c echo.Context) error {
	head := s.head()
	seq, err := sizeParam(c, "seq", 0)
	if err != nil {
		return err
	}
	if head == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "The ledger holds no events yet.")
	}
	size, err := sizeParam(c, "size", head)
	if err != nil {
		return err
	}
	switch {
	case size > head:
		return invalid("size", "size (%d) is past the ledger's head (%d).", size, head)
	case seq > size:
		return invalid("seq", "Event %d is not in a tree of %d events.", seq, size)
	}
	p, err := s.Log.Inclusion(c.Request().Context(), seq, size)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, p)
}

func (s *Server) handleCheckpoints(c echo.Context) error {
	var after uint64
	cur, err := cursorParam(c)
	if err != nil {
		return err
	}
	if cur != "" {
		if after, err = strconv.ParseUint(cur, 10, 64); err != nil {
			return invalid("cursor", "cursor is not one this API issued; pass next_cursor back unchanged.")
		}
	}
	limit, err := limitParam(c, DefaultPageLimit)
	if err != nil {
		return err
	}
	cps, more, err := s.Log.Checkpoints(c.Request().Context(), after, limit)
	if err != nil {
		return err
	}
	out := struct {
		Checkpoints []CheckpointInfo `json:"checkpoints"`
		NextCursor  string           `json:"next_cursor,omitempty"`
	}{Checkpoints: cps}
	if out.Checkpoints == nil {
		out.Checkpoints = []CheckpointInfo{}
	}
	if more && len(cps) > 0 {
		out.NextCursor = encodeCursor(strconv.FormatUint(cps[len(cps)-1].Size, 10))
	}
	return c.JSON(http.StatusOK, out)
}

func (s *Server) handleCheckpointAt(c echo.Context) error {
	size, err := strconv.ParseUint(c.Param("size"), 10, 64)
	if err != nil || size == 0 {
		return invalid("size", "size must be a tree size: an integer from 1.")
	}
	if head := s.head(); size > head {
		return invalid("size", "size (%d) is past the ledger's head (%d).", size, head)
	}
	note, err := s.Log.CheckpointAt(c.Request().Context(), size)
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMETextPlainCharsetUTF8, note)
}

func (s *Server) handleCosign(c echo.Context) error {
	body, err := io.ReadAll(io.LimitReader(c.Request().Body, s.MaxBodyBytes+1))
	if err != nil {
		return err
	}
	if int64(len(body)) > s.MaxBodyBytes {
		return &auditd.Error{Code: codeTooLarge, Message: "A cosigned checkpoint is a few hundred bytes; this body is larger than the cap."}
	}
	if len(body) == 0 {
		return invalid("body", "The body must be the checkpoint note with the witness's cosignature line added.")
	}
	out, err := s.Log.Cosign(c.Request().Context(), body)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// handleLedgerEvents pages (or, with Accept: application/x-ndjson,
// streams) the events from..to whatever run they belong to: token and
// source changes, exports, every run's events.
func (s *Server) handleLedgerEvents(c echo.Context) error {
	head := s.head()
	from, err := sizeParam(c, "from", 1)
	if err != nil {
		return err
	}
	cur, err := cursorParam(c)
	if err != nil {
		return err
	}
	if cur != "" {
		after, err := strconv.ParseUint(cur, 10, 64)
		if err != nil {
			return invalid("cursor", "cursor is not one this API issued; pass next_cursor back unchanged.")
		}
		from = after + 1
	}
	to, err := sizeParam(c, "to", max(head, from))
	if err != nil {
		return err
	}
	if to < from && cur == "" {
		return invalid("to", "to (%d) must not be before from (%d).", to, from)
	}
	to = min(to, head)
	stream := wantsNDJSON(c)
	def := DefaultPageLimit
	if stream {
		def = 0
	}
	limit, err := limitParam(c, def)
	if err != nil {
		return err
	}
	if stream {
		w := c.Response()
		w.Header().Set(echo.HeaderContentType, MIMENDJSON)
		w.WriteHeader(http.StatusOK)
		if from > to {
			return nil
		}
		enc := json.NewEncoder(w)
		n := 0
		err := s.Log.Scan(from, to, func(e *auditd.Event) error {
			if limit > 0 && n == limit {
				return errPageFull
			}
			if n++; n%ndjsonFlushEvery == 0 {
				w.Flush()
			}
			return enc.Encode(auditd.NewEventJSON(e))
		})
		if err != nil && !errors.Is(err, errPageFull) {
			return err
		}
		w.Flush()
		return nil
	}
	out := struct {
		Events     []auditd.EventJSON `json:"events"`
		NextCursor string             `json:"next_cursor,omitempty"`
	}{Events: []auditd.EventJSON{}}
	if from <= to {
		err = s.Log.Scan(from, to, func(e *auditd.Event) error {
			if len(out.Events) == limit {
				out.NextCursor = encodeCursor(strconv.FormatUint(out.Events[len(out.Events)-1].Seq, 10))
				return errPageFull
			}
			out.Events = append(out.Events, auditd.NewEventJSON(e))
			return nil
		})
		if err != nil && !errors.Is(err, errPageFull) {
			return err
		}
	}
	return c.JSON(http.StatusOK, out)
}
