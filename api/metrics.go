package api

import (
	"net/http"
	"strconv"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// metrics are the API's own Prometheus collectors.
type metrics struct {
	requests     *prometheus.CounterVec
	duration     *prometheus.HistogramVec
	throttled    *prometheus.CounterVec
	authFailures prometheus.Counter
	handler      http.Handler
}

func newMetrics(reg *prometheus.Registry) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_api_requests_total",
			Help: "API requests by route template, method and status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "auditd_api_request_duration_seconds",
			Help:    "API request latency by route template and method.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10},
		}, []string{"route", "method"}),
		throttled: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "auditd_api_throttled_total",
			Help: "Requests answered 429, by budget: budget (a token's work) or auth (an address's failed authentications).",
		}, []string{"budget"}),
		authFailures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "auditd_api_auth_failures_total",
			Help: "Requests with a missing, unknown or revoked token.",
		}),
	}
	reg.MustRegister(m.requests, m.duration, m.throttled, m.authFailures)
	m.handler = promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
	return m
}

// observe counts and times every request by its route template, so that
// ids in paths do not explode the label space.
func (s *Server) observe(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			// Write the problem now so the status below is the one sent.
			c.Error(err)
		}
		route, method := c.Path(), c.Request().Method
		s.metrics.requests.WithLabelValues(route, method, strconv.Itoa(c.Response().Status)).Inc()
		s.metrics.duration.WithLabelValues(route, method).Observe(time.Since(start).Seconds())
		return nil
	}
}

func (s *Server) handleMetrics(c echo.Context) error {
	s.metrics.handler.ServeHTTP(c.Response(), c.Request())
	return nil
}
