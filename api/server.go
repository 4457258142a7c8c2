package api

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"time"

	"github.com/auditd/auditd"
	"github.com/auditd/auditd/auth"
	"github.com/auditd/auditd/clock"
	"github.com/auditd/auditd/limiter"
	"github.com/go-playground/validator/v10"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	"github.com/prometheus/client_golang/prometheus"
)

//go:embed openapi.yaml
var spec []byte

// Spec returns the OpenAPI document the server implements.
func Spec() []byte { return append([]byte(nil), spec...) }

// Defaults for Server's fields.
const (
	DefaultAddr              = "127.0.0.1:8080"
	DefaultReadHeaderTimeout = 5 * time.Second
	DefaultReadTimeout       = time.Minute // a 100,000-item page is tens of megabytes
	DefaultWriteTimeout      = 5 * time.Minute
	DefaultIdleTimeout       = 2 * time.Minute

	// DefaultMaxBodyBytes caps every request body but a run's.
	DefaultMaxBodyBytes = 64 << 10
	// DefaultMaxRunBodyBytes caps POST /v1/runs.
	DefaultMaxRunBodyBytes = 32 << 20
	// DefaultMaxItems is the most items one request submits: a run, or a
	// page of an open run's (the fetch loop's own bound per submit). A
	// run holds far more, in pages.
	DefaultMaxItems = 100_000
	// DefaultPageLimit and MaxPageLimit size list pages.
	DefaultPageLimit = 100
	MaxPageLimit     = 1000
)

// Costs charged to a token's budget. A run costs one unit per item on top
// of the request; an export reads a whole run, so it costs more than a page.
const (
	costRequest   = 1
	costReconcile = 5 // a finished run's reconciliation is served from a cache
	costExport    = 50
	costVerify    = 500
	costInline    = 0 // the handler charges, once it knows the cost
)

// Server is auditd's REST API. Set its dependencies after NewServer and
// before the first request; the limits may be changed until Open.
type Server struct {
	Tokens    Tokens
	Sources   Sources
	Runs      Runs
	Ledger    Ledger
	Integrity Integrity
	Reports   Reports
	Timelines Timelines
	Log       Log
	Retention Retention
	// Packs serves the evidence pack routes; nil answers them 503.
	Packs Packs
	// Proxy serves the proxy route, ANY /proxy/{source}/{path}; nil
	// answers it 503.
	Proxy Proxy
	// Fleet serves the fleet run routes; nil answers them 503.
	Fleet Fleet
	// FleetView serves GET /v1/fleet/sources; nil answers it 503.
	FleetView FleetView

	// Node is this node's name in a fleet, sent as the Auditd-Node header
	// of every answer, so that a node calling another (its part of a
	// fleet run) can tell it reached the node it asked; empty alone.
	Node string

	// PublicLog publishes the checkpoint, the public key, the checkpoint
	// history and consistency proofs, and accepts witness cosignatures,
	// without a token (each client address charged to a budget of its
	// own), so that witnesses can follow the log. Default: false.
	PublicLog bool

	// TokenBudget charges each token's work. Default: a KeyedBudget with
	// the DefaultToken* configuration on the real clock.
	TokenBudget Budget
	// AuthBudget charges each client address's failed authentications.
	// Default: a KeyedBudget with the DefaultAuthFailure* configuration.
	AuthBudget Budget
	// Clock checks deadlines. Default: clock.Real{}.
	Clock clock.Clock
	// Logger receives internal errors (once each) and the access log.
	// Default: slog.Default().
	Logger *slog.Logger
	// Registry receives the API's metrics and is what GET /metrics serves;
	// register other collectors on it. Default: a new registry.
	Registry *prometheus.Registry
	// UI serves GET requests for every path the API does not claim, "/"
	// included. Default: nil, which answers 404.
	UI http.Handler

	Addr              string        // Default: DefaultAddr
	ReadHeaderTimeout time.Duration // Default: DefaultReadHeaderTimeout
	ReadTimeout       time.Duration // Default: DefaultReadTimeout
	WriteTimeout      time.Duration // Default: DefaultWriteTimeout
	IdleTimeout       time.Duration // Default: DefaultIdleTimeout
	MaxBodyBytes      int64         // Default: DefaultMaxBodyBytes
	MaxRunBodyBytes   int64         // Default: DefaultMaxRunBodyBytes
	MaxProxyBodyBytes int64         // a proxied POST's body; Default: DefaultMaxProxyBodyBytes

	echo     *echo.Echo
	validate *validator.Validate
	metrics  *metrics
	http     *http.Server
	ln       net.Listener
	served   chan error
}

