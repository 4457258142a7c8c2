package api

import (
	"net/http"
	"strconv"

	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

func (s *Server) registerLedgerRoutes(g *echo.Group) {
	g.GET("/ledger/verify", s.handleVerify, s.allow(auth.RoleAuditor, costVerify))
	g.GET("/ledger/checkpoint", s.handleCheckpoint, s.allowPublic(auth.RoleAuditor, costRequest))
	g.GET("/ledger/proof/:seq", s.handleProof, s.allow(auth.RoleAuditor, costRequest))
	g.GET("/ledger/public-key", s.handlePublicKey, s.allowPublic(auth.RoleAuditor, costRequest))
}

func (s *Server) handleVerify(c echo.Context) error {
	v, err := s.Integrity.Verify(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}

func (s *Server) handleCheckpoint(c echo.Context) error {
	note, err := s.Ledger.Checkpoint()
	if err != nil {
		return err
	}
	return c.Blob(http.StatusOK, echo.MIMETextPlainCharsetUTF8, note)
}

func (s *Server) handleProof(c echo.Context) error {
	seq, err := strconv.ParseUint(c.Param("seq"), 10, 64)
	if err != nil || seq == 0 {
		return invalid("seq", "seq must be a sequence number: an integer from 1.")
	}
	p, err := s.Integrity.Prove(c.Request().Context(), seq)
	if err != nil {
		return err
	}
	if p.Hashes == nil {
		p.Hashes = []string{} // a tree of one leaf: its root needs no hash
	}
	return c.JSON(http.StatusOK, p)
}

func (s *Server) handlePublicKey(c echo.Context) error {
	return c.String(http.StatusOK, s.Ledger.PublicKey()+"\n")
}
