package fetch

import (
	"errors"
	"net"
	"net/http"
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
	MaxRedirects    int
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
		MaxRedirects:    5,
	}
}

// errCrossHostRedirect refuses a redirect to another host: credentials added
// for one jurisdiction must never reach another.
var errCrossHostRedirect = errors.New("redirect to another host refused")

// NewClient returns the HTTP client the loop sends with: timeouts on connect,
// headers and the whole exchange, and redirects only to the same host.
func NewClient(o ClientOptions) *http.Client {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: o.ConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   o.ConnectTimeout,
		ResponseHeaderTimeout: o.HeaderTimeout,
		MaxIdleConnsPerHost:   o.MaxIdlePerHost,
		MaxConnsPerHost:       o.MaxConnsPerHost,
		MaxIdleConns:          16 * o.MaxIdlePerHost,
		IdleConnTimeout:       90 * time.Second,
	}
	return &http.Client{
		Transport: tr,
		Timeout:   o.RequestTimeout,
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if len(via) >= o.MaxRedirects {
				return errors.New("too many redirects")
			}
			if req.URL.Host != via[0].URL.Host {
				return errCrossHostRedirect
			}
			return nil
		},
	}
}
