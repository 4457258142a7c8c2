package api

import (
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerEventRoutes(g *echo.Group) {
	g.GET("/runs/:id/events", s.handleListEvents, s.allow(auth.RoleAuditor, costRequest))
}

// MIMENDJSON asks GET /v1/runs/{id}/events for a stream, one event a line.
const MIMENDJSON = "application/x-ndjson"

// ndjsonFlushEvery is how many streamed events go out per flush.
const ndjsonFlushEvery = 256

// eventQuery is the parsed query of GET /v1/runs/{id}/events.
type eventQuery struct {
	after  uint64
	limit  int // 0: no limit (streams only)
	types  map[auditd.EventType]bool
	source string
}

func (q *eventQuery) matches(e *auditd.Event) bool {
	return (len(q.types) == 0 || q.types[e.Type]) && (q.source == "" || e.SourceID == q.source)
}

func parseEventQuery(c echo.Context, stream bool) (eventQuery, error) {
	var q eventQuery
	cur, err := cursorParam(c)
	if err != nil {
		return q, err
	}
	if cur != "" {
		if q.after, err = strconv.ParseUint(cur, 10, 64); err != nil {
			return q, invalid("cursor", "cursor is not one this API issued; pass next_cursor back unchanged.")
		}
	}
	def := DefaultPageLimit
	if stream {
		def = 0
	}
	if q.limit, err = limitParam(c, def); err != nil {
		return q, err
	}
	for _, raw := range c.QueryParams()["type"] {
		for _, t := range strings.Split(raw, ",") {
			if !auditd.EventType(t).Known() {
				return q, invalid("type", "Unknown event type %q.", t)
			}
			if q.types == nil {
				q.types = map[auditd.EventType]bool{}
			}
			q.types[auditd.EventType(t)] = true
		}
	}
	q.source = c.QueryParam("source")
	if len(q.source) > 100 {
		return q, invalid("source", "source is at most 100 characters.")
	}
	return q, nil
}

// wantsNDJSON reports whether the Accept header asks for NDJSON.
func wantsNDJSON(c echo.Context) bool {
	for _, part := range strings.Split(c.Request().Header.Get(echo.HeaderAccept), ",") {
		if mt, _, err := mime.ParseMediaType(strings.TrimSpace(part)); err == nil && mt == MIMENDJSON {
			return true
		}
	}
	return false
}

// errPageFull stops a scan once a page is full.
var errPageFull = errors.New("page full")

func (s *Server) handleListEvents(c echo.Context) error {
	stream := wantsNDJSON(c)
	q, err := parseEventQuery(c, stream)
	if err != nil {
		return err
	}
	runID := c.Param("id")
	if _, err := s.Runs.Run(c.Request().Context(), runID); err != nil {
		return err
	}
	if stream {
		return s.streamEvents(c, runID, q)
	}
	out := struct {
		Events     []auditd.EventJSON `json:"events"`
		NextCursor string             `json:"next_cursor,omitempty"`
	}{Events: []auditd.EventJSON{}}
	err = s.Ledger.ScanRun(runID, q.after, func(e *auditd.Event) error {
		if !q.matches(e) {
			return nil
		}
		if len(out.Events) == q.limit {
			out.NextCursor = encodeCursor(strconv.FormatUint(out.Events[len(out.Events)-1].Seq, 10))
			return errPageFull
		}
		out.Events = append(out.Events, auditd.NewEventJSON(e))
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

// streamEvents writes the matching events as NDJSON as the scan finds them,
// so a run of any size streams in constant memory.
func (s *Server) streamEvents(c echo.Context, runID string, q eventQuery) error {
	w := c.Response()
	w.Header().Set(echo.HeaderContentType, MIMENDJSON)
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	n := 0
	err := s.Ledger.ScanRun(runID, q.after, func(e *auditd.Event) error {
		if !q.matches(e) {
			return nil
		}
		if q.limit > 0 && n == q.limit {
			return errPageFull
		}
		if err := enc.Encode(auditd.NewEventJSON(e)); err != nil {
			return err
		}
		if n++; n%ndjsonFlushEvery == 0 {
			w.Flush()
		}
		return nil
	})
	if err != nil && !errors.Is(err, errPageFull) {
		return err
	}
	w.Flush()
	return nil
}
