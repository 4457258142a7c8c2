package api

import (
	"context"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/reports"
	"github.com/labstack/echo/v4"
)

// The fleet routes (docs/FLEET.md, "Fleet runs"): a proxy-mode run that
// every node of a fleet takes requests for, its reconciliation and its
// evidence pack over every node's part, and this node's place in the
// fleet log of logs.

// FleetRun is a fleet run as the API shows it.
type FleetRun struct {
	ID          string          `json:"id"`
	Name        string          `json:"name"`
	Node        string          `json:"node"` // the node it was created on
	CreatedAt   time.Time       `json:"created_at"`
	IdleTimeout auditd.Duration `json:"idle_timeout,omitempty"`
	// Parts are the nodes that took requests of the run, by name.
	Parts []string `json:"parts"`
	// FinishedAt is when the run was first finished: no node joins it
	// after. Zero while it takes requests.
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// FleetPartOf marks a node's run that is its part of a fleet run (GET
// /v1/runs/{id}): what the run's own routes show is this node's part
// only, and Href is the fleet run's, over every part. Unknown says the
// node could not ask the fleet in time (Parts and Href empty then).
type FleetPartOf struct {
	Node    string   `json:"node"`
	Parts   []string `json:"parts,omitempty"`
	Href    string   `json:"href,omitempty"`
	Unknown bool     `json:"unknown,omitempty"`
}

// FleetLogStatus is this node's posting to the fleet log of logs: what it
// last posted and cosigned, and its failures, which are never skipped
// silently.
type FleetLogStatus struct {
	Node string `json:"node"`
	// Posted is the size of the node's last checkpoint the fleet log
	// accepted, Leaf its fleet leaf; Cosigned the last fleet tree size the
	// node cosigned.
	Posted   uint64 `json:"posted_size"`
	Leaf     uint64 `json:"fleet_leaf"`
	Cosigned uint64 `json:"cosigned_size"`
	Posts    int64  `json:"posts"`
	Failures int64  `json:"failures"`
	// LastError is the last failure to post or cosign, and when.
	LastError   string    `json:"last_error,omitempty"`
	LastErrorAt time.Time `json:"last_error_at,omitzero"`
}

// FleetTree is a fleet checkpoint's body, as cosigned.
type FleetTree struct {
	Origin string `json:"origin"`
	Size   uint64 `json:"size"`
	Root   string `json:"root"` // base64
}

// Fleet serves the fleet routes (cmd/auditd's fleet runs). Calls that
// reach the other nodes carry the caller's Authorization header: the
// fleet's nodes accept the same tokens.
type Fleet interface {
	CreateRun(ctx context.Context, principal, name string, idle time.Duration) (FleetRun, error)
	// Run returns the fleet run; ENOTFOUND when etcd has none of id.
	Run(ctx context.Context, id string) (FleetRun, error)
	// Runs lists up to limit fleet runs, newest first, older than the
	// run before when it is set.
	Runs(ctx context.Context, before string, limit int) ([]FleetRun, error)
	// PartOf says whether this node's run id is its part of a fleet run,
	// or (Unknown) that the fleet could not be asked in time.
	PartOf(ctx context.Context, id string) (FleetPartOf, bool)
	// PartsOf is PartOf for a page of this node's runs, without the
	// parts: the runs of ids that are parts, or whose answer is Unknown.
	PartsOf(ctx context.Context, ids []string) map[string]FleetPartOf
	// FinishRun finishes every node's part of the run.
	FinishRun(ctx context.Context, id, principal, authorization string) (FleetRun, error)
	// Reconciliation sums every node's Part.
	Reconciliation(ctx context.Context, id, authorization string) (*reports.FleetReport, error)
	// Part reconciles this node's part of the run, posting its checkpoint
	// to the fleet log after, so that the part is covered.
	Part(ctx context.Context, id string) (reports.FleetPart, error)
	// WritePack writes the fleet pack of the run (pack.WriteFleet).
	WritePack(ctx context.Context, w io.Writer, id, authorization string) error
	// WritePart writes this node's part of the run as a fleet pack of one
	// node, its checkpoint posted to the fleet log first.
	WritePart(ctx context.Context, w io.Writer, id string) error
	// WriteEvidence writes the fleet run's evidence workbook, every
	// node's rows behind a Node column (reports.WriteFleetEvidence).
	WriteEvidence(ctx context.Context, w io.Writer, id, authorization string) error
	// Timeline is every node's timeline of the run with q's bucket.
	Timeline(ctx context.Context, id string, q auditd.TimelineQuery, authorization string) (*reports.FleetTimeline, error)
	// Cosign cosigns the fleet log's tree of size leaves.
	Cosign(ctx context.Context, size uint64) (FleetTree, error)
	LogStatus(ctx context.Context) FleetLogStatus
}

// errNoFleet is the answer of a node not in a fleet: a 404 of its own
// problem type, which a client tells apart from a fleet run that does not
// exist (not_found) and from etcd out of reach (unavailable).
var errNoFleet = &auditd.Error{Code: codeNotInFleet, Message: "This node is not in a fleet (serve --fleet-etcd)."}

func (s *Server) registerFleetRoutes(g *echo.Group) {
	run := func(role auth.Role, cost float64) []echo.MiddlewareFunc {
		return []echo.MiddlewareFunc{s.allow(role, cost), s.inFleet}
	}
	g.POST("/fleet/runs", s.handleCreateFleetRun, run(auth.RoleOperator, costRequest)...)
	g.GET("/fleet/runs", s.handleListFleetRuns, run(auth.RoleAuditor, costRequest)...)
	g.GET("/fleet/runs/:id", s.handleGetFleetRun, run(auth.RoleAuditor, costRequest)...)
	g.POST("/fleet/runs/:id/finish", s.handleFinishFleetRun, run(auth.RoleOperator, costRequest)...)
	g.GET("/fleet/runs/:id/reconciliation", s.handleFleetReconciliation, run(auth.RoleAuditor, costReconcile)...)
	g.GET("/fleet/runs/:id/evidence.xlsx", s.handleFleetEvidence, run(auth.RoleAuditor, costExport)...)
	g.GET("/fleet/runs/:id/timeline", s.handleFleetTimeline, run(auth.RoleAuditor, costTimeline)...)
	g.GET("/fleet/runs/:id/evidence-pack.zip", s.handleFleetPack, run(auth.RoleAuditor, costExport)...)
	g.GET("/fleet/runs/:id/part", s.handleFleetPartReconciliation, run(auth.RoleAuditor, costReconcile)...)
	g.GET("/fleet/runs/:id/part.zip", s.handleFleetPart, run(auth.RoleAuditor, costExport)...)
	g.GET("/fleet/sources", s.handleFleetSources, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/fleet/log", s.handleFleetLog, run(auth.RoleAuditor, costRequest)...)
	g.POST("/fleet/log/cosignatures", s.handleFleetCosign, run(auth.RoleOperator, costRequest)...)
}

// inFleet answers errNoFleet on a node not in a fleet, after the token's
// check (a request without one is still a 401) and before the handler.
func (s *Server) inFleet(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.Fleet == nil {
			return errNoFleet
		}
		return next(c)
	}
}

// createFleetRunRequest is the body of POST /v1/fleet/runs.
type createFleetRunRequest struct {
	Name        string          `json:"name" validate:"required,max=200"`
	IdleTimeout auditd.Duration `json:"idle_timeout,omitempty"`
}

// fleetCosignRequest is the body of POST /v1/fleet/log/cosignatures.
type fleetCosignRequest struct {
	Size uint64 `json:"size" validate:"required,min=1"`
}

// fleetRunID checks the path's run id before anything reaches etcd.
func fleetRunID(c echo.Context) (string, error) {
	id := c.Param("id")
	if !runIDPattern.MatchString(id) {
		return "", &auditd.Error{Code: auditd.ENOTFOUND, Message: "No fleet run " + id + ": a run id is a ULID."}
	}
	return id, nil
}

func (s *Server) handleCreateFleetRun(c echo.Context) error {
	var req createFleetRunRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	if d := req.IdleTimeout.D(); d < 0 || d > maxIdleTimeout {
		return invalid("idle_timeout", "idle_timeout must be from 0 to %v.", maxIdleTimeout)
	}
	run, err := s.Fleet.CreateRun(c.Request().Context(), token(c).Principal(), req.Name, req.IdleTimeout.D())
	if err != nil {
		return err
	}
	c.Response().Header().Set(echo.HeaderLocation, "/v1/fleet/runs/"+run.ID)
	return c.JSON(http.StatusCreated, run)
}

// fleetCursor begins a cursor of the fleet's runs, so that another list's
// cursor (GET /v1/runs's, a run id too) is refused, not taken as a place.
const fleetCursor = "fleet:"

func (s *Server) handleListFleetRuns(c echo.Context) error {
	pos, err := cursorParam(c)
	if err != nil {
		return err
	}
	before, ok := strings.CutPrefix(pos, fleetCursor)
	if pos != "" && (!ok || !runIDPattern.MatchString(before)) {
		return invalid("cursor", "cursor is not one this API issued for the fleet's runs; pass next_cursor back unchanged.")
	}
	limit, err := limitParam(c, DefaultPageLimit)
	if err != nil {
		return err
	}
	runs, err := s.Fleet.Runs(c.Request().Context(), before, limit+1)
	if err != nil {
		return err
	}
	var next string
	if len(runs) > limit {
		runs, next = runs[:limit], fleetCursor+runs[limit-1].ID
	}
	return c.JSON(http.StatusOK, struct {
		Runs       []FleetRun `json:"runs"`
		NextCursor string     `json:"next_cursor,omitempty"`
	}{Runs: runs, NextCursor: encodeCursor(next)})
}

func (s *Server) handleGetFleetRun(c echo.Context) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	run, err := s.Fleet.Run(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, run)
}

