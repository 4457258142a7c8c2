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
	MaxRedirects   int
}

// DefaultClientOptions are the bounds a production loop uses.
func DefaultClientOptions() ClientOptions {
	return ClientOptions{
		ConnectTimeout: 10 * time.Second,
		HeaderTimeout:  30 * time.Second,
		RequestTimeout: 2 * time.Minute,
		MaxIdlePerHost: 64,
		MaxRedirects:   5,
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
