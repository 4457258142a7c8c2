package api

import (
	"io"
	"net/http"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerItemRoutes(g *echo.Group) {
	g.POST("/runs/:id/items", s.handleAddItems, s.allow(auth.RoleOperator, costInline))
	g.GET("/runs/:id/items", s.handleListItems, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/runs/:id/items/:key", s.handleGetItem, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/runs/:id/items/:key/payload", s.handleGetPayload, s.allow(auth.RoleAuditor, costRequest))
}

// addItemsRequest is the body of POST /v1/runs/{id}/items: a page of an
// open batch run's items.
type addItemsRequest struct {
	Items []auditd.Item `json:"items" validate:"required,min=1,max=100000,dive"`
}

// handleAddItems validates the page whole, charges the token one unit per
// item, and adds the page to the open run.
// An NDJSON body is a page of any size, streamed in (items_ndjson.go).
func (s *Server) handleAddItems(c echo.Context) error {
	if isNDJSON(c) {
		return s.handleAddItemsNDJSON(c)
	}
	var req addItemsRequest
	if err := s.bind(c, &req, s.MaxRunBodyBytes); err != nil {
		return err
	}
	if err := s.checkItems(c, req.Items); err != nil {
		return err
	}
	ctx := c.Request().Context()
	if _, err := s.Runs.Run(ctx, c.Param("id")); err != nil {
		return err
	}
	if err := s.charge(c, token(c), float64(costRequest+len(req.Items))); err != nil {
		return err
	}
	st, err := s.Runs.AddRunItems(ctx, c.Param("id"), req.Items)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, st)
}

func (s *Server) handleListItems(c echo.Context) error {
	after, err := cursorParam(c)
	if err != nil {
		return err
	}
	limit, err := limitParam(c, DefaultPageLimit)
	if err != nil {
		return err
	}
	items, next, err := s.Runs.Items(c.Request().Context(), c.Param("id"), after, limit)
	if err != nil {
		return err
	}
	if items == nil {
		items = []auditd.ItemView{}
	}
	return c.JSON(http.StatusOK, struct {
		Items      []auditd.ItemView `json:"items"`
		NextCursor string            `json:"next_cursor,omitempty"`
	}{Items: items, NextCursor: encodeCursor(next)})
}

func (s *Server) handleGetItem(c echo.Context) error {
	it, err := s.Runs.Item(c.Request().Context(), c.Param("id"), c.Param("key"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, it)
}

// PayloadHashHeader carries the SHA-256 (hex) of a staged payload.
const PayloadHashHeader = "X-Payload-Sha256"

func (s *Server) handleGetPayload(c echo.Context) error {
	ctx := c.Request().Context()
	runID, key := c.Param("id"), c.Param("key")
	it, err := s.Runs.Item(ctx, runID, key)
	if err != nil {
		return err
	}
	if it.Result == nil || it.Result.PayloadHash == "" {
		return auditd.Errorf(auditd.ENOTFOUND, "Item %q has no staged payload.", key)
	}
	rc, err := s.Runs.Payload(ctx, runID, key)
	if err != nil {
		return err
	}
	defer rc.Close()
	h := c.Response().Header()
	h.Set(PayloadHashHeader, it.Result.PayloadHash)
	h.Set(echo.HeaderContentType, echo.MIMEOctetStream)
	c.Response().WriteHeader(http.StatusOK)
	_, err = io.Copy(c.Response(), rc)
	return err
}
