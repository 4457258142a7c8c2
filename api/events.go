package api

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

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

// eventJSON is an event as the API shows it: snake_case, durations as Go
// duration strings, hashes in hex, zero fields left out.
type eventJSON struct {
	Seq            uint64           `json:"seq"`
	Type           auditd.EventType `json:"type"`
	RunID          string           `json:"run_id,omitempty"`
	SourceID       string           `json:"source_id,omitempty"`
	ItemKey        string           `json:"item_key,omitempty"`
	Page           uint32           `json:"page,omitempty"`
	Attempt        uint32           `json:"attempt,omitempty"`
	Time           time.Time        `json:"time"`
	Mono           auditd.Duration  `json:"mono,omitempty"`
	IdempotencyKey string           `json:"idempotency_key,omitempty"`
	Method         string           `json:"method,omitempty"`
	Path           string           `json:"path,omitempty"`
	Status         int              `json:"status,omitempty"`
	Bytes          int64            `json:"bytes,omitempty"`
	Latency        auditd.Duration  `json:"latency,omitempty"`
	Wait           auditd.Duration  `json:"wait,omitempty"`
	Actual         auditd.Duration  `json:"actual,omitempty"`
	RetryAfterRaw  string           `json:"retry_after_raw,omitempty"`
	RetryAfter     auditd.Duration  `json:"retry_after,omitempty"`
	Clamped        bool             `json:"clamped,omitempty"`
	Backoff        auditd.Duration  `json:"backoff,omitempty"`
	From           string           `json:"from,omitempty"`
	To             string           `json:"to,omitempty"`
	Failures       int              `json:"failures,omitempty"`
	Threshold      int              `json:"threshold,omitempty"`
	Cooldown       auditd.Duration  `json:"cooldown,omitempty"`
	OldLimit       int              `json:"old_limit,omitempty"`
	NewLimit       int              `json:"new_limit,omitempty"`
	OldWindow      auditd.Duration  `json:"old_window,omitempty"`
	NewWindow      auditd.Duration  `json:"new_window,omitempty"`
	Group          string           `json:"group,omitempty"`
	Outcome        auditd.Outcome   `json:"outcome,omitempty"`
	BodyError      string           `json:"body_error,omitempty"`
	PayloadHash    string           `json:"payload_hash,omitempty"`
	Cause          string           `json:"cause,omitempty"`
	Principal      string           `json:"principal,omitempty"`
	Detail         string           `json:"detail,omitempty"`
	PrevHash       string           `json:"prev_hash"`
	Hash           string           `json:"hash"`
}

func newEventJSON(e *auditd.Event) eventJSON {
	attempt, cause := e.Shared() // "attempt" and "cause" hold what the ledger's encoding does
	return eventJSON{
		Seq: e.Seq, Type: e.Type, RunID: e.RunID, SourceID: e.SourceID, ItemKey: e.ItemKey,
		Page: e.Page, Attempt: attempt, Time: e.Time.UTC(), Mono: auditd.Duration(e.Mono),
		IdempotencyKey: e.IdempotencyKey, Method: e.Method, Path: e.Path, Status: e.Status,
		Bytes: e.Bytes, Latency: auditd.Duration(e.Latency), Wait: auditd.Duration(e.Wait),
		Actual: auditd.Duration(e.Actual), RetryAfterRaw: e.RetryAfterRaw,
		RetryAfter: auditd.Duration(e.RetryAfter), Clamped: e.Clamped, Backoff: auditd.Duration(e.Backoff),
		From: e.From, To: e.To, Failures: e.Failures, Threshold: e.Threshold,
		Cooldown: auditd.Duration(e.Cooldown), OldLimit: e.OldLimit, NewLimit: e.NewLimit,
		OldWindow: auditd.Duration(e.OldWindow), NewWindow: auditd.Duration(e.NewWindow),
		Group: e.Group, Outcome: e.Outcome, BodyError: e.BodyError, PayloadHash: e.PayloadHash,
		Cause: cause, Principal: e.Principal, Detail: e.Detail,
		PrevHash: hex.EncodeToString(e.PrevHash[:]), Hash: hex.EncodeToString(e.Hash[:]),
	}
}

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
			if !knownEventType(auditd.EventType(t)) {
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

func knownEventType(t auditd.EventType) bool {
	switch t {
	case auditd.EventRunStarted, auditd.EventRunResumed, auditd.EventRunFinished, auditd.EventItemQueued,
		auditd.EventDispatch, auditd.EventWait, auditd.EventResponse, auditd.EventThrottle,
		auditd.EventTransportError, auditd.EventInterrupted, auditd.EventBreaker,
		auditd.EventRegistryChanged, auditd.EventRegistrySnapshot, auditd.EventShed,
		auditd.EventCacheServed, auditd.EventPayloadStaged, auditd.EventItemFinished,
		auditd.EventAcknowledged, auditd.EventExport, auditd.EventTokenChanged, auditd.EventSourceChanged:
		return true
	}
	return false
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
		Events     []eventJSON `json:"events"`
		NextCursor string      `json:"next_cursor,omitempty"`
	}{Events: []eventJSON{}}
	err = s.Ledger.ScanRun(runID, q.after, func(e *auditd.Event) error {
		if !q.matches(e) {
			return nil
		}
		if len(out.Events) == q.limit {
			out.NextCursor = encodeCursor(strconv.FormatUint(out.Events[len(out.Events)-1].Seq, 10))
			return errPageFull
		}
		out.Events = append(out.Events, newEventJSON(e))
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
		if err := enc.Encode(newEventJSON(e)); err != nil {
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
