package api

import (
	"context"
	"net/http"
	"time"

	"github.com/auditd/auditd"
	"github.com/labstack/echo/v4"
)

// FleetSources is the fleet's view of its shared budgets, as one node
// sees it (GET /v1/fleet/sources): per shared key, the limit told and
// learned, and every node's recent use of it.
type FleetSources struct {
	Node string `json:"node"` // the node answering
	// PeersError says why the other nodes' use is missing: etcd did not
	// answer this node (it may be cut off). Only this node's row is shown
	// then.
	PeersError string        `json:"peers_error,omitempty"`
	Sources    []FleetSource `json:"sources"` // sorted by key
}

// FleetSource is one shared budget: a source's, or a gateway group's.
type FleetSource struct {
	Key   string `json:"key"`
	Group bool   `json:"group"` // the key names a gateway group
	// Members are this node's sources that spend the budget.
	Members []string `json:"members"`
	// Limit per Window is the ceiling the fleet is told and shares;
	// Learned per LearnedWindow the limit the fleet learned, which this
	// node reserves its slots at (0 until one is read), last written by
	// LearnedBy.
	Limit         int             `json:"limit"`
	Window        auditd.Duration `json:"window"`
	Learned       int             `json:"learned_limit"`
	LearnedWindow auditd.Duration `json:"learned_window"`
	LearnedBy     string          `json:"learned_by,omitempty"`
	// Learner is the node elected to raise and probe the key's limit;
	// empty when no reporting node leads it.
	Learner string `json:"learner,omitempty"`
	// Nodes are the nodes' recent use of the key, this node first, then
	// by name.
	Nodes []FleetNodeUse `json:"nodes"`
}

// FleetNodeUse is one node's use of one shared key over its last Span:
// the slots it was granted, used and wasted, and where it stands now.
type FleetNodeUse struct {
	Node       string          `json:"node"`
	ReportedAt time.Time       `json:"reported_at"`
	Span       auditd.Duration `json:"span"` // the stretch counted, up to a minute
	Blocks     int64           `json:"blocks"`
	Reserved   int64           `json:"reserved"`
	Used       int64           `json:"used"`
	Wasted     int64           `json:"wasted"`
	Held       int             `json:"held"`
	// Share is the node's part of the slots every reporting node was
	// granted in the span, 0 to 1; 0 when the others are not known
	// (PeersError).
	Share       float64   `json:"share"`
	CutOff      bool      `json:"cut_off"`
	PausedUntil time.Time `json:"paused_until,omitzero"`
	// Etcd is the round trip of the node's last granted reservation.
	Etcd auditd.Duration `json:"etcd_latency"`
	// Learner is true when the node is the key's learner: the one that
	// raises and probes its limit.
	Learner bool `json:"learner"`
}

// FleetView serves GET /v1/fleet/sources (cmd/auditd's fleet view).
type FleetView interface {
	// Node is this node's name in the fleet.
	Node() string
	FleetSources(ctx context.Context) (FleetSources, error)
}

// fleetRef is GET /v1/sources' pointer to the fleet's view, on a node in a
// fleet only.
type fleetRef struct {
	Node string `json:"node"`
	View string `json:"view"`
}

func (s *Server) handleFleetSources(c echo.Context) error {
	if s.FleetView == nil {
		return errNoFleet
	}
	v, err := s.FleetView.FleetSources(c.Request().Context())
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, v)
}
