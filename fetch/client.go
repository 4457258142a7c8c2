package fetch

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"
)

// ClientOptions bound every upstream request.
type ClientOptions struct {
	ConnectTimeout time.Duration
	HeaderTimeout  time.Duration // from sending to the response headers
	RequestTimeout time.Duration // the whole exchange, body included
	MaxIdlePerHost int
	// MaxConnsPerHost caps the connections to one host, idle or in use;
	// 0 means no cap. A request that finds none free waits for one.
	MaxConnsPerHost int
	// Policy says which addresses the client may connect to, checked on
	// the address each connection dials (after DNS), so a name that
	// resolves elsewhere later cannot pass it. Default DefaultPolicy():
	// link-local, cloud metadata and unspecified addresses refused.
	Policy *AddrPolicy
}

// DefaultClientOptions are the bounds a production loop uses.
func DefaultClientOptions() ClientOptions {
	return ClientOptions{
		ConnectTimeout: 10 * time.Second,
		HeaderTimeout:  30 * time.Second,
		RequestTimeout: 2 * time.Minute,
		MaxIdlePerHost: 64,
		// As many as the pool keeps. A connection beyond that would be
		// closed after one exchange, and dispatches come in bursts (a
		// commit group makes hundreds durable at once): uncapped, a burst
		// dials for every request that finds no idle connection at that
		// instant, even when one comes free a moment later.
		MaxConnsPerHost: 64,
		Policy:          DefaultPolicy(),
	}
}

// NewClient returns the HTTP client the loop sends with: timeouts on
// connect, headers and the whole exchange; connections only to addresses
// the policy allows; and no redirect followed. A 3xx is the response of
// its dispatch, recorded as it came: following it inside the client would
// put a request on the wire that no dispatch record describes.
func NewClient(o ClientOptions) *http.Client {
	policy := o.Policy
	if policy == nil {
		policy = DefaultPolicy()
	}
	dialer := &net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second, Control: policy.control}
	tr := &http.Transport{
		// A proxy from the environment is dialled, and checked, in the
		// upstream's place: it must apply its own policy.
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           gatedDial(dialer),
		TLSHandshakeTimeout:   o.ConnectTimeout,
		ResponseHeaderTimeout: o.HeaderTimeout,
		MaxIdleConnsPerHost:   o.MaxIdlePerHost,
		MaxConnsPerHost:       o.MaxConnsPerHost,
		MaxIdleConns:          16 * o.MaxIdlePerHost,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{
		Transport:     tr,
		Timeout:       o.RequestTimeout,
		CheckRedirect: noRedirects,
	}
}

// noRedirects is every loop client's CheckRedirect: the 3xx is the answer.
func noRedirects(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

// isDenied reports whether err is a connection the address policy refused.
func isDenied(err error) bool { return errors.Is(err, ErrAddressDenied) }

// The wire gate: a request on a fleet slot must not leave after its slot's
// time to leave by (limiter.Permit.SendBy). The loop checks once its
// dispatch record is durable (Loop.dispatch); the wire gate checks again
// as the transport writes the request's first byte, after any dial and
// any wait for a connection. Each connection the loop's client dials is a
// gatedConn; a request armed by gateWire has its connection armed when
// the transport hands it one (httptrace's GotConn), and the connection's
// next write, the request's first (the HTTP/1.1 header), fails with
// errSlotPassed when it comes too late: nothing of the request is written,
// and net/http gives it up (a request with a body and no GetBody is never
// sent again on its own).

// wireDeadline is a request's time to leave by, on the loop's clock.
type wireDeadline struct {
	by  time.Time
	now func() time.Time
}

// gatedConn is a connection whose next write may be armed with a deadline.
type gatedConn struct {
	net.Conn
	gate atomic.Pointer[wireDeadline]
}

func (c *gatedConn) Write(p []byte) (int, error) {
	if d := c.gate.Swap(nil); d != nil && d.now().After(d.by) {
		return 0, errSlotPassed
	}
	return c.Conn.Write(p)
}

// gatedDial dials with d and returns every connection as a gatedConn.
func gatedDial(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &gatedConn{Conn: c}, nil
	}
}

// gateWire returns req armed to fail with errSlotPassed, nothing written,
// if the transport writes it after by on the clock now; every request the
// loop sends is armed, by or not (zero: no deadline), so that one
// connection's gate never outlives its request.
func gateWire(req *http.Request, by time.Time, now func() time.Time) *http.Request {
	var d *wireDeadline
	if !by.IsZero() {
		d = &wireDeadline{by: by, now: now}
	}
	trace := &httptrace.ClientTrace{GotConn: func(info httptrace.GotConnInfo) {
		c := info.Conn
		if tc, ok := c.(*tls.Conn); ok {
			c = tc.NetConn()
		}
		if g, ok := c.(*gatedConn); ok {
			g.gate.Store(d)
		}
	}}
	return req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
}
