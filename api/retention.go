package api

import (
	"context"
	"net/http"
	"time"

	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/retention"
	"github.com/labstack/echo/v4"
)

// Retention keeps awards' retention dates and legal holds, each change a
// ledger event naming the token. *retention.Keeper implements it. Purges
// are not served here: they run offline (auditd retention purge), where
// no run can stage a payload while it is being purged.
type Retention interface {
	SetRetention(ctx context.Context, principal, fain string, finalReport, retainUntil time.Time) (retention.Award, error)
	PlaceHold(ctx context.Context, principal, fain, reason string) (retention.Hold, error)
	ReleaseHold(ctx context.Context, principal, fain, id, reason string) (retention.Hold, error)
	Status(fain string) (retention.Status, error)
}

func (s *Server) registerRetentionRoutes(g *echo.Group) {
	g.GET("/awards/:fain/retention", s.handleRetention, s.allow(auth.RoleAuditor, costRequest))
	g.PUT("/awards/:fain/retention", s.handleSetRetention, s.allow(auth.RoleAdmin, costRequest))
	g.POST("/awards/:fain/holds", s.handlePlaceHold, s.allow(auth.RoleAdmin, costRequest))
	g.POST("/awards/:fain/holds/:id/release", s.handleReleaseHold, s.allow(auth.RoleAdmin, costRequest))
}

type retentionRequest struct {
	FinalReport string `json:"final_report" validate:"required,datetime=2006-01-02"`
	// RetainUntil, when given, is a date: "" is refused, not read as absent.
	RetainUntil *string `json:"retain_until" validate:"omitnil,datetime=2006-01-02"`
}

type holdRequest struct {
	Reason string `json:"reason" validate:"required,max=1000"`
}

// fain is the award's FAIN in the path, checked as an Award's fain is.
func (s *Server) fain(c echo.Context) (string, error) {
	fain := c.Param("fain")
	if s.validate.Var(fain, "required,max=64,printascii") != nil {
		return "", invalid("fain", "The FAIN in the path must be 1 to 64 printable ASCII characters, without a leading or trailing space.")
	}
	return fain, nil
}

func (s *Server) handleRetention(c echo.Context) error {
	fain, err := s.fain(c)
	if err != nil {
		return err
	}
	st, err := s.Retention.Status(fain)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) handleSetRetention(c echo.Context) error {
	fain, err := s.fain(c)
	if err != nil {
		return err
	}
	var req retentionRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	fr, _ := time.Parse(time.DateOnly, req.FinalReport)
	var ru time.Time
	if req.RetainUntil != nil {
		ru, _ = time.Parse(time.DateOnly, *req.RetainUntil)
	}
	if _, err := s.Retention.SetRetention(c.Request().Context(), token(c).Principal(), fain, fr, ru); err != nil {
		return err
	}
	return s.handleRetention(c)
}

func (s *Server) handlePlaceHold(c echo.Context) error {
	fain, err := s.fain(c)
	if err != nil {
		return err
	}
	var req holdRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	h, err := s.Retention.PlaceHold(c.Request().Context(), token(c).Principal(), fain, req.Reason)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, h)
}

func (s *Server) handleReleaseHold(c echo.Context) error {
	fain, err := s.fain(c)
	if err != nil {
		return err
	}
	var req holdRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	h, err := s.Retention.ReleaseHold(c.Request().Context(), token(c).Principal(), fain, c.Param("id"), req.Reason)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, h)
}
