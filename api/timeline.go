package api

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/labstack/echo/v4"
)

// Timelines adds up ledger events per time bucket for the charts of the
// run and source pages. *reports.Timelines implements it. Like the
// interfaces of deps.go, it returns an *auditd.Error naming the field for
// what the client got wrong (a range too long for the bucket).
type Timelines interface {
	RunTimeline(ctx context.Context, runID string, q auditd.TimelineQuery) (*auditd.Timeline, error)
	SourceTimeline(ctx context.Context, sourceID string, q auditd.TimelineQuery) (*auditd.Timeline, error)
}

// Bounds of ?bucket= and the defaults of the timeline routes.
const (
	MinTimelineBucket = 100 * time.Millisecond
	MaxTimelineBucket = 24 * time.Hour
	// DefaultSourceTimelineRange is how far back a source's timeline
	// reaches when the request gives no from.
	DefaultSourceTimelineRange = time.Hour
	// timelineBuckets is about how many buckets a timeline without
	// ?bucket= gets: a chart's worth.
	timelineBuckets = 240
	// costTimeline: a timeline reads a whole run, like a reconciliation.
	costTimeline = 5
)

// niceBuckets are the widths a timeline without ?bucket= is given: the
// narrowest that keeps it near timelineBuckets.
var niceBuckets = []time.Duration{
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 3 * time.Hour, 6 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

func (s *Server) registerTimelineRoutes(g *echo.Group) {
	g.GET("/runs/:id/timeline", s.handleRunTimeline, s.allow(auth.RoleAuditor, costTimeline))
	g.GET("/sources/:id/timeline", s.handleSourceTimeline, s.allow(auth.RoleAuditor, costTimeline))
}

func (s *Server) handleRunTimeline(c echo.Context) error {
	q := c.QueryParams()
	bucket, err := bucketParam(q)
	if err != nil {
		return err
	}
	sources, err := s.sourcesParam(q)
	if err != nil {
		return err
	}
	ctx := c.Request().Context()
	run, err := s.Runs.Run(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	if bucket == 0 {
		end := run.Run.FinishedAt
		if end.IsZero() {
			end = s.Clock.Now()
		}
		bucket = autoBucket(end.Sub(run.Run.CreatedAt))
	}
	tl, err := s.Timelines.RunTimeline(ctx, run.Run.ID, auditd.TimelineQuery{Bucket: bucket, Sources: sources})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tl)
}

func (s *Server) handleSourceTimeline(c echo.Context) error {
	q := c.QueryParams()
	bucket, err := bucketParam(q)
	if err != nil {
		return err
	}
	from, to, err := rangeParams(q)
	if err != nil {
		return err
	}
	if to.IsZero() {
		to = s.Clock.Now()
	}
	if from.IsZero() {
		from = to.Add(-DefaultSourceTimelineRange)
	}
	if !from.Before(to) {
		return invalid("from", "from must be before to (now, when to is not given).")
	}
	if to.Sub(from) > auditd.MaxTimelineBuckets*MaxTimelineBucket {
		return invalid("from", "A timeline spans at most %d days.", auditd.MaxTimelineBuckets*MaxTimelineBucket/(24*time.Hour))
	}
	ctx := c.Request().Context()
	src, err := s.Sources.Source(ctx, c.Param("id"))
	if err != nil {
		return err
	}
	if bucket == 0 {
		bucket = autoBucket(to.Sub(from))
	}
	tl, err := s.Timelines.SourceTimeline(ctx, src.Config.ID, auditd.TimelineQuery{Bucket: bucket, From: from, To: to})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, tl)
}

// bucketParam reads ?bucket=, a Go duration from MinTimelineBucket to
// MaxTimelineBucket; 0 when absent.
func bucketParam(q url.Values) (time.Duration, error) {
	raw := q.Get("bucket")
	if raw == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(raw)
	if err != nil || d < MinTimelineBucket || d > MaxTimelineBucket {
		return 0, invalid("bucket", "bucket must be a duration from 100ms to 24h, such as 1s, 30s or 5m.")
	}
	return d, nil
}

// maxTimelineSources is how many sources one ?source= may name.
const maxTimelineSources = 50

// sourcesParam reads ?source=, source ids repeated or separated by commas.
func (s *Server) sourcesParam(q url.Values) ([]string, error) {
	var ids []string
	for _, raw := range q["source"] {
		for _, id := range strings.Split(raw, ",") {
			if err := s.validate.Var(id, "required,max=100,printascii"); err != nil {
				return nil, invalid("source", "source must be source ids, separated by commas: each 1 to 100 printable ASCII characters.")
			}
			ids = append(ids, id)
		}
	}
	if len(ids) > maxTimelineSources {
		return nil, invalid("source", "source names at most %d sources.", maxTimelineSources)
	}
	return ids, nil
}

// autoBucket is the narrowest of niceBuckets that covers span in about
// timelineBuckets buckets.
func autoBucket(span time.Duration) time.Duration {
	for _, b := range niceBuckets {
		if span <= timelineBuckets*b {
			return b
		}
	}
	return niceBuckets[len(niceBuckets)-1]
}
