package api

import (
	"io"
	"net/http"
	"net/url"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerItemRoutes(g *echo.Group) {
	g.GET("/runs/:id/items", s.handleListItems, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/runs/:id/items/:key", s.handleGetItem, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/runs/:id/items/:key/payload", s.handleGetPayload, s.allow(auth.RoleAuditor, costRequest))
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

// keyParam is the item key of an item route. A key holding "/" (every
// proxied request's derived key) is sent escaped, as %2F; echo then
// routes on the escaped path and leaves the parameter escaped.
func keyParam(c echo.Context) (string, error) {
	key := c.Param("key")
	if c.Request().URL.RawPath == "" {
		return key, nil // echo routed on the decoded path: the key is decoded
	}
	k, err := url.PathUnescape(key)
	if err != nil {
		return "", invalid("key", "The item key is not a valid escaped path segment.")
	}
	return k, nil
}

func (s *Server) handleGetItem(c echo.Context) error {
	key, err := keyParam(c)
	if err != nil {
		return err
	}
	it, err := s.Runs.Item(c.Request().Context(), c.Param("id"), key)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, it)
}

// PayloadHashHeader carries the SHA-256 (hex) of a staged payload.
const PayloadHashHeader = "X-Payload-Sha256"

func (s *Server) handleGetPayload(c echo.Context) error {
	ctx := c.Request().Context()
	runID := c.Param("id")
	key, err := keyParam(c)
	if err != nil {
		return err
	}
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
