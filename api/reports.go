package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerReportRoutes(g *echo.Group) {
	g.GET("/runs/:id/reconciliation", s.handleReconciliation, s.allow(auth.RoleAuditor, costReconcile))
	g.GET("/runs/:id/evidence.xlsx", s.handleRunEvidence, s.allow(auth.RoleAuditor, costExport))
	g.GET("/evidence.xlsx", s.handleAwardEvidence, s.allow(auth.RoleAuditor, costExport))
}

// Content types of exports.
const (
	MIMEXLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
	MIMECSV  = "text/csv; charset=utf-8"
)

var formatTypes = map[string]string{
	"json": echo.MIMEApplicationJSON,
	"csv":  MIMECSV,
	"xlsx": MIMEXLSX,
}

func (s *Server) handleReconciliation(c echo.Context) error {
	format := c.QueryParam("format")
	if format == "" {
		format = "json"
	}
	ctype, ok := formatTypes[format]
	if !ok {
		return invalid("format", "format must be json, csv or xlsx.")
	}
	runID := c.Param("id")
	if _, err := s.Runs.Run(c.Request().Context(), runID); err != nil {
		return err
	}
	// Reading the JSON (the UI, a CI job) is a view; a CSV or XLSX file is
	// a download. Both are in the access log, neither in the run's counts.
	access := auditd.EventViewed
	if format != "json" {
		access = auditd.EventExport
	}
	if err := s.recordAccess(c, access, runID, map[string]string{"what": "reconciliation", "run_id": runID, "format": format}); err != nil {
		return err
	}
	s.startDownload(c, ctype, fmt.Sprintf("reconciliation-%s.%s", runID, format), format != "json")
	return s.Reports.WriteReconciliation(c.Request().Context(), c.Response(), runID, format)
}

func (s *Server) handleRunEvidence(c echo.Context) error {
	runID := c.Param("id")
	if _, err := s.Runs.Run(c.Request().Context(), runID); err != nil {
		return err
	}
	if err := s.recordAccess(c, auditd.EventExport, runID, map[string]string{"what": "evidence", "run_id": runID, "format": "xlsx"}); err != nil {
		return err
	}
	s.startDownload(c, MIMEXLSX, "evidence-"+runID+".xlsx", true)
	return s.Reports.WriteRunEvidence(c.Request().Context(), c.Response(), runID)
}

func (s *Server) handleAwardEvidence(c echo.Context) error {
	q := c.QueryParams()
	fain := q.Get("award")
	if err := s.validate.Var(fain, "required,max=64,printascii"); err != nil {
		return invalid("award", "award must be the FAIN: 1 to 64 printable ASCII characters, without a leading or trailing space.")
	}
	from, to, err := rangeParams(q)
	if err != nil {
		return err
	}
	// An award with no run in the period is a 404 that records nothing:
	// nothing is downloaded.
	if runs, _, err := s.Runs.Runs(c.Request().Context(), auditd.RunFilter{FAIN: fain, From: from, To: to, Limit: 1}); err != nil {
		return err
	} else if len(runs) == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "No run of award %q in that period.", fain)
	}
	detail := map[string]string{"what": "evidence", "award": fain, "format": "xlsx"}
	if !from.IsZero() {
		detail["from"] = from.Format("2006-01-02T15:04:05.000Z07:00")
	}
	if !to.IsZero() {
		detail["to"] = to.Format("2006-01-02T15:04:05.000Z07:00")
	}
	if err := s.recordAccess(c, auditd.EventExport, "", detail); err != nil {
		return err
	}
	s.startDownload(c, MIMEXLSX, "evidence-"+sanitizeFilename(fain)+".xlsx", true)
	return s.Reports.WriteAwardEvidence(c.Request().Context(), c.Response(), auditd.RunFilter{FAIN: fain, From: from, To: to})
}

// recordAccess appends the access event (export.downloaded or
// report.viewed) before any byte of the report leaves: the access log
// never misses a download, though it may name one that failed half-way.
func (s *Server) recordAccess(c echo.Context, typ auditd.EventType, runID string, what map[string]string) error {
	detail, err := json.Marshal(what)
	if err != nil {
		return err
	}
	head, _ := s.Ledger.Head()
	_, err = s.Ledger.Append(c.Request().Context(), auditd.Event{
		Type:      typ,
		RunID:     runID,
		Principal: token(c).Principal(),
		Detail:    string(detail),
		Head:      strconv.FormatUint(head, 10),
	})
	if err != nil {
		return fmt.Errorf("record %s: %w", typ, err)
	}
	return nil
}

// startDownload sets the headers of an export; the body follows.
func (s *Server) startDownload(c echo.Context, ctype, filename string, attachment bool) {
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, ctype)
	if attachment {
		h.Set(echo.HeaderContentDisposition, fmt.Sprintf("attachment; filename=%q", filename))
	}
	h.Set("Cache-Control", "no-store")
	c.Response().Status = http.StatusOK
}

// sanitizeFilename keeps letters, digits, dot, dash and underscore.
func sanitizeFilename(s string) string {
	b := []byte(s)
	for i, ch := range b {
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || ch == '.' || ch == '-' || ch == '_') {
			b[i] = '_'
		}
	}
	return string(b)
}