func (s *Server) handleFinishFleetRun(c echo.Context) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	run, err := s.Fleet.FinishRun(c.Request().Context(), id, token(c).Principal(), c.Request().Header.Get(echo.HeaderAuthorization))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, run)
}

func (s *Server) handleFleetReconciliation(c echo.Context) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	rep, err := s.Fleet.Reconciliation(c.Request().Context(), id, c.Request().Header.Get(echo.HeaderAuthorization))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rep)
}

// handleFleetPack and handleFleetEvidence record the download, as a
// node's pack and workbook do, then build the fleet's from every node's;
// nothing is written until every node's part is in.
func (s *Server) handleFleetPack(c echo.Context) error {
	return s.fleetDownload(c, "fleet-evidence-pack", "zip", MIMEZIP, s.Fleet.WritePack)
}

func (s *Server) handleFleetEvidence(c echo.Context) error {
	return s.fleetDownload(c, "fleet-evidence", "xlsx", MIMEXLSX, s.Fleet.WriteEvidence)
}

func (s *Server) fleetDownload(c echo.Context, what, format, mime string, write func(ctx context.Context, w io.Writer, id, authz string) error) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	if _, err := s.Fleet.Run(c.Request().Context(), id); err != nil {
		return err
	}
	return write(c.Request().Context(), s.fleetDownloadTo(c, what, format, mime, id), id, c.Request().Header.Get(echo.HeaderAuthorization))
}

