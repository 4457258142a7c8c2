package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerReportRoutes(g *echo.Group) {
	g.GET("/runs/:id/reconciliation", s.handleReconciliation, s.allow(auth.RoleAuditor, costReconcile))
	g.GET("/runs/:id/evidence.xlsx", s.handleRunEvidence, s.allow(auth.RoleAuditor, costExport))
	g.GET("/evidence.xlsx", s.handleAwardEvidence, s.allow(auth.RoleAuditor, costExport))
	g.GET("/runs/:id/evidence-pack.zip", s.handleRunPack, s.allow(auth.RoleAuditor, costExport))
	g.GET("/evidence-pack.zip", s.handleAwardPack, s.allow(auth.RoleAuditor, costExport))
}

// Content types of exports.
const (
	MIMEXLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
	MIMECSV  = "text/csv; charset=utf-8"
	MIMEZIP  = "application/zip"
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
	a, err := s.awardQuery(c)
	if err != nil {
		return err
	}
	// An award with no run in the period is a 404 that records nothing:
	// nothing is downloaded.
	if runs, _, err := s.Runs.Runs(c.Request().Context(), auditd.RunFilter{FAIN: a.fain, From: a.from, To: a.to, Limit: 1}); err != nil {
		return err
	} else if len(runs) == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "No run of award %q in that period.", a.fain)
	}
	if err := s.recordAccess(c, auditd.EventExport, "", a.detail("evidence", "xlsx")); err != nil {
		return err
	}
	s.startDownload(c, MIMEXLSX, "evidence-"+sanitizeFilename(a.fain)+".xlsx", true)
	return s.Reports.WriteAwardEvidence(c.Request().Context(), c.Response(), auditd.RunFilter{FAIN: a.fain, From: a.from, To: a.to})
}

// awardPeriod is the award and period an award's export covers.
type awardPeriod struct {
	fain     string
	from, to time.Time
}

// awardQuery reads ?award=&from=&to=.
func (s *Server) awardQuery(c echo.Context) (awardPeriod, error) {
	q := c.QueryParams()
	fain := q.Get("award")
	if err := s.validate.Var(fain, "required,max=64,printascii"); err != nil {
		return awardPeriod{}, invalid("award", "award must be the FAIN: 1 to 64 printable ASCII characters, without a leading or trailing space.")
	}
	from, to, err := rangeParams(q)
	return awardPeriod{fain: fain, from: from, to: to}, err
}

// detail is the access event's detail of a download of what as format.
func (a awardPeriod) detail(what, format string) map[string]string {
	d := map[string]string{"what": what, "award": a.fain, "format": format}
	if !a.from.IsZero() {
		d["from"] = a.from.Format("2006-01-02T15:04:05.000Z07:00")
	}
	if !a.to.IsZero() {
		d["to"] = a.to.Format("2006-01-02T15:04:05.000Z07:00")
	}
	return d
}

func (s *Server) handleRunPack(c echo.Context) error {
	if s.Packs == nil {
		return errNoPacks
	}
	runID := c.Param("id")
	run, err := s.Runs.Run(c.Request().Context(), runID)
	if err != nil {
		return err
	}
	if err := packable(run); err != nil {
		return err
	}
	if err := s.recordAccess(c, auditd.EventExport, runID, map[string]string{"what": "evidence-pack", "run_id": runID, "format": "zip"}); err != nil {
		return err
	}
	s.startDownload(c, MIMEZIP, "evidence-pack-"+sanitizeFilename(runID)+".zip", true)
	return s.Packs.WritePack(c.Request().Context(), c.Response(), []string{runID}, "run "+runID)
}

func (s *Server) handleAwardPack(c echo.Context) error {
	if s.Packs == nil {
		return errNoPacks
	}
	a, err := s.awardQuery(c)
	if err != nil {
		return err
	}
	var ids []string
	f := auditd.RunFilter{FAIN: a.fain, From: a.from, To: a.to, Limit: 500}
	err = auditd.EachRun(c.Request().Context(), s.Runs, f, func(r auditd.RunView) error {
		if err := packable(r); err != nil {
			return err
		}
		ids = append(ids, r.ID)
		return nil
	})
	if err != nil {
		return err
	}
	if len(ids) == 0 {
		return auditd.Errorf(auditd.ENOTFOUND, "No run of award %q in that period.", a.fain)
	}
	slices.Reverse(ids) // oldest first, as an auditor reads a period
	if err := s.recordAccess(c, auditd.EventExport, "", a.detail("evidence-pack", "zip")); err != nil {
		return err
	}
	s.startDownload(c, MIMEZIP, "evidence-pack-"+sanitizeFilename(a.fain)+".zip", true)
	return s.Packs.WritePack(c.Request().Context(), c.Response(), ids, f.AwardPeriod())
}

var errNoPacks = auditd.Errorf(auditd.EUNAVAILABLE, "Evidence packs are not configured on this server.")

// packable refuses a run that has not ended: a pack proves a run's whole
// range, which a running run has not written yet.
func packable(r auditd.RunView) error {
	if !r.Status.Terminal() {
		return auditd.Errorf(auditd.ECONFLICT, "Run %s is %s: its evidence pack can be downloaded once it has ended.", r.ID, r.Status)
	}
	return nil
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