// NewServer returns a Server with every field at its default and every
// route registered.
func NewServer() *Server {
	s := &Server{
		TokenBudget: mustKeyedBudget(clock.Real{}, limiter.BudgetConfig{
			Limit: DefaultTokenLimit, Window: DefaultTokenWindow, Burst: DefaultTokenBurst,
		}),
		AuthBudget: mustKeyedBudget(clock.Real{}, limiter.BudgetConfig{
			Limit: DefaultAuthFailureLimit, Window: DefaultAuthFailureWindow, Burst: DefaultAuthFailureBurst,
		}),
		Clock:             clock.Real{},
		Logger:            slog.Default(),
		Registry:          prometheus.NewRegistry(),
		Addr:              DefaultAddr,
		ReadHeaderTimeout: DefaultReadHeaderTimeout,
		ReadTimeout:       DefaultReadTimeout,
		WriteTimeout:      DefaultWriteTimeout,
		IdleTimeout:       DefaultIdleTimeout,
		MaxBodyBytes:      DefaultMaxBodyBytes,
		MaxRunBodyBytes:   DefaultMaxRunBodyBytes,
		MaxProxyBodyBytes: DefaultMaxProxyBodyBytes,
		validate:          newValidator(),
	}
	s.metrics = newMetrics(s.Registry)

	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	// Budgets key on the peer address; X-Forwarded-For is not trusted.
	e.IPExtractor = echo.ExtractIPDirect()
	e.Use(s.assignRequestID, s.nameNode, s.observe, decodeRequest, middleware.RecoverWithConfig(middleware.RecoverConfig{
		// The panic becomes an error, which handleError logs once.
		LogErrorFunc: func(_ echo.Context, err error, stack []byte) error {
			return fmt.Errorf("panic: %w\n%s", err, stack)
		},
	}))

	s.registerSystemRoutes(e)
	s.registerProxyRoutes(e)
	// No group middleware: echo would add a catch-all that turns a wrong
	// method into a 404. allow authenticates each route instead.
	v1 := e.Group("/v1")
	s.registerSourceRoutes(v1)
	s.registerRunRoutes(v1)
	s.registerItemRoutes(v1)
	s.registerEventRoutes(v1)
	s.registerReportRoutes(v1)
	s.registerTimelineRoutes(v1)
	s.registerLedgerRoutes(v1)
	s.registerLogRoutes(v1)
	s.registerRetentionRoutes(v1)
	s.registerTokenRoutes(v1)
	s.registerFleetRoutes(v1)
	s.echo = e
	return s
}

// Handler returns the server as an http.Handler, for tests and for
// embedding under another server.
func (s *Server) Handler() http.Handler { return s.echo }

// Routes lists the registered routes (method and echo path), for tests and
// documentation.
func (s *Server) Routes() []*echo.Route { return s.echo.Routes() }

// Open listens on Addr and serves in a goroutine until Shutdown.
func (s *Server) Open() error {
	if err := s.Listen(); err != nil {
		return err
	}
	ln := s.ln
	s.http = &http.Server{
		Handler:           s.echo,
		ReadHeaderTimeout: s.ReadHeaderTimeout,
		ReadTimeout:       s.ReadTimeout,
		WriteTimeout:      s.WriteTimeout,
		IdleTimeout:       s.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(s.Logger.Handler(), slog.LevelWarn),
	}
	s.served = make(chan error, 1)
	go func() { s.served <- s.http.Serve(ln) }()
	return nil
}

// Listen binds s.Addr, once, without serving yet: a caller binds first
// and creates nothing when the address is taken, then serves (Open) once
// the rest is ready. Shutdown closes a listener never served.
func (s *Server) Listen() error {
	if s.ln != nil {
		return nil
	}
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", s.Addr, err)
	}
	s.ln = ln
	return nil
}

// URL returns the base URL the server listens on, once Listen or Open has
// returned.
func (s *Server) URL() string {
	if s.ln == nil {
		return ""
	}
	return "http://" + s.ln.Addr().String()
}

// Shutdown stops accepting connections and waits, until ctx ends, for
// requests in flight to finish.
func (s *Server) Shutdown(ctx context.Context) error {
	if s.http == nil {
		if s.ln != nil {
			return s.ln.Close()
		}
		return nil
	}
	if err := s.http.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutdown http: %w", err)
	}
	if err := <-s.served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	return nil
}

// registerSystemRoutes: the unauthenticated routes, and the UI fallback.
func (s *Server) registerSystemRoutes(e *echo.Echo) {
	e.GET("/healthz", s.handleHealthz)
	e.GET("/metrics", s.handleMetrics)
	e.GET("/openapi.yaml", s.handleSpec)
	e.GET("/*", s.handleUI)
}

func (s *Server) handleHealthz(c echo.Context) error {
	return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) handleSpec(c echo.Context) error {
	return c.Blob(http.StatusOK, "application/yaml", spec)
}

func (s *Server) handleUI(c echo.Context) error {
	if p := c.Request().URL.Path; s.UI == nil || strings.HasPrefix(p, "/v1/") || strings.HasPrefix(p, "/proxy/") {
		if allow := routeMethods(c.Echo(), p); allow != "" {
			c.Response().Header().Set(echo.HeaderAllow, allow)
			return &auditd.Error{Code: codeMethodNotAllowed, Message: methodNotAllowed(p, allow, http.MethodGet)}
		}
		return echo.ErrNotFound
	}
	s.UI.ServeHTTP(c.Response(), c.Request())
	return nil
}