// fleetDownloadTo is a fleet download's writer: the access is recorded,
// and the download starts, at its first byte, once every part came and was
// checked; a download refused before (a part still running, a token a
// node refuses) records nothing.
func (s *Server) fleetDownloadTo(c echo.Context, what, format, mime, id string) *lazyDownload {
	return &lazyDownload{s: s, c: c, mime: mime, name: what + "-" + sanitizeFilename(id) + "." + format, record: func() error {
		return s.recordAccess(c, auditd.EventExport, id, map[string]string{"what": what, "run_id": id, "format": format})
	}}
}

// handleFleetTimeline answers as a run's timeline does; without ?bucket=,
// the buckets cover the fleet run from its creation to now.
func (s *Server) handleFleetTimeline(c echo.Context) error {
	q := c.QueryParams()
	bucket, err := bucketParam(q)
	if err != nil {
		return err
	}
	sources, err := s.sourcesParam(q)
	if err != nil {
		return err
	}
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	run, err := s.Fleet.Run(ctx, id)
	if err != nil {
		return err
	}
	if bucket == 0 {
		bucket = autoBucket(s.Clock.Now().Sub(run.CreatedAt))
	}
	tl, err := s.Fleet.Timeline(ctx, id, auditd.TimelineQuery{Bucket: bucket, Sources: sources}, c.Request().Header.Get(echo.HeaderAuthorization))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tl)
}

func (s *Server) handleFleetPartReconciliation(c echo.Context) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	part, err := s.Fleet.Part(c.Request().Context(), id)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, part)
}

func (s *Server) handleFleetPart(c echo.Context) error {
	id, err := fleetRunID(c)
	if err != nil {
		return err
	}
	return s.Fleet.WritePart(c.Request().Context(), s.fleetDownloadTo(c, "fleet-part", "zip", MIMEZIP, id), id)
}

func (s *Server) handleFleetLog(c echo.Context) error {
	return c.JSON(http.StatusOK, s.Fleet.LogStatus(c.Request().Context()))
}

func (s *Server) handleFleetCosign(c echo.Context) error {
	var req fleetCosignRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	t, err := s.Fleet.Cosign(c.Request().Context(), req.Size)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, t)
}

// lazyDownload starts a download at its first write, so that an error
// before it still reaches the client as a problem; record, when set, is
// called first, and its error fails the write before anything is sent.
type lazyDownload struct {
	s       *Server
	c       echo.Context
	mime    string
	name    string
	record  func() error
	started bool
}

func (d *lazyDownload) Write(p []byte) (int, error) {
	if !d.started {
		if d.record != nil {
			if err := d.record(); err != nil {
				return 0, err
			}
		}
		d.started = true
		d.s.startDownload(d.c, d.mime, d.name, true)
	}
	return d.c.Response().Write(p)
}
