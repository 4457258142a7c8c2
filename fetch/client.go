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
		DialContext:           dialer.DialContext,
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
