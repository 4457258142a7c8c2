package api

import (
	"net/http"

	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerTokenRoutes(g *echo.Group) {
	g.POST("/tokens", s.handleCreateToken, s.allow(auth.RoleAdmin, costRequest))
	g.GET("/tokens", s.handleListTokens, s.allow(auth.RoleAdmin, costRequest))
	g.DELETE("/tokens/:id", s.handleRevokeToken, s.allow(auth.RoleAdmin, costRequest))
}

// createTokenRequest is the body of POST /v1/tokens.
type createTokenRequest struct {
	Name string    `json:"name" validate:"required,max=100,printascii"`
	Role auth.Role `json:"role" validate:"required,oneof=admin operator auditor"`
}

// createdTokenJSON is the only response that ever carries a secret.
type createdTokenJSON struct {
	auth.Token
	Secret string `json:"secret"`
}

func (s *Server) handleCreateToken(c echo.Context) error {
	var req createTokenRequest
	if err := s.bind(c, &req, s.MaxBodyBytes); err != nil {
		return err
	}
	tok, secret, err := s.Tokens.Create(c.Request().Context(), req.Name, req.Role, token(c).Principal())
	if err != nil {
		return err
	}
	c.Response().Header().Set("Cache-Control", "no-store")
	return c.JSON(http.StatusCreated, createdTokenJSON{Token: tok, Secret: secret})
}

func (s *Server) handleListTokens(c echo.Context) error {
	toks, err := s.Tokens.List()
	if err != nil {
		return err
	}
	if toks == nil {
		toks = []auth.Token{}
	}
	return c.JSON(http.StatusOK, struct {
		Tokens []auth.Token `json:"tokens"`
	}{toks})
}

// handleRevokeToken revokes a token; revoking a revoked one is a no-op, so
// DELETE stays idempotent.
func (s *Server) handleRevokeToken(c echo.Context) error {
	if _, _, err := s.Tokens.Revoke(c.Request().Context(), c.Param("id"), token(c).Principal()); err != nil {
		return err
	}
	return c.NoContent(http.StatusNoContent)
}