// routeMethods returns the methods path has a route for, as an Allow
// header, or "" when it has none. A GET reaches the UI's catch-all (GET
// /*) wherever no GET route is, so echo never answers it 405 itself.
func routeMethods(e *echo.Echo, path string) string {
	c := e.NewContext(nil, nil)
	// A method no route takes finds the route path has under any other,
	// or the catch-all when there is none.
	e.Router().Find(http.MethodTrace, path, c)
	if c.Path() == "/*" {
		return ""
	}
	allow, _ := c.Get(echo.ContextKeyHeaderAllow).(string)
	return allow
}

const (
	ctxRequestID = "auditd.request_id"
	ctxToken     = "auditd.token"
)

// requestIDPattern is what a client-supplied X-Request-Id must look like to
// be reused; anything else is replaced.
var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// HeaderNode names the fleet node that answered (Server.Node).
const HeaderNode = "Auditd-Node"

// nameNode sends the node's name with every answer, in a fleet.
func (s *Server) nameNode(next echo.HandlerFunc) echo.HandlerFunc {
	if s.Node == "" {
		return next
	}
	return func(c echo.Context) error {
		c.Response().Header().Set(HeaderNode, s.Node)
		return next(c)
	}
}

func (s *Server) assignRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		id := c.Request().Header.Get(echo.HeaderXRequestID)
		if !requestIDPattern.MatchString(id) {
			b := make([]byte, 12)
			_, _ = rand.Read(b) // crypto/rand.Read never fails
			id = hex.EncodeToString(b)
		}
		c.Set(ctxRequestID, id)
		c.Response().Header().Set(echo.HeaderXRequestID, id)
		return next(c)
	}
}

// bearer returns the secret of an "Authorization: Bearer <secret>" header.
func bearer(h string) (string, bool) {
	scheme, secret, _ := strings.Cut(h, " ")
	secret = strings.TrimSpace(secret)
	return secret, strings.EqualFold(scheme, "Bearer") && secret != ""
}

func unauthenticated() error {
	return auditd.Errorf(auditd.EUNAUTHORIZED, "A valid bearer token is required.")
}

func requestID(c echo.Context) string {
	id, _ := c.Get(ctxRequestID).(string)
	return id
}

// token returns the token that authenticated the request; only routes
// behind authenticate call it.
func token(c echo.Context) auth.Token {
	tok, _ := c.Get(ctxToken).(auth.Token)
	return tok
}

// authenticate resolves the bearer token. A client address that has used up
// its failed-authentication budget gets 429 before its token is even looked
// at, so guessing secrets is as slow as the budget makes it.
func (s *Server) authenticate(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		addr := c.RealIP()
		if wait := s.AuthBudget.Delay(addr, 1); wait > 0 {
			s.metrics.throttled.WithLabelValues("auth").Inc()
			return tooMany(c, wait, "Too many failed authentications from this address")
		}
		tok, err := auth.Token{}, unauthenticated()
		if secret, ok := requestSecret(c); ok {
			tok, err = s.Tokens.Authenticate(secret)
		}
		if err != nil {
			if auditd.ErrorCode(err) != auditd.EUNAUTHORIZED {
				return err // the store failed, not the client
			}
			s.AuthBudget.Admit(addr, 1)
			s.metrics.authFailures.Inc()
			c.Response().Header().Set(echo.HeaderWWWAuthenticate, `Bearer realm="auditd"`)
			return err
		}
		c.Set(ctxToken, tok)
		return next(c)
	}
}

// allow authenticates a request, admits it when its token has role min or
// above, and charges cost units to the token (costInline: the handler
// charges, once it knows the cost).
func (s *Server) allow(min auth.Role, cost float64) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return s.authenticate(func(c echo.Context) error {
			tok := token(c)
			if !tok.Role.Allows(min) {
				return auditd.Errorf(auditd.EFORBIDDEN, "This needs a token with the %s role or above.", min)
			}
			if cost > 0 {
				if err := s.charge(c, tok, cost); err != nil {
					return err
				}
			}
			return next(c)
		})
	}
}

// charge takes cost units from tok's budget, or says when they will be there.
func (s *Server) charge(c echo.Context, tok auth.Token, cost float64) error {
	switch wait := s.TokenBudget.Admit(tok.ID, cost); wait {
	case 0:
		return nil
	case Never:
		return &auditd.Error{Code: codeTooLarge, Message: fmt.Sprintf("This request costs %.0f units, more than a token's budget can ever hold; split it.", cost)}
	default:
		s.metrics.throttled.WithLabelValues("budget").Inc()
		return tooMany(c, wait, "This token is over its budget")
	}
}
